"""A round's shape has one home, the data: algorithms read it from the batches, and building a
Task checks a fixed-cohort algorithm's count (replicas, members, experts, clients) against it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import losses
from paxlike.errors import UserError


@pytest.fixture(scope='module')
def configs():
  """`configs(name, *overrides)`: experiment federated.`name`'s config with `--fdl_set`s."""
  registry.import_all()

  def config(name, *overrides):
    cfg = registry.get(f'federated.{name}')().config()
    config_io.apply_overrides(cfg, overrides)
    return cfg

  return config


@pytest.mark.parametrize('name,overrides,expected', [
    ('ShakespeareFedAvg', ['data.local_steps=8', 'data.clients_per_round=16'], (8, 16)),
    ('ShakespeareDiLoCo', ['algorithm.num_replicas=2', 'data.clients_per_round=2',
                           'data.num_clients=2', 'data.local_steps=2'], (2, 2)),
    ('ShakespearePapa', ['algorithm.population=6', 'data.clients_per_round=6',
                         'data.local_steps=3'], (3, 6)),
    ('ShakespeareBtm', ['algorithm.num_experts=2', 'data.clients_per_round=2',
                        'data.num_clients=2'], (4, 2)),
    ('FashionMnistFedAvg', ['data.local_steps=1'], (1, 10)),
    ('ShakespeareCentralized', ['data.local_steps=2'], (2, 1)),
])
def test_the_data_sets_the_cohort_and_fixed_counts_follow_it(configs, name, overrides, expected):
  data = config_io.build(configs(name, *overrides)).data
  assert (data.local_steps, data.clients_per_round) == expected


@pytest.mark.parametrize('name,override,arg,count,clients', [
    ('ShakespeareDiLoCo', 'algorithm.num_replicas=2', 'num_replicas', 2, 4),
    ('ShakespearePapa', 'data.clients_per_round=2', 'population', 4, 2),
    ('ShakespeareBtm', 'algorithm.num_experts=3', 'num_experts', 3, 4),
    ('DigitsScaffold', 'algorithm.num_clients=10', 'num_clients', 10, 20),
])
def test_a_fixed_count_set_on_one_side_only_is_a_one_line_user_error(
    configs, name, override, arg, count, clients):
  with pytest.raises(UserError) as error:
    config_io.build(configs(name, override))
  assert str(error.value) == (f'algorithm.{arg}={count} but data.clients_per_round={clients}: '
                              f'set both to the same cohort size')


def test_scaffold_refuses_sampled_cohorts(configs):
  with pytest.raises(UserError) as error:
    config_io.build(configs('DigitsScaffold', "data.sampling='uniform'"))
  assert str(error.value) == ("algorithm.num_clients keeps state per client, so it trains every "
                              "client every round: set data.sampling='fixed', not 'uniform'")


def test_data_local_steps_alone_sets_a_fedavg_rounds_local_steps(configs):
  """`--fdl_set=data.local_steps=3` on DigitsFedAvg: its round is each client's 3 SGD steps
  (lr 0.1) on its own 3 batches, then the example-weighted mean, worked out here by hand."""
  task = config_io.build(configs('DigitsFedAvg', 'data.local_steps=3'))
  batches, weights = task.data.round_batches(task.train.seed, 1)
  assert batches['inputs'].shape[:2] == (5, 3)
  loss_fn = losses.model_loss_fn(task.model)
  # Jitted, so each compiles one program: eagerly, every op compiles on its own.
  params = nn.unbox(jax.jit(task.model.init)(jax.random.key(0), batches['inputs'][0, 0]))['params']
  algorithm = task.algorithm(loss_fn, task.optimizer)
  state, _ = jax.jit(algorithm.next)(algorithm.init(params), batches, jnp.asarray(weights),
                                     jax.random.key(1))
  grad = jax.jit(jax.grad(lambda p, batch: loss_fn(p, batch, None)[0]))
  clients = []
  for i in range(5):
    client = jax.tree.map(np.asarray, params)
    for h in range(3):
      grads = grad(client, jax.tree.map(lambda x: x[i, h], batches))
      client = jax.tree.map(lambda p, g: p - np.float32(0.1) * np.asarray(g), client, grads)
    clients.append(client)
  share = weights / weights.sum()
  want = jax.tree.map(lambda *c: sum(s * x for s, x in zip(share, c)), *clients)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6),
               state.params, want)
