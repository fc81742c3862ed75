"""Templates that close a conversation with text they write only without a generation prompt
(Phi-3's `{% else %}{{ eos_token }}`), with the pad token equal to eos as Phi-3's tokenizer
has it: rendered and tokenized as transformers does, each reply's end of turn trained, the
closing eos trained in no turn (paxlike/tokenizers/chat_encoder.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from tokenizers import AddedToken

from paxlike.data import token_store
from paxlike.data.text_data import TextData
from paxlike.data.text_files import Fields
from paxlike.tokenizers import load_tokenizer
from paxlike.tokenizers.chat_encoder import load_chat_encoder
from tests.tokenizers.chat_fixtures import SPECIALS, bpe_with_specials

# microsoft/Phi-3-mini-4k-instruct's chat template, as its tokenizer_config.json holds it.
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
        "{% else %}{{ eos_token }}{% endif %}")
PHI3_SPECIALS = ['<|system|>', '<|user|>', '<|assistant|>', '<|end|>']
TALK = [{'role': 'system', 'content': 'Be brief.'},
        {'role': 'user', 'content': 'What is two plus two?'},
        {'role': 'assistant', 'content': 'Four.'},
        {'role': 'user', 'content': 'And 7 plus 7?'},
        {'role': 'assistant', 'content': '14'}]
# transformers 5.17's apply_chat_template(TALK, tokenize=False) with this tokenizer directory.
RENDERED = ('<|system|>\nBe brief.<|end|>\n<|user|>\nWhat is two plus two?<|end|>\n'
            '<|assistant|>\nFour.<|end|>\n<|user|>\nAnd 7 plus 7?<|end|>\n'
            '<|assistant|>\n14<|end|>\n<|endoftext|>')


def write_phi3(directory: Path) -> Path:
  """A Phi-3-style tokenizer directory: eos and pad both <|endoftext|>, as Phi-3's."""
  directory.mkdir(parents=True, exist_ok=True)
  tok = bpe_with_specials()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PHI3_SPECIALS])
  tok.save(str(directory / 'tokenizer.json'))
  (directory / 'tokenizer_config.json').write_text(json.dumps(
      {'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<s>',
       'eos_token': '<|endoftext|>', 'pad_token': '<|endoftext|>', 'chat_template': PHI3}))
  return directory / 'tokenizer.json'


def split_ids(path: Path, text: str) -> list[int]:
  """transformers' ids of `text` computed apart from paxlike: each special token's string its
  one id, the text between them BPE-encoded alone."""
  tok = load_tokenizer(path)._tok
  specials = SPECIALS + PHI3_SPECIALS
  ids: list[int] = []
  for piece in re.split('(' + '|'.join(map(re.escape, specials)) + ')', text):
    if piece in specials:
      ids.append(tok.token_to_id(piece))
    elif piece:
      ids += tok.encode(piece, add_special_tokens=False).ids
  return ids


def test_phi3_multi_turn_renders_as_transformers_and_trains_each_end_of_turn(tmp_path):
  path = write_phi3(tmp_path / 'phi3')
  encoder = load_chat_encoder(load_tokenizer(path))
  assert encoder.pad_id == encoder.eos_id  # Padding is <|endoftext|>, as Phi-3's.
  end = encoder.tokenizer._tok.token_to_id('<|end|>')
  assert encoder.end_of_turn_id == end
  ids, trained = encoder.encode_conversation(TALK)  # Refused before: "does not lead".
  assert encoder.template.render(TALK) == RENDERED
  assert ids.tolist() == split_ids(path, RENDERED)
  assert ids[trained].tolist() == split_ids(path, 'Four.<|end|>14<|end|>')
  assert not trained[-1] and ids[-1] == encoder.eos_id  # The closing eos is in no turn.
  # A one-turn row is trained alike: its closing eos is not part of its reply either.
  ids, trained = encoder.encode_conversation(TALK[:3])
  assert ids[trained].tolist() == split_ids(path, 'Four.<|end|>')


def test_phi3_rows_train_every_end_of_turn_with_pad_equal_to_eos(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  path = write_phi3(tmp_path / 'phi3')
  rows = [{'messages': [{'role': 'user', 'content': f'what is {i} plus {i}?'},
                        {'role': 'assistant', 'content': f'The answer is {2 * i}.'},
                        {'role': 'user', 'content': 'and plus 7?'},
                        {'role': 'assistant', 'content': f'{2 * i + 7}'}]} for i in range(30)]
  files = tmp_path / 'chat.jsonl'
  files.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  data = TextData(files=str(files), tokenizer=str(path), fields=Fields(messages_field='messages'),
                  seq_len=64, batch_size=4, eval_batch_size=4, eval_fraction=0.2)
  tokenizer = data.loaded_tokenizer
  end = tokenizer._tok.token_to_id('<|end|>')
  turns = 0
  for plan in (data.packed.train, data.packed.eval):
    batch = data._batch(plan, np.arange(plan.num_rows))
    real = batch['segment_ids'] > 0
    # Padding is <|endoftext|> = eos; the row's length (segment 0), not the id, marks it.
    assert (batch['inputs'][~real] == tokenizer.pad_id).all()
    assert not batch['mask'][~real].any()
    scored_ends = (batch['targets'] == end) & (batch['mask'] > 0)
    turns += int(scored_ends.sum())
    assert not ((batch['targets'] == tokenizer.eos_id) & (batch['mask'] > 0)).any()
  assert turns == 2 * len(rows)  # Both replies' <|end|> of every conversation are targets.
