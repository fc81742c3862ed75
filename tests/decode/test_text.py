"""Text in, text out: `generate_text` is `generate` between the tokenizer's encode and decode,
stopping at its EOS; a tokenizer larger than the model's vocabulary, or an empty prompt, is
refused. (`--mode=decode`'s own path, paxlike/cli/decode_text.py, is tested end to end in
test_decode_cli.py.)"""

from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.decode import generate, generate_text
from paxlike.errors import UserError
from paxlike.layers import TransformerLM
from paxlike.tokenizers import load_tokenizer
from paxlike.tokenizers.train import write_tokenizer

TEXT = ('To be, or not to be, that is the question:\n'
        'Whether tis nobler in the mind to suffer\n'
        'The slings and arrows of outrageous fortune,\n') * 20


def _model_and_params(vocab_size: int):
  model = TransformerLM(vocab_size=vocab_size, num_layers=1, d_model=32, num_heads=4, d_ff=64,
                        max_len=64)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))['params']
  return model, jax.tree.map(lambda x: x * 2.0, params)


@pytest.fixture(scope='module')
def bpe(tmp_path_factory):
  out = tmp_path_factory.mktemp('tok')
  return load_tokenizer(write_tokenizer('bpe', TEXT.splitlines(), 300, Path(out)))


def test_generate_text_is_generate_between_encode_and_decode(bpe):
  model, params = _model_and_params(384)
  prompts = ['To be, or', 'The slings and arrows']
  texts = generate_text(model, params, bpe, prompts, max_new_tokens=12)
  ids = generate(model, params, bpe.encode_batch(prompts), max_new_tokens=12, eos_id=bpe.eos_id)
  for text, row in zip(texts, ids):
    assert text == bpe.decode([t for t in row.tolist() if t != bpe.eos_id])


def test_generate_text_stops_at_the_tokenizers_eos():
  model, params = _model_and_params(256)
  tok = load_tokenizer('bytes')
  free = generate(model, params, tok.encode_batch(['abc']), max_new_tokens=30)[0]
  # Make the byte tokenizer's EOS ('\n') the greedy choice at step 2 by swapping embeddings.
  # (Tied embeddings: the swap permutes the model's tokens, so the sequence is the old one with
  # the two ids swapped, and now holds an EOS by step 2.)
  rows = params['embed']['embedding']
  pair = np.asarray([int(free[2]), tok.eos_id])
  swapped = {**params, 'embed': {'embedding': rows.at[pair].set(rows[pair[::-1]])}}
  ids = generate(model, swapped, tok.encode_batch(['abc']), max_new_tokens=30,
                 eos_id=tok.eos_id)[0]
  [text] = generate_text(model, swapped, tok, ['abc'], max_new_tokens=30)
  cut = int(np.flatnonzero(ids == tok.eos_id)[0])
  assert len(ids) == cut + 1 < 30 and text == tok.decode(ids[:cut].tolist())
  assert '\n' not in text


def test_a_tokenizer_larger_than_the_model_vocabulary_or_an_empty_prompt_is_refused(bpe):
  model, params = _model_and_params(256)
  with pytest.raises(UserError, match="tokenizer has 300 ids but the model's vocab_size is 256"):
    generate_text(model, params, bpe, ['To be'], max_new_tokens=2)
  with pytest.raises(UserError, match='a prompt is empty'):
    generate_text(model, params, load_tokenizer('bytes'), ['abc', ''], max_new_tokens=2)
