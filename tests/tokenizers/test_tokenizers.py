"""paxlike.tokenizers: each kind against its library and today's byte encoding."""

from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import tokenizers

from paxlike.errors import UserError
from paxlike.tokenizers import Tokenizer, load_tokenizer, vocab_for_model
from tests.tokenizers.conftest import VOCAB

KINDS = ('bytes', 'sentencepiece', 'hf')
TEXTS = {
    'ascii': 'First Citizen:\nBefore we proceed any further, hear me speak.',
    'non-ascii': 'café déjà vu, 中文字符, emoji 😀🎉 and ñ',
    'spacing': '  two  spaces\n\n\ttab then trailing  ',
    'special strings': 'a <|endoftext|> b <pad> c </s> <s> d',
}


def _load(kind: str, dirs: dict[str, Path]) -> Tokenizer:
  return load_tokenizer('bytes' if kind == 'bytes' else str(dirs[kind]))


@pytest.mark.parametrize('name', TEXTS)
@pytest.mark.parametrize('kind', KINDS)
def test_round_trip(kind, name, tokenizer_dirs):
  tok = _load(kind, tokenizer_dirs)
  ids = tok.encode_batch([TEXTS[name], ''])
  assert [a.dtype for a in ids] == [np.int32, np.int32] and ids[1].size == 0
  assert tok.decode(ids[0]) == TEXTS[name]


def test_bytes_is_todays_byte_encoding():
  tok = load_tokenizer('bytes')
  assert isinstance(tok, Tokenizer)
  assert (tok.kind, tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id, tok.fingerprint,
          tok.path) == ('bytes', 256, None, 10, 0, 'bytes', None)
  texts = list(TEXTS.values())
  for text, ids in zip(texts, tok.encode_batch(texts)):
    np.testing.assert_array_equal(ids, np.frombuffer(text.encode('utf-8'), np.uint8))
  # Not UTF-8: replaced, as today's decode_bytes; pad (NUL) skipped.
  assert tok.decode([0xFF, 104, 0, 105]) == '\ufffdhi'


def test_trained_ids_and_library_agree(tokenizer_dirs, corpus_text):
  """vocab/bos/eos/pad as the files define them; encode_batch equals the library's own
  one-text encode; text never encodes to a special id; BPE compresses the corpus."""
  sp = load_tokenizer(tokenizer_dirs['sentencepiece'] / 'tokenizer.model')
  proc = spm.SentencePieceProcessor(model_file=sp.path)
  assert (sp.kind, sp.vocab_size, sp.pad_id, sp.bos_id, sp.eos_id) == ('sentencepiece', VOCAB,
                                                                       0, 2, 3)
  assert [proc.id_to_piece(i) for i in (2, 3)] == ['<s>', '</s>']
  hf = load_tokenizer(tokenizer_dirs['hf'] / 'tokenizer.json')
  spec = json.loads(Path(hf.path).read_text())
  added = {t['content']: t['id'] for t in spec['added_tokens']}
  assert (hf.kind, hf.pad_id, hf.bos_id, hf.eos_id) == ('hf', added['<pad>'], None,
                                                        added['<|endoftext|>'])
  assert hf.vocab_size == max([*spec['model']['vocab'].values(), *added.values()]) + 1 == VOCAB
  lib = tokenizers.Tokenizer.from_file(hf.path)
  texts = [corpus_text[:5000], *TEXTS.values()]
  for tok, one in ((sp, lambda t: proc.encode(t)),
                   (hf, lambda t: lib.encode(t, add_special_tokens=False).ids)):
    ids = tok.encode_batch(texts)
    assert [a.tolist() for a in ids[:3]] == [one(t) for t in texts[:3]]
    every = np.concatenate(ids)
    assert every.min() >= 0 and every.max() < tok.vocab_size
    assert not set(every.tolist()) & {tok.pad_id, tok.eos_id, tok.bos_id}
    assert len(ids[0]) < 0.75 * len(texts[0].encode())


@pytest.mark.parametrize('kind', KINDS)
def test_encode_flat_is_encode_batch_back_to_back(kind, tokenizer_dirs, corpus_text):
  """The store's flat encode (HF: by encode_batch_fast) gives encode_batch's ids, empty texts
  and ASCII-only batches included."""
  tok = _load(kind, tokenizer_dirs)
  for texts in ([*TEXTS.values(), '', *corpus_text[:3000].splitlines()], ['ab', '', 'c d'], []):
    flat, lengths = tok.encode_flat(texts)
    ids = tok.encode_batch(texts)
    assert flat.dtype == np.int32 and lengths.dtype == np.int64
    assert lengths.tolist() == [len(a) for a in ids]
    assert flat.tolist() == [x for a in ids for x in a.tolist()]
    one_thread = tok.encode_flat(texts, num_threads=1)  # What each of two encoders asks for.
    assert np.array_equal(one_thread[0], flat) and np.array_equal(one_thread[1], lengths)


@pytest.mark.parametrize('kind', KINDS)
def test_decode_skips_pad_and_ids_past_the_vocab_and_not_eos(kind, tokenizer_dirs):
  tok = _load(kind, tokenizer_dirs)
  a, b = tok.encode_batch(['Hello there', 'General Kenobi'])
  padded = [tok.pad_id, *a, vocab_for_model(tok.vocab_size + 1) - 1, tok.pad_id]
  assert tok.decode(np.array(padded)) == 'Hello there'
  joined = tok.decode([*a, tok.eos_id, *b])
  assert joined.startswith('Hello there') and joined.endswith('General Kenobi')


@pytest.mark.parametrize('kind', KINDS)
def test_pickled_copy_encodes_the_same_without_the_file(kind, tokenizer_dirs, tmp_path):
  source = tokenizer_dirs.get(kind)
  if source is not None:  # A private copy, deleted before unpickling.
    for file in source.iterdir():
      (tmp_path / file.name).write_bytes(file.read_bytes())
  tok = _load(kind, {kind: tmp_path})
  blob = pickle.dumps(tok)
  for file in tmp_path.iterdir():
    file.unlink()
  copy = pickle.loads(blob)
  texts = list(TEXTS.values())
  assert [a.tolist() for a in copy.encode_batch(texts)] == [
      a.tolist() for a in tok.encode_batch(texts)]
  assert (copy.vocab_size, copy.eos_id, copy.pad_id, copy.bos_id, copy.fingerprint) == (
      tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id, tok.fingerprint)


def test_fingerprint_is_the_files_sha256(tokenizer_dirs):
  for name in ('sentencepiece/tokenizer.model', 'hf/tokenizer.json'):
    kind, file = name.split('/')
    path = tokenizer_dirs[kind] / file
    assert load_tokenizer(path).fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()


def test_directory_prefers_tokenizer_json(tokenizer_dirs, tmp_path):
  assert load_tokenizer(tokenizer_dirs['sentencepiece']).kind == 'sentencepiece'
  sp_file = tokenizer_dirs['sentencepiece'] / 'tokenizer.model'
  for file in [*tokenizer_dirs['hf'].iterdir(), sp_file]:
    (tmp_path / file.name).write_bytes(file.read_bytes())
  tok = load_tokenizer(tmp_path)
  assert (tok.kind, tok.path) == ('hf', str(tmp_path / 'tokenizer.json'))


def _one_line_error(spec, *needles: str) -> str:
  with pytest.raises(UserError) as info:
    load_tokenizer(spec)
  message = str(info.value)
  assert '\n' not in message and all(n in message for n in needles), message
  return message


@pytest.mark.parametrize('name,content', [
    ('x.model', b'just some text\n'), ('random.model', bytes(range(256)) * 8),
    ('empty.model', b''), ('tokenizer.json', b'hello'), ('other.json', b'{}'),
    ('vocab.txt', b'a\nb\n')])
def test_not_a_tokenizer_is_a_user_error_naming_it(tmp_path, name, content):
  (tmp_path / name).write_bytes(content)
  _one_line_error(str(tmp_path / name), str(tmp_path / name))


def test_missing_path_and_empty_dir(tmp_path):
  _one_line_error(str(tmp_path / 'nope' / 'tokenizer.model'), 'nope/tokenizer.model', 'no such')
  _one_line_error(str(tmp_path), str(tmp_path), 'neither')


def test_no_eos_is_a_user_error(tmp_path, corpus_text):
  bare = tokenizers.Tokenizer(tokenizers.models.WordLevel({'a': 0, '<unk>': 1}, unk_token='<unk>'))
  bare.save(str(tmp_path / 'tokenizer.json'))
  _one_line_error(tmp_path / 'tokenizer.json', 'no eos')
  writer = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus_text.splitlines()[:500]),
                                 model_writer=writer, vocab_size=100, eos_id=-1, minloglevel=2)
  (tmp_path / 'no_eos.model').write_bytes(writer.getvalue())
  _one_line_error(tmp_path / 'no_eos.model', 'no eos')


def _llama_style_dir(tokenizer_dirs, tmp_path, config: dict | None) -> Path:
  """The trained BPE with Llama 3's special tokens added, padding and truncation switched on
  in the file, and `config` as tokenizer_config.json."""
  tok = tokenizers.Tokenizer.from_file(str(tokenizer_dirs['hf'] / 'tokenizer.json'))
  tok.add_special_tokens(['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>'])
  tok.enable_truncation(max_length=4)
  tok.enable_padding(length=16, pad_id=VOCAB + 2, pad_token='<|eot_id|>')
  tok.save(str(tmp_path / 'tokenizer.json'))
  if config is not None:
    (tmp_path / 'tokenizer_config.json').write_text(json.dumps(config))
  return tmp_path


def test_hf_special_tokens_from_config_and_file(tokenizer_dirs, tmp_path, corpus_text):
  base = load_tokenizer(tokenizer_dirs['hf'])
  bos, eot = VOCAB, VOCAB + 2
  named = load_tokenizer(_llama_style_dir(tokenizer_dirs, tmp_path, {
      'bos_token': {'content': '<|begin_of_text|>'}, 'eos_token': '<|eot_id|>',
      'pad_token': None}))
  # The config's eos wins over the usual names; null pad falls to the file's padding id.
  assert (named.vocab_size, named.bos_id, named.eos_id, named.pad_id) == (VOCAB + 3, bos, eot, eot)
  text = corpus_text[:2000]
  assert named.encode_batch([text])[0].tolist() == base.encode_batch([text])[0].tolist()
  (tmp_path / 'tokenizer_config.json').unlink()
  unnamed = load_tokenizer(tmp_path)  # '<|endoftext|>' comes before '<|end_of_text|>'.
  assert (unnamed.bos_id, unnamed.eos_id) == (bos, base.eos_id)
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'eos_token': '<|im_end|>'}))
  _one_line_error(tmp_path, 'tokenizer_config.json', '<|im_end|>')
  (tmp_path / 'tokenizer_config.json').write_text('{not json')
  _one_line_error(tmp_path, 'tokenizer_config.json')


def test_vocab_for_model():
  for vocab in (1, 127, 128, 129, 256, 257, 32000, 50257, 128256, 151646):
    assert vocab_for_model(vocab) == math.ceil(vocab / 128) * 128
  assert vocab_for_model(50257, multiple=64) == 50304
  assert vocab_for_model(load_tokenizer('bytes').vocab_size) == 256
  with pytest.raises(ValueError):
    vocab_for_model(0)


def test_the_file_is_read_once(tokenizer_dirs, tmp_path):
  """The bytes read at loading are what encodes: the file changing later changes nothing."""
  path = tmp_path / 'tokenizer.model'
  path.write_bytes((tokenizer_dirs['sentencepiece'] / 'tokenizer.model').read_bytes())
  tok = load_tokenizer(path)
  before = tok.encode_batch(['hello world'])[0].tolist()
  path.write_bytes(b'garbage')
  assert tok.encode_batch(['hello world'])[0].tolist() == before
  assert pickle.loads(pickle.dumps(tok)).encode_batch(['hello world'])[0].tolist() == before
