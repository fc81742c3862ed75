"""The eval step: pooled metrics of the params, and of an algorithm's ensemble (BTM's experts)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.trainer import evaluation, losses
from paxlike.federated.ensemble import ensemble_log_probs
from paxlike.federated import btm
from paxlike.layers import TransformerLM

MODEL = TransformerLM(num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16)
_INIT = jax.jit(MODEL.init)  # One program: eagerly, every op of the init compiles on its own.


def _setup(experts: int = 2):
  tokens = jax.random.randint(jax.random.key(1), (4, 13), 0, 256)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'mask': jnp.ones((4, 12)).at[3, 6:].set(0.0)}
  params = _INIT(jax.random.key(0), batch['inputs'])['params']
  alg = btm(losses.model_loss_fn(MODEL), optax.sgd(0.1), num_experts=experts)
  step = jax.jit(evaluation.eval_step(MODEL, 'tokens', 1, alg.ensemble))
  return alg, jax.jit(alg.init)(params), batch, step


def _loss(out):
  return float(out[0].compute()['loss'])


def test_an_ensemble_of_identical_experts_scores_like_the_seed():
  _, state, batch, step = _setup()
  out = step(state, batch, jnp.zeros((4, 12), jnp.int32))
  assert _loss(out['ensemble_']) == pytest.approx(_loss(out['']), rel=1e-5)


def test_ensemble_loss_is_the_masked_nll_of_the_posterior_mixture():
  _, state, batch, step = _setup()

  @jax.jit
  def perturbed(experts):  # Expert 0 is the seed, expert 1 is not.
    noise = jax.tree.map(lambda x: jax.random.normal(jax.random.key(2), x.shape) * 0.3, experts)
    return jax.tree.map(lambda x, n: x + n * jnp.arange(2).reshape(-1, *[1] * (x.ndim - 1)),
                        experts, noise)
  experts = perturbed(state.experts)
  state = state._replace(experts=experts, domain_examples=jnp.array([1.0, 3.0]))
  out = step(state, batch, jnp.zeros((4, 12), jnp.int32))

  def apply(params, tokens):
    return MODEL.apply({'params': params}, tokens, deterministic=True)

  log_probs = jax.jit(ensemble_log_probs, static_argnums=0)(
      apply, experts, batch['inputs'], jnp.log(jnp.array([.25, .75])))
  nll = -np.take_along_axis(np.asarray(log_probs), np.asarray(batch['targets'])[..., None], -1)
  mask = np.asarray(batch['mask'])
  want = (nll[..., 0] * mask).sum() / mask.sum()
  assert _loss(out['ensemble_']) == pytest.approx(want, rel=1e-5)
  assert _loss(out['ensemble_']) != pytest.approx(_loss(out['']), rel=1e-3)


def test_classifier_ensemble_is_the_prior_weighted_mixture():
  from paxlike.layers.vision import MlpClassifier
  model = MlpClassifier(num_classes=5, hidden=(8,))
  inputs = jax.random.normal(jax.random.key(3), (6, 4, 4, 1))
  batch = {'inputs': inputs, 'targets': jnp.arange(6) % 5, 'mask': jnp.ones(6)}
  params = jax.jit(model.init)(jax.random.key(0), inputs)['params']
  alg = btm(losses.model_loss_fn(model), optax.sgd(0.1), num_experts=2)
  state = jax.jit(alg.init)(params)
  experts = jax.jit(lambda e: jax.tree.map(lambda x: x.at[1].multiply(-2.0), e))(state.experts)
  state = state._replace(experts=experts, domain_examples=jnp.array([3.0, 1.0]))
  step = jax.jit(evaluation.eval_step(model, 'examples', 1, alg.ensemble))
  out = step(state, batch, jnp.zeros(6, jnp.int32))
  softmax = jax.jit(lambda params: jax.nn.softmax(model.apply({'params': params}, inputs)))
  probs = [softmax(jax.tree.map(lambda x: np.asarray(x)[k], experts)) for k in range(2)]
  mixture = 0.75 * np.asarray(probs[0]) + 0.25 * np.asarray(probs[1])
  want = -np.log(mixture[np.arange(6), np.arange(6) % 5]).mean()
  assert _loss(out['ensemble_']) == pytest.approx(want, rel=1e-5)


def test_a_block_that_does_not_match_the_process_block_is_refused():
  from jax.sharding import NamedSharding, PartitionSpec as P
  from paxlike.core import partitioning
  sharding = NamedSharding(jax.make_mesh((1,), ('data',)), P('data'))
  with pytest.raises(ValueError, match='does not match the process block'):
    partitioning.block_to_global(np.zeros((8, 3)), sharding, (slice(0, 4),), (8,))
