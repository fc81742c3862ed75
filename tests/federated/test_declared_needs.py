"""Algorithms declare what they need (`Algorithm.fixed_cohort`, `Algorithm.aggregator`), and the
cohort check, the exporter and the privacy accountant read the declarations; every federated
builder takes the same round options (aggregator, prox_mu, client_chunk)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import privacy
from paxlike.core.algorithm import Algorithm, AlgorithmConfigError, FixedCohort
from paxlike.errors import UserError
from paxlike.export.__main__ import cohort_algorithm
from paxlike.federated import btm, fed_adagrad, fed_avg, fed_yogi, papa, pseudo_gradient
from paxlike.federated import server_optim
from paxlike.federated.dp import DpAggregator
from paxlike.federated.scaffold import scaffold
from tests.federated.regression import client_batches, close, initial_params, loss_fn, run_rounds


def slotted(loss_fn, optimizer, num_slots: int) -> Algorithm:
  """A toy algorithm with per-slot state under a keyword no other algorithm uses: slot i keeps
  a running sum of its clients' losses at the server params (which never move)."""

  def init(params):
    return {'params': params, 'sums': jnp.zeros((num_slots,))}

  def next(state, batches, weights, rng):
    del weights, rng
    losses = jax.vmap(lambda b: loss_fn(state['params'], jax.tree.map(lambda x: x[0], b),
                                        None)[0])(batches)
    return {**state, 'sums': state['sums'] + losses}, {'loss': jnp.mean(losses)}

  fixed = FixedCohort(num_slots, 'num_slots', True, lambda n: slotted(loss_fn, optimizer, n))
  return Algorithm(init, next, fixed_cohort=fixed)


@pytest.fixture(scope='module')
def digits():
  registry.import_all()
  return config_io.build(registry.get('federated.DigitsFedAvg')().config())


def test_a_new_per_slot_algorithm_is_held_to_the_cohort(digits):
  """DigitsFedAvg's data has 5 clients per round, sampled uniformly."""
  with pytest.raises(UserError) as error:
    dataclasses.replace(digits, algorithm=functools.partial(slotted, num_slots=3))
  assert str(error.value) == ('algorithm.num_slots=3 but data.clients_per_round=5: set both to '
                              'the same cohort size')
  with pytest.raises(UserError, match=r"algorithm.num_slots keeps state per client.*'uniform'"):
    dataclasses.replace(digits, algorithm=functools.partial(slotted, num_slots=5))
  fixed = dataclasses.replace(digits.data, sampling='fixed', num_clients=5)
  task = dataclasses.replace(digits, algorithm=functools.partial(slotted, num_slots=5), data=fixed)
  assert task.built_algorithm.fixed_cohort.size == 5


def test_the_exporter_resizes_a_fixed_cohort_as_declared():
  alg = slotted(loss_fn, None, 4)
  one = cohort_algorithm(alg)(1)
  assert one.fixed_cohort.size == 1
  assert jax.eval_shape(one.init, initial_params())['sums'].shape == (1,)
  plain = fed_avg(loss_fn, optax.sgd(0.1))
  assert cohort_algorithm(plain)(1) is plain
  for built, arg in [(papa(loss_fn, optax.sgd(0.1), population=3), 'population'),
                     (btm(loss_fn, optax.sgd(0.1), num_experts=3), 'num_experts'),
                     (scaffold(loss_fn, optax.sgd(0.1), num_clients=3), 'num_clients'),
                     (pseudo_gradient(loss_fn, optax.sgd(0.1), optax.sgd(1.0), num_replicas=3),
                      'num_replicas')]:
    assert built.fixed_cohort[:3] == (3, arg, arg == 'num_clients')
    assert built.fixed_cohort.resized(2).fixed_cohort.size == 2


def test_the_accountant_reads_the_declared_aggregator():
  dp = DpAggregator(noise_multiplier=0.5)
  for builder in (fed_avg, fed_yogi, fed_adagrad):
    assert privacy.aggregator_of(builder(loss_fn, optax.sgd(0.1), aggregator=dp)) is dp
    assert privacy.aggregator_of(builder(loss_fn, optax.sgd(0.1))) is None


@pytest.mark.parametrize('builder, server', [
    (fed_yogi, server_optim.yogi(1e-2, 0.9, 0.99, 1e-3)),
    (fed_adagrad, server_optim.adagrad(1e-2, 0.9, 1e-3)),
])
def test_yogi_and_adagrad_take_the_round_options(builder, server):
  """Unset options are the plain FedOpt round; prox_mu and an aggregator reach it: a noiseless
  DP aggregator with a clip no update reaches is the unweighted mean of the client updates."""
  params, batches = initial_params(), client_batches(3, 2)
  weights, equal = jnp.array([1.0, 2.0, 5.0]), jnp.ones(3)
  plain, _ = run_rounds(builder(loss_fn, optax.sgd(0.05)), params, 3, batches, weights)
  today, _ = run_rounds(pseudo_gradient(loss_fn, optax.sgd(0.05), server), params, 3, batches, weights)
  unset, _ = run_rounds(builder(loss_fn, optax.sgd(0.05), prox_mu=0.0, aggregator=None), params, 3,
                  batches, weights)
  close(plain.params, today.params, rtol=0, atol=0)
  close(unset.params, today.params, rtol=0, atol=0)
  prox, _ = run_rounds(builder(loss_fn, optax.sgd(0.05), prox_mu=0.7), params, 3, batches, weights)
  want, _ = run_rounds(pseudo_gradient(loss_fn, optax.sgd(0.05), server, prox_mu=0.7), params, 3,
                 batches, weights)
  close(prox.params, want.params, rtol=0, atol=0)
  assert not np.array_equal(prox.params['w'], plain.params['w'])  # (Adagrad's step is ~sign.)
  dp = DpAggregator(clip_norm=1e6, noise_multiplier=0.0)
  noiseless, _ = run_rounds(builder(loss_fn, optax.sgd(0.05), aggregator=dp), params, 3, batches,
                      weights)
  mean, _ = run_rounds(builder(loss_fn, optax.sgd(0.05)), params, 3, batches, equal)
  close(noiseless.params, mean.params, rtol=1e-5, atol=1e-7)


def test_options_an_algorithm_cannot_honour_are_refused_in_one_line():
  dp = DpAggregator()
  with pytest.raises(AlgorithmConfigError, match=r'^papa takes no aggregator \(members are'):
    papa(loss_fn, optax.sgd(0.1), population=2, aggregator=dp)
  with pytest.raises(AlgorithmConfigError, match=r'^btm takes no aggregator'):
    btm(loss_fn, optax.sgd(0.1), num_experts=2, aggregator=dp)
  with pytest.raises(AlgorithmConfigError, match=r'^scaffold takes no prox_mu \(the control'):
    scaffold(loss_fn, optax.sgd(0.1), num_clients=2, prox_mu=0.1)
  with pytest.raises(AlgorithmConfigError, match='prox_mu must be a number >= 0'):
    fed_avg(loss_fn, optax.sgd(0.1), prox_mu=-1.0)


def test_papa_and_btm_prox_mu_is_fedprox_on_each_member():
  """One round of a single member / expert with prox_mu equals FedProx's round on one client."""
  params, batches, weights = initial_params(), client_batches(1, 3), jnp.ones(1)
  want, _ = run_rounds(fed_avg(loss_fn, optax.sgd(0.05), prox_mu=0.5), params, 1, batches, weights)
  for alg in (papa(loss_fn, optax.sgd(0.05), population=1, same_init=True, every=5,
                   prox_mu=0.5),
              btm(loss_fn, optax.sgd(0.05), num_experts=1, prox_mu=0.5)):
    got, _ = run_rounds(alg, params, 1, batches, weights)
    close(got.params, want.params)


@pytest.mark.parametrize('name', ['fed_yogi', 'papa', 'btm', 'scaffold', 'diloco'])
def test_every_builder_resolves_an_unset_client_chunk_per_platform(name):
  """On CPU an unset `client_chunk` traces to the program of `client_chunk=1`, not to the
  vmapped one (a chunk >= the cohort), as for fed_avg (tests/federated/test_chunking.py)."""
  from paxlike.federated import chunking, diloco
  builders = {'fed_yogi': lambda **o: fed_yogi(loss_fn, optax.sgd(0.1), **o),
              'papa': lambda **o: papa(loss_fn, optax.sgd(0.1), population=4, **o),
              'btm': lambda **o: btm(loss_fn, optax.sgd(0.1), num_experts=4, **o),
              'scaffold': lambda **o: scaffold(loss_fn, optax.sgd(0.1), num_clients=4, **o),
              'diloco': lambda **o: diloco(loss_fn, optax.sgd(0.1), num_replicas=4, **o)}
  params, batches, weights = initial_params(), client_batches(4, 2), jnp.ones(4)

  def program(chunk):
    alg = builders[name](client_chunk=chunk)
    return str(jax.make_jaxpr(alg.next)(alg.init(params), batches, weights, jax.random.key(0)))

  assert program(None) == program(chunking.CPU_CLIENT_CHUNK) != program(4)
