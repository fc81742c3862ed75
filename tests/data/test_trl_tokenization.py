"""Rows tokenized as TRL tokenizes them, checked against the `tokenizers` library's own encode
(what transformers' fast tokenizer runs): the tokenizer's BOS rule (its post-processor, or
tokenizer_config.json's add_bos_token) before every text prompt (GRPO), prompt + completion
(SFT and text preference pairs); prompt and completion tokenized whole, the prompt being the
ids the whole shares with the prompt alone (a token merged across the boundary is
completion); chat rows keep what their template writes, with no BOS added again."""

import json

import numpy as np
import pytest
import tokenizers

from paxlike.data import token_store
from paxlike.data.preference_data import PreferenceData
from paxlike.data.prompt_data import PromptData
from paxlike.tokenizers import load_tokenizer
from paxlike.tokenizers.documents import common_prefix_lengths
from tests.tokenizers.chat_fixtures import write_chat_tokenizer, write_family

# Prompts that end mid-word: the completion's first characters merge with the prompt's last.
PAIRS = [{'prompt': f'The answer {i} is tw', 'chosen': f'o plus {i}', 'rejected': f'elve {i}'}
         for i in range(12)] + [
            {'prompt': f'say hi to the us{i}', 'chosen': 'er', 'rejected': 'ers'}
            for i in range(12)]


@pytest.fixture(autouse=True)
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))


def trl_ids(tokenizer_json, prompt: str, completion: str) -> tuple[list[int], list[int]]:
  """TRL's DPO/SFT tokenization of a text row (tokenizer(text), special tokens added): (the
  prompt ids, the prompt + completion ids), the prompt cut to what both begin with alike."""
  tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
  prompt_ids = tok.encode(prompt).ids
  whole = tok.encode(prompt + completion).ids
  n = 0
  while n < min(len(prompt_ids), len(whole)) and prompt_ids[n] == whole[n]:
    n += 1
  return whole[:n], whole


@pytest.fixture(scope='module')
def llama3(tmp_path_factory):
  """A tokenizer whose post-processor puts <|begin_of_text|> first (Llama 3's)."""
  return write_family(tmp_path_factory.mktemp('llama3'), 'llama3')


def test_the_bos_rule_is_the_tokenizers_own(llama3, tmp_path):
  tok = tokenizers.Tokenizer.from_file(str(llama3))
  bos = tok.token_to_id('<|begin_of_text|>')
  assert load_tokenizer(str(llama3)).bos_prefix == (bos,)
  config = {'bos_token': '<s>', 'eos_token': '</s>'}
  plain = write_chat_tokenizer(tmp_path / 'plain', None, config)
  assert load_tokenizer(str(plain)).bos_prefix == ()
  said = write_chat_tokenizer(tmp_path / 'said', None, {**config, 'add_bos_token': True})
  assert load_tokenizer(str(said)).bos_prefix == (tok.token_to_id('<s>'),)
  off = write_chat_tokenizer(tmp_path / 'off', None, {'bos_token': '<|begin_of_text|>',
                                                      'eos_token': '<|eot_id|>',
                                                      'add_bos_token': False}, True)
  assert load_tokenizer(str(off)).bos_prefix == ()  # The config overrides the post-processor.
  assert load_tokenizer('bytes').bos_prefix == ()


def test_grpo_text_prompts_start_with_the_bos_as_trls(llama3, tmp_path):
  rows = [{'prompt': f'what is {i} plus {i}?', 'answer': str(2 * i)} for i in range(10)]
  (tmp_path / 'p.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  data = PromptData(files=str(tmp_path / 'p.jsonl'), tokenizer=str(llama3), seq_len=32)
  tok = tokenizers.Tokenizer.from_file(str(llama3))
  for prompt, ids in zip(data.rows.prompts, data.rows.ids):
    assert ids.tolist() == tok.encode(prompt).ids
    assert ids[0] == tok.token_to_id('<|begin_of_text|>')


def test_grpo_chat_prompts_keep_the_templates_one_bos(llama3, tmp_path):
  rows = [{'messages': [{'role': 'user', 'content': f'hi {i}'}]} for i in range(10)]
  (tmp_path / 'c.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  data = PromptData(files=str(tmp_path / 'c.jsonl'), tokenizer=str(llama3), seq_len=64,
                    prompt_field=None, messages_field='messages')
  bos = tokenizers.Tokenizer.from_file(str(llama3)).token_to_id('<|begin_of_text|>')
  for ids in data.rows.ids:
    assert ids[0] == bos and bos not in ids[1:].tolist()


@pytest.mark.parametrize('bos', [True, False])
def test_text_pairs_are_tokenized_whole_with_the_bos_and_trls_prompt(llama3, tmp_path, bos):
  tokenizer = llama3 if bos else write_chat_tokenizer(
      tmp_path / 'nobos', None, {'bos_token': None, 'eos_token': '<|im_end|>'})
  (tmp_path / 'pairs.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in PAIRS))
  data = PreferenceData(files=str(tmp_path / 'pairs.jsonl'), tokenizer=str(tokenizer),
                        seq_len=40, eval_fraction=0.1)
  store, eos = data.store, data.loaded_tokenizer.eos_id
  moved = 0
  for i, row in enumerate(PAIRS):
    for doc, completion in ((2 * i, row['chosen']), (2 * i + 1, row['rejected'])):
      start, end = int(store.doc_start[doc]), int(store.doc_start[doc + 1])
      tokens = store.tokens_at(np.arange(start, end)).tolist()
      prompt, whole = trl_ids(tokenizer, row['prompt'], completion)
      assert tokens == whole + [eos]
      assert int(store.doc_prompt[doc]) == len(prompt)
      alone = tokenizers.Tokenizer.from_file(str(tokenizer)).encode(row['prompt']).ids
      moved += len(prompt) < len(alone)
  assert moved > 0  # Some rows' boundary token merged into the completion.


def test_common_prefix_lengths_of_flat_ids():
  a, a_counts = np.array([1, 2, 3, 4, 5, 6, 7]), np.array([3, 0, 2, 2])
  b, b_counts = np.array([1, 2, 9, 9, 4, 4, 5, 6]), np.array([4, 1, 2, 1])
  np.testing.assert_array_equal(common_prefix_lengths(a, a_counts, b, b_counts), [2, 0, 2, 1])
  np.testing.assert_array_equal(common_prefix_lengths(a, a_counts, b[:0], np.zeros(4, int)),
                                [0, 0, 0, 0])
