"""The HF export's generation_config.json (paxlike/cli/hf_export.py `generation_config`): the
source checkpoint's own file as it is, else the tokenizer's bos/eos/pad ids (eos with the chat
template's end-of-turn token), so transformers' `generate` stops where the source stopped."""

import json

from paxlike.cli.hf_export import generation_config
from paxlike.trainer import job_source
from tests.tokenizers.chat_fixtures import write_family
from tests.tokenizers.test_chat_closing_text import write_phi3


def test_the_source_checkpoints_own_file_is_written_as_it_is(tmp_path):
  job = tmp_path / 'job'
  (job / job_source.SOURCE_DIR).mkdir(parents=True)
  own = '{\n  "eos_token_id": [128001, 128009],\n  "temperature": 0.6, "top_p": 0.9\n}\n'
  (job / job_source.SOURCE_DIR / 'generation_config.json').write_text(own)
  tokenizer = write_family(tmp_path / 'tok', 'chatml')
  assert generation_config(job, str(tokenizer)) == own


def test_without_one_the_tokenizers_ids_and_the_end_of_turn_stop(tmp_path):
  job = tmp_path / 'job'
  job.mkdir()
  phi3 = write_phi3(tmp_path / 'phi3')  # eos = pad = <|endoftext|> (1); turns end in <|end|>.
  ids = json.loads((phi3.parent / 'tokenizer.json').read_text())
  vocab = {t['content']: t['id'] for t in ids['added_tokens']}
  assert json.loads(generation_config(job, str(phi3))) == {
      'bos_token_id': vocab['<s>'], 'eos_token_id': [vocab['<|endoftext|>'], vocab['<|end|>']],
      'pad_token_id': vocab['<|endoftext|>']}
  chatml = write_family(tmp_path / 'chatml', 'chatml')  # eos is its end of turn; no bos.
  assert json.loads(generation_config(job, str(chatml))) == {
      'eos_token_id': vocab['<|im_end|>'], 'pad_token_id': vocab['<|endoftext|>']}
  assert generation_config(job, 'bytes') is None  # No tokenizer is exported with bytes.
