"""Federated LoRA (paxlike/federated/lora.py): FedAvg / FedAdam / DP-FedAvg over the adapters
alone. The base stays bitwise, the adapters' round equals the mean of per-client SGD computed
here by hand, the server optimizer state is the adapters' size, the trainer's runs resume
bitwise, the trainer wraps what a builder declares it can train (`over_trainable`), and the
algorithms that keep other params are refused by name."""

from __future__ import annotations

import dataclasses
import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from paxlike.configs import federated as fed
from paxlike.errors import UserError
from paxlike.federated import server_optim
from paxlike.federated.btm import btm
from paxlike.federated.papa import papa
from paxlike.federated.scaffold import scaffold
from paxlike.federated.algorithms import diloco, fed_adam, fed_avg
from paxlike.federated.dp import DpAggregator
from paxlike.federated.lora import frozen_base
from paxlike.layers import TransformerLM
from paxlike.layers.lora import lora_mask
from paxlike.trainer import build, loop, losses, program, restore
from paxlike.core.trainable import merge_params, split_params
from tests.federated.lora_task import lora_setup, restored_state

MODEL = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16,
                      lora_rank=2, lora_targets=('query', 'value'))
CLIENTS, STEPS, LR = 3, 2, 0.1


def nbytes(tree) -> int:
  return sum(math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def tobytes(tree) -> list[bytes]:
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


@pytest.fixture(scope='module')
def params():
  """The tiny LoRA model's params with nonzero B (so the adapters change the loss)."""
  # Jitted: eagerly, every op of the init compiles on its own.
  p = nn.meta.unbox(jax.jit(MODEL.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params'])
  noise = jax.random.normal(jax.random.key(1), (), jnp.float32)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.05 * noise if path[-1].key.endswith('_lora_b') else x, p)


def round_inputs(seed: int):
  tokens = np.random.default_rng(seed).integers(0, 64, (CLIENTS, STEPS, 4, 9))
  batches = {'inputs': jnp.asarray(tokens[..., :-1]), 'targets': jnp.asarray(tokens[..., 1:]),
             'mask': jnp.ones(tokens[..., 1:].shape, jnp.float32)}
  return batches, jnp.asarray([1.0, 2.0, 5.0]), jax.random.key(seed)


# The adapters' gradient, one program for every call (the base an argument, not a constant).
_adapter_grad = jax.jit(jax.grad(lambda a, base, batch: losses.model_loss_fn(MODEL)(
    merge_params(a, base), batch, jax.random.key(0))[0]))


def by_hand_fedavg(adapters, base, batches, weights):
  """Each client: STEPS SGD steps on its adapters (the loss of base + adapters); then the
  weighted mean of the client adapters (the steps and the mean in numpy)."""
  results = []
  for c in range(CLIENTS):
    a = jax.tree.map(np.asarray, adapters)
    for s in range(STEPS):
      g = _adapter_grad(a, base, jax.tree.map(lambda x: x[c, s], batches))
      a = jax.tree.map(lambda w, d: w - np.float32(LR) * np.asarray(d), a, g)
    results.append(a)
  w = np.asarray(weights) / np.sum(weights)
  return jax.tree.map(lambda *xs: sum(wi * x for wi, x in zip(w, xs)), *results)


def test_fedavg_of_adapters_is_the_mean_of_client_sgd_and_the_base_is_frozen(params):
  alg = frozen_base(fed_avg, losses.model_loss_fn(MODEL), optax.sgd(LR), lora_mask)
  adapters, base = split_params(params, lora_mask)
  state, step = alg.init(params), jax.jit(alg.next)
  assert jax.tree.structure(state.params) == jax.tree.structure(params)
  for r in range(3):
    inputs = round_inputs(r)
    expected = by_hand_fedavg(split_params(state.params, lora_mask)[0], base, *inputs[:2])
    state, metrics = step(state, *inputs)
    got = split_params(state.params, lora_mask)[0]
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert tobytes(split_params(state.params, lora_mask)[1]) == tobytes(base)
  assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got),
                                                      jax.tree.leaves(adapters)))
  assert np.isfinite(metrics['loss']) and int(metrics['clients']) == CLIENTS


def test_fedadam_steps_the_adapters_only_with_state_of_their_size(params):
  server = server_optim.adam(0.05, 0.9, 0.99, 1e-3)
  alg = frozen_base(functools.partial(fed_adam, server_learning_rate=0.05),
                    losses.model_loss_fn(MODEL), optax.sgd(LR), lora_mask)
  adapters, base = split_params(params, lora_mask)
  state = alg.init(params)
  assert nbytes(state.server_opt_state) == nbytes(server.init(adapters))
  assert nbytes(state.server_opt_state) - nbytes(server.init({})) == 2 * nbytes(adapters)
  assert 2 * nbytes(adapters) < nbytes(base) / 10
  inputs = round_inputs(7)
  mean = by_hand_fedavg(adapters, base, *inputs[:2])
  pseudo_grad = jax.tree.map(jnp.subtract, adapters, mean)
  updates, _ = server.update(pseudo_grad, server.init(adapters), adapters)
  expected = optax.apply_updates(adapters, updates)
  state, _ = jax.jit(alg.next)(state, *inputs)
  got, frozen = split_params(state.params, lora_mask)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert tobytes(frozen) == tobytes(base)


def test_dp_fedavg_clips_and_noises_the_adapters_only(params):
  """Noise-free DP with a tiny clip: each client's adapter update is clipped to the norm, so
  the server's step is at most the clip norm, and the base never moves."""
  clip = 1e-3
  dp = DpAggregator(clip_norm=clip, noise_multiplier=0.0)
  alg = frozen_base(functools.partial(fed_avg, aggregator=dp), losses.model_loss_fn(MODEL),
                    optax.sgd(LR), lora_mask)
  adapters, base = split_params(params, lora_mask)
  state = alg.init(params)
  assert nbytes(state.aggregator_state) == nbytes(dp.init(adapters))
  state, metrics = jax.jit(alg.next)(state, *round_inputs(3))
  got, frozen = split_params(state.params, lora_mask)
  step = optax.tree.norm(jax.tree.map(jnp.subtract, got, adapters))
  unclipped = optax.tree.norm(jax.tree.map(jnp.subtract, by_hand_fedavg(
      adapters, base, *round_inputs(3)[:2]), adapters))
  assert 0 < float(step) <= clip * (1 + 1e-4) < float(unclipped)
  assert tobytes(frozen) == tobytes(base)
  assert np.isfinite(metrics['loss'])


def test_diloco_keeps_each_replicas_inner_state_of_the_adapters_alone(params):
  inner = optax.adam(1e-2)
  alg = frozen_base(functools.partial(diloco, num_replicas=CLIENTS),
                    losses.model_loss_fn(MODEL), inner, lora_mask)
  adapters, base = split_params(params, lora_mask)
  state = alg.init(params)
  assert nbytes(state.client_opt_state) == CLIENTS * nbytes(inner.init(adapters))
  state, _ = jax.jit(alg.next)(state, *round_inputs(2))
  assert tobytes(split_params(state.params, lora_mask)[1]) == tobytes(base)
  assert int(state.client_opt_state[0].count[0]) == STEPS
  resized = jax.eval_shape(alg.fixed_cohort.resized(2).init, params)  # As the exporter does.
  assert nbytes(resized.client_opt_state) == 2 * nbytes(inner.init(adapters))


@pytest.mark.parametrize('builder, name', [
    (functools.partial(papa, population=2), 'papa'),
    (functools.partial(btm, num_experts=2), 'btm'),
    (functools.partial(scaffold, num_clients=2), 'scaffold')])
def test_algorithms_with_other_params_refuse_lora(builder, name):
  task = types.SimpleNamespace(algorithm=builder, optimizer=optax.sgd(0.1))
  with pytest.raises(UserError, match=f'the algorithm {name} keeps other params.*cannot freeze the base'):
    program.build_algorithm(task, losses.model_loss_fn(MODEL), lora_mask)


@pytest.mark.parametrize('builder', [
    fed_avg, functools.partial(fed_adam, server_learning_rate=0.05),
    functools.partial(diloco, num_replicas=CLIENTS)])
def test_the_trainer_runs_the_lora_algorithm_the_builder_declares(params, builder):
  """The trainer asks the built algorithm for its LoRA form (`Algorithm.over_trainable`, no
  list of names): a round of it is bitwise frozen_base's of the same builder and arguments."""
  task = types.SimpleNamespace(algorithm=builder, optimizer=optax.sgd(LR))
  loss_fn = losses.model_loss_fn(MODEL)
  declared = program.build_algorithm(task, loss_fn, lora_mask)
  direct = frozen_base(builder, loss_fn, optax.sgd(LR), lora_mask)
  got, _ = jax.jit(declared.next)(declared.init(params), *round_inputs(5))
  want, _ = jax.jit(direct.next)(direct.init(params), *round_inputs(5))
  assert tobytes(got) == tobytes(want)
  assert tobytes(split_params(got.params, lora_mask)[1]) == tobytes(
      split_params(params, lora_mask)[1])


# The trainer on federated.TextLoraFedAvg at test size (tests/federated/lora_task.py).

@pytest.fixture(scope='module')
def placed(tmp_path_factory):
  return lora_setup(tmp_path_factory.mktemp('corpus'))


def test_trainer_rounds_keep_the_base_and_adapter_sized_state(placed, tmp_path):
  loop.train(placed.with_steps(3), tmp_path)
  trainer = placed.trainer
  with jax.set_mesh(trainer.program.mesh):
    start = trainer.program.init(jax.random.key(trainer.task.train.seed))
  end = restored_state(trainer, tmp_path, 3)
  (a0, b0), (a3, b3) = (split_params(s.alg.params, lora_mask) for s in (start, end))
  assert tobytes(b3) == tobytes(b0)
  assert all(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a3), jax.tree.leaves(a0)))
  # FedAvg's server SGD keeps its hyperparameters and nothing shaped like the params.
  assert nbytes(end.alg.server_opt_state) == nbytes(trainer.task.built_algorithm.init(
      {}).server_opt_state)
  # Eval, decode and the HF export read the whole model: base and trained adapters.
  exported = restore.export_params(trainer, end)
  assert jax.tree.structure(exported) == jax.tree.structure(start.alg.params)
  assert tobytes(split_params(exported, lora_mask)[0]) == tobytes(a3)


def test_trainer_fedadam_state_is_the_adapters_and_resumes_bitwise(tmp_path_factory, tmp_path):
  fedadam = lora_setup(tmp_path_factory.mktemp('corpus_adam'),
                       fed.fed_adam(server_learning_rate=0.05))
  adapters = split_params(fedadam.trainer.program.abstract_state.alg.params, lora_mask)[0]
  server = fedadam.trainer.program.abstract_state.alg.server_opt_state
  assert nbytes(server) - nbytes(fedadam.trainer.task.built_algorithm.init(
      {}).server_opt_state) == 2 * nbytes(adapters)
  loop.train(fedadam.with_steps(3), tmp_path / 'whole')
  loop.train(fedadam.with_steps(2), tmp_path / 'parts')
  loop.train(fedadam.with_steps(3), tmp_path / 'parts')
  whole = restored_state(fedadam.trainer, tmp_path / 'whole', 3)
  parts = restored_state(fedadam.trainer, tmp_path / 'parts', 3)
  assert tobytes(whole) == tobytes(parts)


@pytest.mark.slow  # Two trainer runs, end to end.
def test_lora_rounds_from_a_pretrained_fedavg_job_keep_its_params_as_the_base(
    placed, tmp_path_factory, tmp_path):
  """TextFedAvg (no adapters) trains a base; TextLoraFedAvg starts from it (`train.init_from=
  job:DIR`): after its rounds the base is bitwise the pretrained params."""
  from tests.federated.lora_task import lora_config  # pylint: disable=import-outside-toplevel
  from paxlike.config import config_io  # pylint: disable=import-outside-toplevel
  cfg = lora_config(tmp_path_factory.mktemp('corpus_base'))
  config_io.apply_overrides(cfg, ['model.lora_rank=0', 'train.num_steps=2'])
  pretrain = build.setup(config_io.build(cfg))
  loop.train(pretrain, tmp_path / 'base')
  pretrained = restored_state(pretrain, tmp_path / 'base', 2).alg.params
  trainer = placed.with_steps(2)
  trainer = dataclasses.replace(trainer, task=dataclasses.replace(trainer.task, train=(
      dataclasses.replace(trainer.task.train, init_from=f'job:{tmp_path / "base"}'))))
  loop.train(trainer, tmp_path / 'lora')
  adapters, base = split_params(restored_state(trainer, tmp_path / 'lora', 2).alg.params,
                                lora_mask)
  assert tobytes(base) == tobytes(pretrained)
  assert jax.tree.structure(base) == jax.tree.structure(pretrained)
  assert all(np.any(np.asarray(b)) for b in jax.tree.leaves(adapters))  # B moved off zero.
