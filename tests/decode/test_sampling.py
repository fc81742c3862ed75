"""Sampling: top-k and top-p keep exactly the tokens a numpy computation allows, draws over many
seeds stay inside that set (and are not all the same), temperature 0 is argmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.decode import Sampling, generate, sample, top_k_filter, top_p_filter
from paxlike.layers import TransformerLM
from tests.decode.test_generate import TINY, params_of, prompts_of

LOGITS = jax.random.normal(jax.random.key(0), (6, 40)) * 2.0


def allowed_top_k(logits: np.ndarray, k: int) -> list[set[int]]:
  return [set(np.argsort(-row)[:k].tolist()) for row in logits]


def allowed_top_p(logits: np.ndarray, p: float) -> list[set[int]]:
  """The fewest most likely tokens whose probability reaches p."""
  sets = []
  for row in np.asarray(logits, np.float64):
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    needed = int(np.searchsorted(np.cumsum(probs[order]), p)) + 1
    sets.append(set(order[:needed].tolist()))
  return sets


def kept(filtered: jax.Array) -> list[set[int]]:
  return [set(np.flatnonzero(np.isfinite(row)).tolist()) for row in np.asarray(filtered)]


@pytest.mark.parametrize('k', [1, 3, 10])
def test_top_k_keeps_the_k_largest(k):
  assert kept(top_k_filter(LOGITS, k)) == allowed_top_k(np.asarray(LOGITS), k)
  assert kept(top_k_filter(LOGITS, 0)) == [set(range(40))] * 6


@pytest.mark.parametrize('p', [0.05, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_nucleus(p):
  want = allowed_top_p(np.asarray(LOGITS), p)
  assert kept(top_p_filter(LOGITS, p)) == want
  assert all(len(s) >= 1 for s in want)
  assert p < 0.5 or max(len(s) for s in want) > 1  # Not only the most likely token.


def _draws(sampling: Sampling, seeds: int = 200) -> np.ndarray:
  keys = jax.random.split(jax.random.key(1), seeds)
  return np.asarray(jax.vmap(lambda key: sample(key, LOGITS, sampling))(keys))  # [seeds, rows]


@pytest.mark.parametrize('sampling, allowed', [
    (Sampling(1.0, top_k=4), lambda x: allowed_top_k(x, 4)),
    (Sampling(1.0, top_p=0.6), lambda x: allowed_top_p(x, 0.6)),
    (Sampling(2.0, top_k=5, top_p=0.5), lambda x: allowed_top_p(
        np.where(np.isfinite(np.asarray(top_k_filter(x / 2.0, 5))), x / 2.0, -np.inf), 0.5)),
])
def test_draws_over_many_seeds_stay_in_the_allowed_set(sampling, allowed):
  draws = _draws(sampling)
  for row, permitted in enumerate(allowed(np.asarray(LOGITS))):
    seen = set(draws[:, row].tolist())
    assert seen <= permitted, (row, seen - permitted)
    if len(permitted) > 1:
      assert len(seen) > 1  # A real draw, not the argmax every time.


def test_temperature_zero_is_argmax_and_bad_options_are_refused():
  np.testing.assert_array_equal(sample(jax.random.key(0), LOGITS, Sampling()),
                                np.argmax(LOGITS, axis=-1))
  for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=1.5)):
    with pytest.raises(Exception, match='must be'):
      Sampling(**bad)


def test_generate_samples_only_top_k_tokens_over_many_seeds():
  model = TransformerLM(**TINY)
  # Jitted: eagerly, every op of the init and the forward pass compiles on its own.
  params = jax.jit(params_of, static_argnums=(0, 1))(model, 7)
  prompts = prompts_of([5, 8, 3], seed=8)
  # Each prompt left-aligned in one 8-token window, so one compiled forward pass serves all
  # (causal attention: the padding after a prompt cannot change its logits).
  forward = jax.jit(lambda params, window: model.apply({'params': params}, window[None])[0])
  windows = [np.pad(p, (0, 8 - len(p))) for p in prompts]
  first_logits = [np.asarray(forward(params, w)[len(p) - 1]) for p, w in zip(prompts, windows)]
  permitted = allowed_top_k(np.stack(first_logits), 3)
  seen = [set() for _ in prompts]
  for seed in range(25):
    out = generate(model, params, prompts, max_new_tokens=1, temperature=1.0, top_k=3, seed=seed)
    for row, tokens in enumerate(out):
      seen[row].add(int(tokens[0]))
  for row in range(len(prompts)):
    assert seen[row] <= permitted[row] and len(seen[row]) > 1, (seen[row], permitted[row])
