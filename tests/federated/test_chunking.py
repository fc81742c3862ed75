"""The per-platform default of `client_chunk`: one client at a time on CPU, all at once on
accelerators or a sharded clients axis; an explicit chunk always wins."""

import jax
import jax.numpy as jnp
import optax
import pytest

from paxlike.federated import chunking, fed_avg
from tests.federated.regression import client_batches, initial_params, loss_fn


@pytest.mark.parametrize('platform, clients_axis, expected', [
    ('cpu', 1, chunking.CPU_CLIENT_CHUNK),
    ('cpu', 4, None),   # Clients sharded over devices: chunks would run one after another.
    ('gpu', 1, None),
    ('tpu', 1, None),
    ('cuda', 2, None),
])
def test_default_client_chunk_per_platform(platform, clients_axis, expected):
  assert chunking.default_client_chunk(platform, clients_axis) == expected


def test_an_explicit_chunk_is_kept_and_unset_resolves_to_the_cpu_default():
  assert chunking.resolve_client_chunk(3) == 3
  assert jax.default_backend() == 'cpu'
  assert chunking.resolve_client_chunk(None) == chunking.CPU_CLIENT_CHUNK
  mesh = jax.make_mesh((1,), ('clients',))
  with jax.set_mesh(mesh):
    assert chunking.resolve_client_chunk(None) == chunking.CPU_CLIENT_CHUNK


def test_the_default_cpu_round_is_the_chunked_round():
  """Unset `client_chunk` traces to the same program as `client_chunk=1` on CPU, not to the
  vmapped one (a chunk >= the cohort)."""
  params, batches, weights = initial_params(), client_batches(4, 2), jnp.ones(4)

  def program(chunk):
    alg = fed_avg(loss_fn, optax.sgd(0.1), client_chunk=chunk)
    return str(jax.make_jaxpr(alg.next)(alg.init(params), batches, weights, jax.random.key(0)))

  assert program(None) == program(chunking.CPU_CLIENT_CHUNK) != program(4)


def test_all_clients_at_once_overrides_only_an_unset_chunk():
  assert chunking.resolve_client_chunk(None) == chunking.CPU_CLIENT_CHUNK
  with chunking.all_clients_at_once():
    assert chunking.resolve_client_chunk(None) is None
    assert chunking.resolve_client_chunk(2) == 2
  assert chunking.resolve_client_chunk(None) == chunking.CPU_CLIENT_CHUNK


def test_a_chunked_round_holds_one_copy_per_client_of_the_params_only():
  """FedAvg one client at a time: what grows with the cohort is the clients' trained params
  (stacked for the mean), not N copies of the broadcast start nor N AdamW states (3 more
  copies each), which a round used to hold (22 GB for the 125M at 16 clients)."""
  width = 1 << 18
  param_bytes = 4 * width

  def loss(params, batch, rng):
    del rng
    return jnp.mean((jnp.sum(params['w']) * batch['x'] - 1.0) ** 2), {}

  def temporaries(clients):
    alg = fed_avg(loss, optax.adam(1e-3), client_chunk=1)
    params = {'w': jnp.zeros((width,), jnp.float32)}
    batches = {'x': jnp.ones((clients, 2, 4), jnp.float32)}
    step = jax.jit(alg.next).lower(alg.init(params), batches, jnp.ones(clients),
                                   jax.random.key(0)).compile()
    return step.memory_analysis().temp_size_in_bytes

  grown = temporaries(16) - temporaries(8)
  assert 7 * param_bytes <= grown <= 10 * param_bytes, grown / param_bytes
