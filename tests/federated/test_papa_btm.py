"""PAPA (population averaging) and BTM (branch-train-merge, ensemble) identities."""

from __future__ import annotations

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.core import optim
from paxlike.federated.ensemble import ensemble_log_probs
from paxlike.federated import AlgorithmConfigError, btm, papa
from tests.federated.regression import (B, D, REQUIRED, batch_loss, client_batches, close,
                                        initial_params, loss_fn, normal, optax_step)

P = 4


def _f32(values) -> np.ndarray:
  return np.array(list(values), np.float32)


def _ones(n: int) -> np.ndarray:
  return np.ones(n, np.float32)


def _mean(tree):
  return jax.tree.map(lambda x: np.asarray(x).mean(0), tree)


def _stack(*trees):
  return jax.tree.map(lambda *x: np.stack(x), *trees)


def _diverse(state, field):
  """The state with its per-member params replaced by distinct random ones."""
  rng = np.random.default_rng(7)
  members = jax.tree.map(lambda x: normal(rng, x.shape, x.dtype), getattr(state, field))
  return state._replace(**{field: members, 'params': _mean(members)})


def _train_separately(optimizer, params, batches, slot, rounds):
  opt_state, step = optimizer.init(params), optax_step(optimizer)
  for _ in range(rounds):
    for h in range(jax.tree.leaves(batches)[0].shape[1]):
      params, opt_state, _ = step(params, opt_state, jax.tree.map(lambda x: x[slot, h], batches))
  return params


# PAPA.


@pytest.mark.parametrize('variant', ['gradual', 'all'])
def test_papa_averaging_keeps_population_mean(variant):
  alg = papa(loss_fn, optax.sgd(0.0), P, alpha=0.9, every=1, variant=variant)
  state = _diverse(alg.init(initial_params()), 'population')
  before = state.population
  state, metrics = jax.jit(alg.next)(state, client_batches(P, 2), _ones(P), jax.random.key(3))
  close(_mean(state.population), _mean(before))
  close(state.params, _mean(before))
  assert int(metrics['averaged']) == 1 and int(state.round) == 1
  mean = _mean(before)
  if variant == 'gradual':
    close(state.population, jax.tree.map(lambda w, m: 0.9 * w + 0.1 * m, before, mean))
  else:
    close(state.population, jax.tree.map(lambda w, m: np.broadcast_to(m, w.shape), before, mean))


@pytest.mark.parametrize('round_', range(3))
def test_papa2_children_are_the_means_of_distinct_random_pairs(round_):
  """PAPA-2 (zero learning rate): 4 distinct members leave 4 members, each the mean of a pair of
  parents, no two of the same pair, so the population does not collapse."""
  alg = papa(loss_fn, optax.sgd(0.0), P, every=1, variant='pairs')
  state = _diverse(alg.init(initial_params()), 'population')
  parents = np.asarray(state.population['w'])
  state, _ = jax.jit(alg.next)(state, client_batches(P, 1), _ones(P), jax.random.key(round_))
  children = np.asarray(state.population['w'])
  pairs = []
  for child in children:
    matches = [(i, j) for i, j in itertools.combinations(range(P), 2)
               if np.allclose(child, (parents[i] + parents[j]) / 2, rtol=1e-5, atol=1e-6)]
    assert len(matches) == 1, (child, parents)
    pairs.append(matches[0])
  assert len(set(pairs)) == P, pairs
  close(state.params, _mean(state.population))


def test_papa2_of_two_members_is_their_mean():
  alg = papa(loss_fn, optax.sgd(0.0), 2, every=1, variant='pairs')
  state = _diverse(alg.init(initial_params()), 'population')
  mean = _mean(state.population)
  state, _ = jax.jit(alg.next)(state, client_batches(2, 1), _ones(2), jax.random.key(0))
  close(state.population, _stack(mean, mean))


@pytest.mark.parametrize('variant', ['gradual', 'pairs'])
def test_papa_averages_bfloat16_members_in_float32(variant):
  """0.99·1 + 0.01·1.5 = 1.005 rounds to bf16 1.0078, but to 1.0 when computed in bf16; the
  members and their pulls are as float32 arithmetic cast to bfloat16."""
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), initial_params())
  alg = papa(loss_fn, optax.sgd(0.0), 2, alpha=0.99, every=1, variant=variant)
  state = alg.init(params)
  members = {'w': jnp.array([[1.0] * D, [2.0] * D], jnp.bfloat16),
             'b': jnp.array([1.0, 2.0], jnp.bfloat16)}
  state = state._replace(population=members)
  state, _ = jax.jit(alg.next)(state, client_batches(2, 1), _ones(2), jax.random.key(0))
  w = np.asarray(members['w'], np.float32)
  mean = w.mean(0)
  want = 0.99 * w + 0.01 * mean if variant == 'gradual' else np.stack([mean, mean])
  assert state.population['w'].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(state.population['w'], np.float32),
                                np.asarray(jnp.asarray(want).astype(jnp.bfloat16), np.float32))
  if variant == 'gradual':
    assert float(state.population['w'][0, 0]) == 1.0078125


def _random_params(key):
  kw, kb = jax.random.split(key)
  return {'w': jax.random.normal(kw, (D,)), 'b': jax.random.normal(kb, ())}


def test_papa_members_start_from_their_own_inits_by_default():
  """The paper's code: member j from its own key (the run's init rng split per member)."""
  rng = jax.random.key(5)
  state = papa(loss_fn, optax.adam(0.1), P).seeded_init(_random_params, rng)
  want = [jax.jit(_random_params)(key) for key in jax.random.split(rng, P)]
  close(state.population, _stack(*want))
  assert len({float(x) for x in state.population['b']}) == P
  close(state.params, _mean(state.population))
  close(state.opt_state, jax.vmap(optax.adam(0.1).init)(state.population))
  assert papa(loss_fn, optax.adam(0.1), P, same_init=True).seeded_init is None


def test_papa_alpha_one_trains_members_independently():
  optimizer, params, batches = optax.sgd(0.1), initial_params(), client_batches(P, 2)
  alg = papa(loss_fn, optimizer, P, alpha=1.0, every=1)
  state, step = alg.init(params), jax.jit(alg.next)
  for r in range(3):
    state, _ = step(state, batches, _ones(P), jax.random.key(r))
  for slot in range(P):
    want = _train_separately(optimizer, params, batches, slot, 3)
    close(jax.tree.map(lambda x: x[slot], state.population), want)
  close(state.params, _mean(state.population))


def test_papa_averages_every_k_rounds():
  alg = papa(loss_fn, optax.sgd(0.0), P, every=2, variant='all')
  state = _diverse(alg.init(initial_params()), 'population')
  before, step = state.population, jax.jit(alg.next)
  state, metrics = step(state, client_batches(P, 1), _ones(P), jax.random.key(0))
  assert int(metrics['averaged']) == 0
  close(state.population, before)
  state, metrics = step(state, client_batches(P, 1), _ones(P), jax.random.key(1))
  assert int(metrics['averaged']) == 1 and int(state.round) == 2
  np.testing.assert_allclose(np.ptp(np.asarray(state.population['w']), axis=0), 0, atol=1e-6)


def test_papa_checks_arguments():
  with pytest.raises(ValueError, match='variant'):
    papa(loss_fn, optax.sgd(0.1), P, variant='soup')
  alg = papa(loss_fn, optax.sgd(0.1), P)
  with pytest.raises(ValueError, match='population'):
    alg.next(alg.init(initial_params()), client_batches(P - 1, 1), _ones(P - 1), jax.random.key(0))


# BTM.


def test_btm_identical_experts_merge_to_seed():
  seed = initial_params()
  alg = btm(loss_fn, optax.sgd(0.0), 3)
  state, metrics = jax.jit(alg.next)(alg.init(seed), client_batches(3, 2), _f32([1.0, 2.0, 5.0]),
                                     jax.random.key(0))
  close(state.params, seed)
  np.testing.assert_allclose(metrics['pseudo_grad_norm'], 0.0, atol=1e-6)


@pytest.mark.parametrize('merge_weights', [None, (0.5, 0.25, 0.25)])
def test_btm_experts_train_alone_and_merge_by_weights(merge_weights):
  optimizer, seed, batches = optax.adam(0.05), initial_params(), client_batches(3, 2)
  alg = btm(loss_fn, optimizer, 3, merge_weights=merge_weights)
  state, step = alg.init(seed), jax.jit(alg.next)
  for r, weights in enumerate([_f32([1.0, 2.0, 5.0]), _f32([3.0, 2.0, 1.0])]):
    state, _ = step(state, batches, weights, jax.random.key(r))
  experts = [_train_separately(optimizer, seed, batches, k, 2) for k in range(3)]
  close(_stack(*experts), state.experts, rtol=1e-4)
  np.testing.assert_allclose(state.domain_examples, [4.0, 4.0, 6.0])
  mix = np.array(merge_weights or [4.0, 4.0, 6.0]) / sum(merge_weights or [4.0, 4.0, 6.0])
  close(state.params, jax.tree.map(lambda *e: sum(m * x for m, x in zip(mix, e)), *experts),
         rtol=1e-4)


@pytest.mark.parametrize('algorithm', ['papa', 'btm'])
def test_metrics_keys(algorithm):
  optimizer = optim.sgd(0.1)
  alg = papa(loss_fn, optimizer, P) if algorithm == 'papa' else btm(loss_fn, optimizer, P)
  params, batches = initial_params(), client_batches(P, 2)
  _, metrics = jax.jit(alg.next)(alg.init(params), batches, _f32(range(1, P + 1)),
                                 jax.random.key(0))
  assert REQUIRED | {'learning_rate'} <= set(metrics)
  assert metrics['clients'].dtype == jnp.int32 and int(metrics['clients']) == P
  first = np.array([batch_loss(params, jax.tree.map(lambda x: x[i, 0], batches)) for i in range(P)])
  np.testing.assert_allclose(metrics['loss_before'], first @ np.arange(1.0, P + 1) / 10, rtol=1e-5)
  assert np.isfinite(metrics['loss']) and metrics['loss_after'] < metrics['loss_before']


def _pooled(batches, step):
  """Every slot's batch for local step `step`, concatenated along the batch axis."""
  return jax.tree.map(lambda x: np.concatenate(list(x[:, step]), axis=0), batches)


def _rounds(alg, state, rounds, weights=_f32([1.0, 2.0, 5.0])):
  step = jax.jit(alg.next)
  metrics = []
  for r, batches in rounds:
    state, m = step(state, batches, weights, jax.random.key(r))
    metrics.append(m)
  return state, metrics


def test_btm_seed_phase_trains_one_model_on_the_pooled_cohort():
  optimizer, seed, S = optax.adam(0.05), initial_params(), 2
  rounds = [(r, client_batches(3, 2, seed=10 + r)) for r in range(S)]
  alg = btm(loss_fn, optimizer, 3, seed_steps=S)
  state, metrics = _rounds(alg, alg.init(seed), rounds)
  params, opt_state, first, step = seed, optimizer.init(seed), None, optax_step(optimizer)
  for _, batches in rounds:  # Plain optax: one update per local step on the pooled batch.
    for h in range(2):
      params, opt_state, loss = step(params, opt_state, _pooled(batches, h))
      first = loss if first is None else first
  close(state.params, params, rtol=1e-4)
  close(state.seed_opt_state, opt_state, rtol=1e-4)
  close(state.experts, _stack(*[params] * 3), rtol=1e-4)
  close(state.opt_state, _stack(*[optimizer.init(params)] * 3))
  np.testing.assert_array_equal(state.domain_examples, np.zeros(3))
  assert int(state.round) == S
  np.testing.assert_allclose(metrics[0]['loss_before'], first, rtol=1e-5)
  assert int(metrics[0]['clients']) == 3


def test_btm_after_the_seed_phase_is_btm_from_the_seed():
  optimizer, S, R = optax.adam(0.05), 2, 3
  rounds = [(r, client_batches(3, 2, seed=10 + r)) for r in range(S + R)]
  alg = btm(loss_fn, optimizer, 3, seed_steps=S)
  state, _ = _rounds(alg, alg.init(initial_params()), rounds)
  seeded, _ = _rounds(alg, alg.init(initial_params()), rounds[:S])
  plain = btm(loss_fn, optimizer, 3)
  want, _ = _rounds(plain, plain.init(seeded.params), rounds[S:])
  for field in ('params', 'experts', 'opt_state', 'domain_examples'):
    close(getattr(state, field), getattr(want, field), rtol=1e-4)
  assert int(state.round) == S + R


def aux_loss_fn(params, batch, rng):
  loss, _ = loss_fn(params, batch, rng)
  return loss, {'accuracy': jnp.mean(jnp.abs(batch['x'] @ params['w']) < 1.0)}


def test_btm_seed_and_expert_rounds_report_the_same_metrics():
  alg = btm(aux_loss_fn, optim.sgd(0.1), P, seed_steps=1)
  params, batches = initial_params(), client_batches(P, 2)
  state, (seed_metrics, expert_metrics) = _rounds(
      alg, alg.init(params), [(0, batches), (1, batches)], weights=_f32(range(1, P + 1)))
  assert REQUIRED | {'learning_rate', 'accuracy'} <= set(seed_metrics)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), seed_metrics) == jax.tree.map(
      lambda x: (x.shape, x.dtype), expert_metrics)
  np.testing.assert_allclose(seed_metrics['learning_rate'], 0.1)
  np.testing.assert_allclose(seed_metrics['loss_before'],
                             batch_loss(params, _pooled(batches, 0)), rtol=1e-5)


def test_btm_checks_arguments():
  with pytest.raises(AlgorithmConfigError, match='seed_steps'):
    btm(loss_fn, optax.sgd(0.1), 3, seed_steps=-1)
  with pytest.raises(AlgorithmConfigError, match='merge_weights'):
    btm(loss_fn, optax.sgd(0.1), 3, merge_weights=(1.0, 2.0))


@pytest.mark.parametrize('merge_weights', [(0.0, 0.0, 0.0), (1.0, -1.0, 0.5)])
def test_btm_merge_weights_need_a_positive_sum(merge_weights):
  """All-zero weights would divide by zero (NaN merged params); negative ones are no mixture."""
  with pytest.raises(AlgorithmConfigError, match='merge_weights must be >= 0'):
    btm(loss_fn, optax.sgd(0.1), 3, merge_weights=merge_weights)


# The BTM ensemble.

V, T = 5, 6


def bigram(params, tokens):
  """A causal LM: position t's logits depend only on token t."""
  return params['table'][tokens]


def _experts(k: int):
  return {'table': normal(np.random.default_rng(11), (k, V, V)) * 2}


def _tokens():
  return np.random.default_rng(12).integers(0, V, (2, T)).astype(np.int32)


# Jitted: one program per expert count, where eagerly every op compiles on its own.
_ensemble_log_probs = jax.jit(ensemble_log_probs, static_argnums=0)


def test_ensemble_probs_sum_to_one():
  log_probs = _ensemble_log_probs(bigram, _experts(3), _tokens(), np.log(_f32([.2, .3, .5])))
  assert log_probs.shape == (2, T, V)
  np.testing.assert_allclose(np.exp(np.asarray(log_probs)).sum(-1), 1.0, rtol=1e-5)


def test_ensemble_of_one_is_the_expert():
  experts, tokens = _experts(1), _tokens()
  logits = np.asarray(bigram(jax.tree.map(lambda x: x[0], experts), tokens), np.float64)
  want = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # log_softmax, in numpy.
  close(_ensemble_log_probs(bigram, experts, tokens), want, atol=1e-5)


def test_ensemble_matches_bayes_rule_by_hand():
  experts, tokens, prior = _experts(3), np.asarray(_tokens()), np.array([0.2, 0.3, 0.5])
  got = np.exp(_ensemble_log_probs(bigram, experts, tokens, np.log(prior, dtype=np.float32)))
  table = np.asarray(experts['table'], np.float64)
  probs = np.exp(table) / np.exp(table).sum(-1, keepdims=True)  # [K, V(prev), V(next)]
  for b, t in itertools.product(range(2), range(T)):
    likelihood = np.array([np.prod([probs[k, tokens[b, s - 1], tokens[b, s]]
                                    for s in range(1, t + 1)]) for k in range(3)])
    posterior = prior * likelihood / np.sum(prior * likelihood)
    want = sum(posterior[k] * probs[k, tokens[b, t]] for k in range(3))
    np.testing.assert_allclose(got[b, t], want, rtol=1e-4)


def test_the_trainer_starts_papa_members_from_their_own_inits():
  """Through `build.setup`: member j is the model's init at key j of the run's init rng split
  per member; the soup is their mean."""
  from paxlike.configs import federated as fed
  from paxlike.experiments.federated import DigitsFedAvg
  from paxlike.config import config_io
  from paxlike.trainer import build, loop
  cfg = DigitsFedAvg().config()
  cfg.algorithm = fed.papa(population=5)
  task = config_io.build(cfg)
  s = build.setup(task)
  rng = jax.random.key(task.train.seed)
  state = s.program.init(rng).alg
  sample = task.data.eval_batches()[0]['inputs'][:1]
  init = jax.jit(task.model.init)  # One program for the 5 members, not one per op.
  want = [nn.meta.unbox(init({'params': k, 'dropout': k}, sample)['params'])
          for k in jax.random.split(rng, 5)]
  close(state.population, _stack(*want))
  close(state.params, _mean(state.population))


def test_btm_counts_tokens_seen_per_domain():
  """weighting='num_tokens_seen': each domain's count grows by its experts' mask count (here
  5, 16, 2 per round), not by the data's example weights."""
  counts = np.array([5, 16, 2])
  batches = client_batches(3, 2)
  mask = np.arange(2 * B)[None, :] < counts[:, None]
  batches['mask'] = jnp.asarray(mask.reshape(3, 2, B), jnp.float32)
  alg = btm(loss_fn, optax.sgd(0.1), 3, weighting='num_tokens_seen')
  state, _ = _rounds(alg, alg.init(initial_params()), [(0, batches), (1, batches)])
  np.testing.assert_array_equal(state.domain_examples, 2 * counts)
