"""core.program_store: a decode whose traces are on disk runs no model Python and gives the
tokens a fresh trace gives; anything a trace reads changes the key; a bad entry is made again;
the abstract params come back as they were made; the newest entries are kept."""

import os
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from paxlike.core import program_store
from paxlike.decode import engine, generate
from paxlike.layers import TransformerLM

MODEL = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2,
                      d_ff=64, max_len=64)
PROMPTS = [np.asarray([5, 9, 2], np.int32), np.asarray([7], np.int32)]


@pytest.fixture
def traces(monkeypatch) -> list[int]:
  """Counts the traces of the model's decode call (engine._apply runs only while tracing)."""
  count = [0]
  apply = engine._apply

  def counted(*args, **kwargs):
    count[0] += 1
    return apply(*args, **kwargs)
  monkeypatch.setattr(engine, '_apply', counted)
  engine.decoder.cache_clear()
  yield count
  engine.decoder.cache_clear()


def params_of(model: TransformerLM):
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))['params']
  return jax.tree.map(lambda x: x * 2.0, params)  # Confident, well-separated greedy choices.


def decode(model, params, store, max_new_tokens=6, **options):
  engine.decoder.cache_clear()  # As a new process would: nothing traced in memory.
  rows = generate(model, params, PROMPTS, max_new_tokens=max_new_tokens, store=store, **options)
  return [row.tolist() for row in rows]


def test_a_second_run_reads_its_traces_and_gives_the_tokens_of_a_fresh_trace(tmp_path, traces):
  params = params_of(MODEL)
  want = decode(MODEL, params, None)
  assert traces[0] == 2  # The prefill's and the loop step's.
  store = program_store.Store(tmp_path)
  assert decode(MODEL, params, store) == want
  assert traces[0] == 4 and len(list(tmp_path.glob('*.jaxexport'))) == 2
  assert decode(MODEL, params, store) == want
  assert traces[0] == 4  # Read from the store: the model's Python did not run.
  sampled = dict(temperature=0.8, top_k=5, seed=3)
  assert decode(MODEL, params, store, **sampled) == decode(MODEL, params, None, **sampled)


@pytest.mark.parametrize('change', ['options', 'cache_size', 'model', 'source', 'arguments'])
def test_what_a_trace_reads_is_in_the_key(tmp_path, traces, monkeypatch, change):
  params, model, options = params_of(MODEL), MODEL, {}
  store = program_store.Store(tmp_path)
  decode(model, params, store)
  before = traces[0]
  if change == 'options':
    options = dict(temperature=0.5)
  elif change == 'cache_size':  # 3 + 100 tokens take the 128-slot cache, not the 64 one.
    model = MODEL.clone(max_len=256)
    params = params_of(model)
    options = dict(max_new_tokens=100)
  elif change == 'model':
    model = MODEL.clone(norm_eps=1e-3)
  elif change == 'source':
    monkeypatch.setattr(program_store, '_source_digest', lambda: 'another paxlike')
  else:  # Another dtype of the same shapes.
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  got = decode(model, params, store, **options)
  assert traces[0] == before + 2, change  # Traced again ...
  assert len(list(tmp_path.glob('*.jaxexport'))) == 4  # ... under new keys.
  assert got == decode(model, params, None, **options)


def test_an_edited_module_of_the_users_is_a_new_key(tmp_path, monkeypatch):
  """A model class outside paxlike: its file's edit misses, though the model's attributes (its
  repr) did not change."""
  source = tmp_path / 'user_model_for_the_store.py'
  source.write_text('SCALE = 1.0\n')
  module = types.ModuleType('user_model_for_the_store')
  module.__file__ = str(source)
  monkeypatch.setitem(sys.modules, module.__name__, module)  # As if the experiment imported it.
  mesh = jax.make_mesh((1,), ('data',), axis_types=(AxisType.Auto,))
  store, calls = program_store.Store(tmp_path / 'store'), []

  def make():
    calls.append(1)
    return {'w': jax.ShapeDtypeStruct((2,), np.float32, sharding=NamedSharding(mesh, P()))}

  def abstract_params_in_a_new_process():
    program_store._loaded_code.cache_clear()  # What a new process would see loaded.
    store.abstract_params(('model',), mesh, make)
  abstract_params_in_a_new_process()
  abstract_params_in_a_new_process()
  assert len(calls) == 1
  source.write_text('SCALE = 2.0  # the edit\n')
  abstract_params_in_a_new_process()
  assert len(calls) == 2
  program_store._loaded_code.cache_clear()


def test_a_store_that_cannot_be_written_warns_and_the_decode_goes_on(tmp_path, traces,
                                                                     monkeypatch):
  params, store = params_of(MODEL), program_store.Store(tmp_path)
  want = decode(MODEL, params, None)

  def full(fd):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(os, 'fsync', full)  # Where a full disk shows when blocks are allocated late.
  with pytest.warns(UserWarning, match='traces not kept in .*No space left'):
    assert decode(MODEL, params, store) == want
  assert list(tmp_path.iterdir()) == []  # No entry, no temporary file left behind.


def test_an_unreadable_entry_is_traced_again_and_rewritten(tmp_path, traces):
  params, store = params_of(MODEL), program_store.Store(tmp_path)
  want = decode(MODEL, params, store)
  entries = sorted(tmp_path.glob('*.jaxexport'))
  entries[0].write_bytes(b'not an export')
  assert decode(MODEL, params, store) == want
  assert traces[0] == 2 + 1  # The bad one only.
  assert jax.export.deserialize(bytearray(entries[0].read_bytes())).fun_name


def test_abstract_params_come_back_as_they_were_made(tmp_path):
  mesh = jax.make_mesh((1, 1), ('data', 'fsdp'), axis_types=(AxisType.Auto,) * 2)
  made = {'embed': jax.ShapeDtypeStruct((64, 32), np.float32,
                                        sharding=NamedSharding(mesh, P('fsdp', None))),
          'block': {'kernel': jax.ShapeDtypeStruct(
              (32, 4, 8), jnp.bfloat16, sharding=NamedSharding(mesh, P(('data', 'fsdp'), None)))}}
  calls = []

  def make():
    calls.append(1)
    return made
  store = program_store.Store(tmp_path)
  assert store.abstract_params(('m',), mesh, make) is made
  got = store.abstract_params(('m',), mesh, make)
  assert len(calls) == 1
  assert jax.tree.structure(got) == jax.tree.structure(made)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(made)):
    assert (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype, b.sharding)
  store.abstract_params(('another model',), mesh, make)
  assert len(calls) == 2


def test_the_newest_entries_are_kept(tmp_path):
  mesh = jax.make_mesh((1,), ('data',), axis_types=(AxisType.Auto,))
  store = program_store.Store(tmp_path, max_entries=2)
  made = lambda n: {'w': jax.ShapeDtypeStruct((n,), np.float32, sharding=NamedSharding(mesh, P()))}
  paths = []
  for n in (1, 2):
    store.abstract_params((n,), mesh, lambda: made(n))
    paths.append(max(tmp_path.glob('*.json'), key=lambda p: p.stat().st_mtime_ns))
  os.utime(paths[1], (1, 1))  # Entry 2 is the older one now ...
  store.abstract_params((1,), mesh, lambda: made(1))  # ... once entry 1 is read.
  store.abstract_params((3,), mesh, lambda: made(3))
  assert paths[0].exists() and not paths[1].exists()
  assert len(list(tmp_path.glob('*.json'))) == 2


def test_entries_past_the_bytes_bound_go_oldest_first(tmp_path):
  store, made = program_store.Store(tmp_path, max_bytes=2500), []
  def make(n):
    made.append(n)
    return bytes(1000)  # Pickled: a little over 1000 bytes, so two fit and three do not.
  for n in (1, 2, 3):
    store.value((n,), lambda: make(n))
    os.utime(max(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime_ns), (n, n))
  assert len(list(tmp_path.glob('*.pickle'))) == 2
  store.value((2,), lambda: make(2))  # Kept,
  store.value((1,), lambda: make(1))  # dropped: made again.
  assert made == [1, 2, 3, 1]


def test_the_store_is_on_exactly_where_the_compilation_cache_is(tmp_path):
  assert program_store.at(str(tmp_path)) == program_store.Store(tmp_path / program_store.DIRNAME)
  train = program_store.at(str(tmp_path), program_store.TRAIN_DIRNAME)
  assert train.directory == tmp_path / program_store.TRAIN_DIRNAME and train.max_bytes == 1 << 30
  assert program_store.at(None) is None and program_store.at('') is None
  assert program_store.at('gs://bucket/cache') is None
