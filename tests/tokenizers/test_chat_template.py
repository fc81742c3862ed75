"""Chat templates rendered as transformers renders them, their special tokens as single ids, and
the assistant mask (paxlike/tokenizers/chat_template.py, chat_encoder.py)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.tokenizers import load_tokenizer
from paxlike.tokenizers.chat_encoder import ChatEncoder, load_chat_encoder
from paxlike.tokenizers.chat_template import load_chat_template
from tests.tokenizers.chat_fixtures import (CHATML, CHATML_GENERATION, END_OF_TURN, FAMILIES,
                                            reference_ids, write_chat_tokenizer, write_family)

TALK = [{'role': 'system', 'content': 'Be brief.'},
        {'role': 'user', 'content': 'What is two plus two?'},
        {'role': 'assistant', 'content': 'Four.'},
        {'role': 'user', 'content': 'And 7 plus 7?'},
        {'role': 'assistant', 'content': '14'}]
NO_SYSTEM = TALK[1:]

# What each template writes, by hand from the templates' text.
EXPECTED = {
    'chatml': ('<|im_start|>system\nBe brief.<|im_end|>\n'
               '<|im_start|>user\nWhat is two plus two?<|im_end|>\n'
               '<|im_start|>assistant\nFour.<|im_end|>\n'
               '<|im_start|>user\nAnd 7 plus 7?<|im_end|>\n'
               '<|im_start|>assistant\n14<|im_end|>\n'),
    'llama3': ('<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>'
               '<|start_header_id|>user<|end_header_id|>\n\nWhat is two plus two?<|eot_id|>'
               '<|start_header_id|>assistant<|end_header_id|>\n\nFour.<|eot_id|>'
               '<|start_header_id|>user<|end_header_id|>\n\nAnd 7 plus 7?<|eot_id|>'
               '<|start_header_id|>assistant<|end_header_id|>\n\n14<|eot_id|>'),
    'gemma': ('<bos><start_of_turn>user\nWhat is two plus two?<end_of_turn>\n'
              '<start_of_turn>model\nFour.<end_of_turn>\n'
              '<start_of_turn>user\nAnd 7 plus 7?<end_of_turn>\n'
              '<start_of_turn>model\n14<end_of_turn>\n'),
    # The system message goes with a last user turn only: here there is none.
    'mistral': '<s>[INST] What is two plus two?[/INST] Four.</s>[INST] And 7 plus 7?[/INST] 14</s>',
}
PROMPTED = {  # One user turn with the generation prompt (what --chat decodes from).
    'chatml': ('<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n'
               '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'),
    'llama3': ('<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>'
               '<|start_header_id|>assistant<|end_header_id|>\n\n'),
    'gemma': '<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n',
    'mistral': '<s>[INST] Hi[/INST]',
}
# What each reply's trained tokens spell: its content (Mistral's: with the space before it,
# which shares the content's first token) and its end of turn.
REPLY_PREFIX = {'chatml': '', 'llama3': '', 'gemma': '', 'mistral': ' '}


def talk_for(family: str) -> list[dict]:
  return NO_SYSTEM if family == 'gemma' else TALK


@pytest.fixture(scope='module')
def dirs(tmp_path_factory) -> dict:
  """family -> its tokenizer.json (a directory each)."""
  root = tmp_path_factory.mktemp('chat')
  return {family: write_family(root / family, family) for family in FAMILIES}


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_templates_render_the_strings_written_by_hand(dirs, family):
  template = load_chat_template(dirs[family])
  assert template.render(talk_for(family)) == EXPECTED[family]
  assert template.render([{'role': 'user', 'content': 'Hi'}],
                         add_generation_prompt=True) == PROMPTED[family]


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_ids_are_transformers_ids_with_each_special_token_one_id(dirs, family):
  encoder = load_chat_encoder(load_tokenizer(dirs[family]))
  ids, _ = encoder.encode_conversation(talk_for(family))
  assert ids.tolist() == reference_ids(dirs[family], EXPECTED[family])
  eot = encoder.tokenizer._tok.token_to_id(END_OF_TURN[family])
  assert encoder.end_of_turn_id == eot
  turns = [m for m in talk_for(family) if family != 'mistral' or m['role'] == 'assistant']
  assert ids.tolist().count(eot) == len(turns)  # One id per turn's end marker.
  plain = load_tokenizer(dirs[family]).encode_batch([EXPECTED[family]])[0]
  assert eot not in plain.tolist()  # Documents still spell special tokens as text.


def test_a_template_that_writes_bos_gets_one_bos(dirs):
  tokenizer = load_tokenizer(dirs['llama3'])
  bos = tokenizer.bos_id
  ids, _ = load_chat_encoder(tokenizer).encode_conversation(TALK)
  assert ids[0] == bos and ids.tolist().count(bos) == 1
  # The tokenizer.json's own post-processor would add one more if it were asked to.
  with_specials = tokenizer._tok.encode('Hi', add_special_tokens=True).ids
  assert with_specials[0] == bos


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_the_mask_is_each_assistant_reply_and_its_end_of_turn(dirs, family):
  encoder = load_chat_encoder(load_tokenizer(dirs[family]))
  ids, trained = encoder.encode_conversation(talk_for(family))
  eot = encoder.end_of_turn_id
  replies = [m['content'] for m in talk_for(family) if m['role'] == 'assistant']
  assert encoder.tokenizer.decode(ids[trained].tolist()) == ''.join(
      REPLY_PREFIX[family] + reply + END_OF_TURN[family] for reply in replies)
  if not REPLY_PREFIX[family]:
    want = [i for reply in replies for i in reference_ids(dirs[family], reply) + [eot]]
    assert ids[trained].tolist() == want
  runs = np.flatnonzero(np.diff(np.concatenate([[0], trained.astype(int), [0]])))
  assert len(runs) == 2 * 2  # Two replies, each one contiguous run.
  assert all(ids[end - 1] == eot for end in runs[1::2])


def test_generation_blocks_are_the_mask_when_the_template_has_them(tmp_path):
  path = write_chat_tokenizer(tmp_path, CHATML_GENERATION, FAMILIES['chatml'][1])
  encoder = load_chat_encoder(load_tokenizer(path))
  assert encoder.template.has_generation_blocks
  ids, trained = encoder.encode_conversation(NO_SYSTEM)
  text = ''.join(f'<|im_start|>{m["role"]}\n{m["content"]}<|im_end|>\n' for m in NO_SYSTEM)
  assert ids.tolist() == reference_ids(path, text)
  assert ids[trained].tolist() == reference_ids(path, 'Four.<|im_end|>14<|im_end|>')


def test_the_jinja_file_wins_and_a_named_list_uses_its_default(tmp_path):
  config = FAMILIES['chatml'][1]
  named = [{'name': 'tool_use', 'template': 'tools'}, {'name': 'default', 'template': CHATML}]
  path = write_chat_tokenizer(tmp_path / 'named', named, config)
  assert load_chat_template(path).render(NO_SYSTEM[:1]).startswith('<|im_start|>system\nYou')
  (tmp_path / 'named' / 'chat_template.jinja').write_text('{{ messages[0].content }}!')
  template = load_chat_template(path)
  assert template.render(NO_SYSTEM[:1]) == 'What is two plus two?!'
  assert template.path == str(tmp_path / 'named' / 'chat_template.jinja')
  path = write_chat_tokenizer(tmp_path / 'nodefault', named[:1], config)
  with pytest.raises(UserError, match=r'without a "default" one \(names: tool_use\)'):
    load_chat_template(path)
  path = write_chat_tokenizer(tmp_path / 'none', None, config)
  with pytest.raises(UserError, match='no chat template'):
    load_chat_template(path)


@pytest.mark.parametrize('template, message', [
    ('{% for m in messages %}{{ m.content }', "line 1: unexpected '}'"),
    ('{{ messages | shout }}', "line 1: No filter named 'shout'."),
    ('{% if true %}\n{{ x }', "line 2: unexpected '}'"),
])
def test_a_template_that_does_not_compile_is_one_line_naming_its_file(tmp_path, template,
                                                                        message):
  path = write_chat_tokenizer(tmp_path, template, FAMILIES['chatml'][1])
  with pytest.raises(UserError) as error:
    load_chat_template(path)
  assert str(error.value) == f'chat template {tmp_path / "tokenizer_config.json"}: {message}'


def test_raise_exception_and_render_errors_are_one_line_naming_the_template(dirs):
  template = load_chat_template(dirs['gemma'])
  with pytest.raises(UserError) as error:
    template.render(TALK)
  assert str(error.value) == (
      f'chat template {dirs["gemma"].parent / "tokenizer_config.json"} failed on a conversation '
      "of roles [system, user, assistant, user, assistant]: "
      "raise_exception('System role not supported')")
  with pytest.raises(UserError, match=r"SecurityError: access to attribute 'append'"):
    type(template)('{{ messages.append(1) }}', 'x.jinja').render(TALK)


def test_a_template_that_rewrites_earlier_turns_is_refused_without_generation_blocks(tmp_path):
  counting = '{{ messages | length }}' + CHATML  # Every turn changes the text's first line.
  path = write_chat_tokenizer(tmp_path, counting, FAMILIES['chatml'][1])
  with pytest.raises(UserError, match=r'messages\[:2\] does not lead the text of the whole'):
    load_chat_encoder(load_tokenizer(path)).encode_conversation(NO_SYSTEM)


def test_encoder_pickles_and_needs_an_hf_tokenizer(dirs, tmp_path):
  encoder = load_chat_encoder(load_tokenizer(dirs['llama3']))
  copy = pickle.loads(pickle.dumps(encoder))
  for got, want in zip(copy.encode_conversation(TALK), encoder.encode_conversation(TALK)):
    np.testing.assert_array_equal(got, want)
  with pytest.raises(UserError, match='need a Hugging Face tokenizer.json'):
    load_chat_encoder(load_tokenizer('bytes'))
  other = write_chat_tokenizer(tmp_path, CHATML_GENERATION, FAMILIES['chatml'][1])
  assert (load_chat_encoder(load_tokenizer(other)).fingerprint
          != load_chat_encoder(load_tokenizer(dirs['chatml'])).fingerprint)


def test_store_chunks_join_conversations_without_eos_and_prompt_ids_end_in_the_header(dirs):
  encoder = load_chat_encoder(load_tokenizer(dirs['chatml']))
  texts = [json.dumps(NO_SYSTEM), json.dumps(TALK[:3])]
  tokens, lengths, prompt_lengths, trained = encoder.encode_conversations(texts, np.uint16)
  parts = [encoder.encode_conversation(json.loads(t)) for t in texts]
  assert tokens.dtype == np.uint16 and lengths.tolist() == [len(p[0]) for p in parts]
  assert tokens.tolist() == [i for ids, _ in parts for i in ids.tolist()]
  assert trained.tolist() == [b for _, t in parts for b in t.tolist()]
  assert prompt_lengths.tolist() == [0, 0]
  assert encoder.prompt_ids('Hi').tolist() == reference_ids(dirs['chatml'], PROMPTED['chatml'])
  reply = reference_ids(dirs['chatml'], 'Four.<|im_end|>\nmore')
  assert encoder.reply_text(reply) == 'Four.'


def test_a_turn_marker_that_is_not_marked_special_is_still_one_id_and_ends_the_turn(tmp_path):
  path = write_family(tmp_path, 'gemma')
  data = json.loads(path.read_text())
  for token in data['added_tokens']:
    if token['content'] in ('<start_of_turn>', '<end_of_turn>'):
      token['special'] = False  # As some checkpoints ship them.
  path.write_text(json.dumps(data))
  encoder = load_chat_encoder(load_tokenizer(path))
  eot = encoder.tokenizer._tok.token_to_id('<end_of_turn>')
  ids, trained = encoder.encode_conversation(NO_SYSTEM)
  assert ids.tolist() == reference_ids(path, EXPECTED['gemma'])
  assert encoder.end_of_turn_id == eot and ids[trained].tolist()[-1] == eot


def test_special_tokens_map_names_the_tokens_tokenizer_config_leaves_out(tmp_path):
  path = write_chat_tokenizer(tmp_path, FAMILIES['gemma'][0], {'eos_token': '<eos>'})
  (tmp_path / 'special_tokens_map.json').write_text(json.dumps(
      {'bos_token': {'content': '<bos>'}, 'eos_token': '<|endoftext|>'}))
  template = load_chat_template(path)
  assert template.special_tokens == {'bos_token': '<bos>', 'eos_token': '<eos>'}
  assert template.render(NO_SYSTEM[:2]).startswith('<bos><start_of_turn>user\n')
