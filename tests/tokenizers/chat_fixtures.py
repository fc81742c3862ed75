"""Tokenizer directories with chat templates in the style of real checkpoints' (a ChatML/Qwen one,
a Llama 3 one that writes bos_token, a Gemma one that refuses a system turn, a Mistral one whose
prompt depends on the turns after it), for the chat tests.

Each directory holds a tiny byte-level BPE tokenizer.json (every family's special tokens added,
special) and a tokenizer_config.json naming its special tokens and holding its template."""

from __future__ import annotations

import json
import re
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ['<pad>', '<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|begin_of_text|>',
            '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>', '<bos>', '<eos>',
            '<start_of_turn>', '<end_of_turn>', '<s>', '</s>', '[INST]', '[/INST]']
CORPUS = ['system user assistant model: what is two plus two? Four. Hello there, be brief.',
          'The answer is 42 and 7 plus 7 is 14; say hi to the user.'] * 20

# Qwen2.5-style: a default system turn when the conversation has none.
CHATML = r"""{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'system' and loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Llama-3-Instruct-style: bos_token before the first turn, contents trimmed.
LLAMA3 = (r"{% set loop_messages = messages %}{% for message in loop_messages %}"
          r"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          r"+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          r"{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          r"{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          r"{% endif %}")

# Gemma-style: bos_token first, no system role, user/assistant alternating, 'model' turns.
GEMMA = (r"{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
         r"{{ raise_exception('System role not supported') }}{% endif %}"
         r"{% for message in messages %}{% if (message['role'] == 'user') != "
         r"(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
         r"user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
         r"'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         r"{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
         r"'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
         r"{{'<start_of_turn>model\n'}}{% endif %}")

# Mistral-v0.3-style: no generation prompt, the system message joined to the user turn only
# when that turn is the last message (so a reply's text is not led by its prompt's).
MISTRAL = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- endif %}
{%- endfor %}
"""

# ChatML with {% generation %} blocks around the assistant's content and end of turn.
CHATML_GENERATION = (r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
                     r"{% if message['role'] == 'assistant' %}{% generation %}"
                     r"{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
                     r"{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
                     r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

FAMILIES = {
    'chatml': (CHATML, {'eos_token': '<|im_end|>', 'pad_token': '<|endoftext|>',
                        'bos_token': None}),
    'llama3': (LLAMA3, {'bos_token': '<|begin_of_text|>', 'eos_token': '<|eot_id|>'}),
    'gemma': (GEMMA, {'bos_token': '<bos>', 'eos_token': '<eos>', 'pad_token': '<pad>'}),
    'mistral': (MISTRAL, {'bos_token': '<s>', 'eos_token': '</s>'}),
}
END_OF_TURN = {'chatml': '<|im_end|>', 'llama3': '<|eot_id|>', 'gemma': '<end_of_turn>',
               'mistral': '</s>'}


def bpe_with_specials(bos_post_processor: bool = False) -> tokenizers.Tokenizer:
  """A ~300-id byte-level BPE with SPECIALS as special added tokens; with
  `bos_post_processor`, encoding with special tokens prepends <|begin_of_text|> (as Llama 3's
  tokenizer.json does)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(CORPUS, trainer=trainer)
  if bos_post_processor:
    bos = '<|begin_of_text|>'
    tok.post_processor = processors.TemplateProcessing(
        single=f'{bos} $A', special_tokens=[(bos, tok.token_to_id(bos))])
  return tok


def write_chat_tokenizer(directory: Path, template: str | list | None, config: dict,
                         bos_post_processor: bool = False) -> Path:
  """`directory` with tokenizer.json and a tokenizer_config.json of `config` and `template`
  (left out when None); returns the tokenizer.json path."""
  directory.mkdir(parents=True, exist_ok=True)
  bpe_with_specials(bos_post_processor).save(str(directory / 'tokenizer.json'))
  body = {'tokenizer_class': 'PreTrainedTokenizerFast', **config}
  if template is not None:
    body['chat_template'] = template
  (directory / 'tokenizer_config.json').write_text(json.dumps(body, indent=1))
  return directory / 'tokenizer.json'


def write_family(directory: Path, family: str) -> Path:
  """write_chat_tokenizer for FAMILIES[family] (Llama 3's with its BOS post-processor)."""
  template, config = FAMILIES[family]
  return write_chat_tokenizer(directory, template, config, family == 'llama3')


def reference_ids(tokenizer_json: Path, text: str) -> list[int]:
  """The ids transformers' tokenizer gives `text` (add_special_tokens=False), computed apart
  from paxlike: each special token's string is its id, the text between them the library's BPE
  of that text alone."""
  tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
  ids: list[int] = []
  for piece in re.split('(' + '|'.join(map(re.escape, SPECIALS)) + ')', text):
    if piece in SPECIALS:
      ids.append(tok.token_to_id(piece))
    elif piece:
      ids += tok.encode(piece, add_special_tokens=False).ids
  return ids
