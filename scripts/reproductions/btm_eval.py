"""The btm reproduction's per-domain scores of a finished BTM job's experts, from its final
checkpoint: what the trainer's eval does not log (each expert on each domain, the experts of a
random split scored per domain, parameter averages weighted by the domain posterior).

It reads the job's own config.json (the model, the data) and its committed `alg.experts` and
`alg.domain_examples` (Orbax, as `train.init_from` reads a job), scores the test split's tiled
windows with paxlike's model and ensemble (paxlike.federated.ensemble, the functions the
trainer's eval calls), and groups the targets by domain as the trainer's per-client eval does
(`LmData.client_eval` of the 'domains' partition, so a random split is scored on the same
domains). Every loss is in nats per byte, the mean over a domain's test targets.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from paxlike.config import config_io
from paxlike.federated import ensemble

POSTERIOR_WINDOWS = 32  # Held-out windows of a domain that estimate its posterior weights.
CHUNK = 64  # Windows scored at a time.


def restore(job: Path) -> tuple[Any, dict[str, Any]]:
  """(the job's config, {'experts', 'domain_examples'} as numpy) at its latest checkpoint."""
  cfg = config_io.load_file(job / 'config.json')
  manager = ocp.CheckpointManager(
      job / 'checkpoints', options=ocp.CheckpointManagerOptions(read_only=True, create=False),
      item_handlers={'state': ocp.PyTreeCheckpointHandler()})
  try:
    step = manager.latest_step()
    meta = manager.item_metadata(step)['state']
    tree = getattr(meta, 'tree', meta)
    item = {'alg': {k: tree['alg'][k] for k in ('experts', 'domain_examples')}}
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=item, restore_args=args, partial_restore=True)))
  finally:
    manager.close()
  return cfg, restored['state']['alg']


def domain_data(cfg: Any, domains: int) -> Any:
  """The job's LM data with the 'domains' partition (the groups its targets are scored by)."""
  data = fdl.build(cfg.data)
  return dataclasses.replace(data, partition='domains', sampling='fixed', num_clients=domains,
                             clients_per_round=domains, num_eval_batches=None)


def pick(log_probs: jax.Array, targets: jax.Array) -> jax.Array:
  """The log-probs [..., B, T] of the targets [B, T] in `log_probs` [..., B, T, V]."""
  index = jnp.broadcast_to(targets[..., None], (*log_probs.shape[:-1], 1))
  return jnp.take_along_axis(log_probs, index, axis=-1)[..., 0]


def token_scores(apply, experts: Any, inputs: jax.Array, targets: jax.Array,
                 log_prior: jax.Array) -> jax.Array:
  """Target log-probs [K + 1, B, T]: each expert's, then the posterior ensemble's (mixed as
  the trainer's eval mixes an LM's experts: `ensemble.ensemble_log_probs` of the inputs)."""
  per_expert = pick(ensemble.expert_log_probs(apply, experts, inputs), targets)
  mixed = pick(ensemble.ensemble_log_probs(apply, experts, inputs, log_prior), targets)
  return jnp.concatenate([per_expert, mixed[None]])


def averaged_scores(apply, experts: Any, weights: jax.Array, inputs: jax.Array,
                    targets: jax.Array) -> jax.Array:
  """Target log-probs [B, T] of the experts' parameter average with `weights` [K]."""
  w = (weights / weights.sum()).astype(jnp.float32)
  params = jax.tree.map(lambda x: jnp.tensordot(w, x.astype(jnp.float32), 1).astype(x.dtype),
                        experts)
  return pick(jax.nn.log_softmax(apply(params, inputs).astype(jnp.float32), axis=-1), targets)


def posterior_weights(expert_lp: np.ndarray, group: np.ndarray, prior: np.ndarray,
                      domain: int, windows: int = POSTERIOR_WINDOWS) -> np.ndarray:
  """The domain posterior over experts [K] for `domain`: the mean, over `windows` of its test
  windows (those whose targets are mostly the domain's, evenly spaced), of p(expert | the
  window) ∝ prior · Π p_expert(x_t), the paper's estimate from a few held-out sequences."""
  mine = np.flatnonzero((group == domain).mean(axis=1) > 0.5)
  if not len(mine):
    return np.asarray(prior, np.float64)
  mine = mine[np.linspace(0, len(mine) - 1, min(windows, len(mine))).astype(int)]
  log_post = np.log(prior)[:, None] + expert_lp[:, mine].sum(axis=-1)  # [K, windows]
  log_post -= log_post.max(axis=0, keepdims=True)
  post = np.exp(log_post) / np.exp(log_post).sum(axis=0, keepdims=True)
  return post.mean(axis=1)


def domain_mean(values: np.ndarray, group: np.ndarray, domains: int) -> np.ndarray:
  """[..., domains]: the mean of -values over each domain's targets."""
  return np.stack([-values[..., group == d].mean(axis=-1) for d in range(domains)], axis=-1)


def chunked(fn, inputs: np.ndarray, targets: np.ndarray, axis: int = 0) -> np.ndarray:
  """`fn(inputs, targets)` over CHUNK windows at a time (the last chunk padded, so that one
  compiled shape serves them all), concatenated along `axis` and cut to the windows given."""
  n = len(inputs)
  pad = (-n) % CHUNK
  inputs, targets = (np.concatenate([a, np.repeat(a[-1:], pad, axis=0)]) for a in (inputs, targets))
  out = np.concatenate([fn(inputs[i:i + CHUNK], targets[i:i + CHUNK])
                        for i in range(0, len(inputs), CHUNK)], axis=axis)
  return np.take(out, np.arange(n), axis=axis)


def score(job: Path) -> dict[str, Any]:
  """Per-domain losses of a BTM job's experts: 'experts' [K, D] (expert k on domain d),
  'ensemble' [D] (posterior-mixed), 'uniform' [D] and 'weighted' [D] (parameter averages,
  uniform and by each domain's posterior), 'weights' [D, K], and the domain names."""
  cfg, alg = restore(job)
  experts, examples = alg['experts'], np.asarray(alg['domain_examples'], np.float64)
  k = len(examples)
  prior = examples / examples.sum() if examples.sum() > 0 else np.full(k, 1.0 / k)
  data = domain_data(cfg, k)
  model = fdl.build(cfg.model)
  apply = lambda p, x: model.apply({'params': p}, x, deterministic=True)
  both_fn = jax.jit(functools.partial(token_scores, apply))
  average_fn = jax.jit(functools.partial(averaged_scores, apply))
  batches = data.eval_batches()
  inputs = np.concatenate([b['inputs'] for b in batches])
  targets = np.concatenate([b['targets'] for b in batches])
  group = np.concatenate(list(data.client_eval().groups))
  group = np.where(np.concatenate([b['mask'] for b in batches]) > 0, group, -1)
  log_prior = jnp.log(jnp.asarray(prior, jnp.float32))
  both = chunked(lambda x, y: np.asarray(both_fn(experts, x, y, log_prior)), inputs, targets,
                 axis=1)
  expert_lp, mixed = both[:k], both[k]
  average = lambda w: lambda x, y: np.asarray(average_fn(experts, jnp.asarray(w), x, y))
  uniform = chunked(average(np.ones(k)), inputs, targets)
  weights, weighted = [], []
  for d in range(k):
    w = posterior_weights(expert_lp, group, prior, d)
    rows = np.flatnonzero((group == d).any(axis=1))
    lp = chunked(average(w), inputs[rows], targets[rows])
    weights.append(w)
    weighted.append(-lp[group[rows] == d].mean())
  return {'domains': list(data.client_eval().names), 'experts': domain_mean(expert_lp, group, k),
          'ensemble': domain_mean(mixed, group, k), 'uniform': domain_mean(uniform, group, k),
          'weighted': np.asarray(weighted), 'weights': np.asarray(weights)}
