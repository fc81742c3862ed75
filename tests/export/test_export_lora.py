"""`python -m paxlike.export` of a federated LoRA round (federated.TextLoraFedAvg at test size):
the clients get the frozen base once and upload only the adapters, plan.json's byte counts equal
the adapters' and the base's bytes computed here, and the executor runs the trainer's rounds."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

from paxlike.export import run
from paxlike.layers.lora import lora_mask
from paxlike.core.trainable import split_params
from tests.export.export_task import exported_rounds_match_training, trained_and_exported

# A trainer run and an export (export_task's, made once per pytest run), a few seconds each.
pytestmark = pytest.mark.slow


def nbytes(tree) -> int:
  return sum(math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def test_lora_export_sends_the_base_once_uploads_the_adapters_and_runs_like_training(
    tmp_path_factory):
  trained = trained_and_exported(tmp_path_factory, 'lora_text')
  exported, history = exported_rounds_match_training(trained)

  # The adapters' and the base's bytes, from the model's params (float32).
  params = jax.tree.unflatten(jax.tree.structure(exported_params(exported)),
                              list(exported_params(exported).values()))
  adapters, base = split_params(params, lora_mask)
  assert 0 < nbytes(adapters) < nbytes(base) / 10
  plan = json.loads((trained.export / 'plan.json').read_text())
  up = {c['value']: c['bytes'] for c in plan['communication'] if c['kind'] in ('sum', 'mean')}
  sent = {d['name']: d['shape'] for d in plan['programs']['client']['outputs']}
  assert sum(b for v, b in up.items() if sent[v]) == nbytes(adapters)  # The adapters only ...
  scalars = [v for v in up if not sent[v]]  # ... and the round's weights and metrics.
  assert plan['upload_bytes_per_client'] == nbytes(adapters) + 4 * len(scalars)
  assert plan['full_model_upload_bytes'] == plan['upload_bytes_per_client'] + nbytes(base)
  assert plan['download_once_bytes'] == nbytes(base)
  assert nbytes(adapters) <= plan['download_bytes_per_client'] < nbytes(adapters) + 64
  once = [c for c in plan['communication'] if c.get('once')]
  assert once and all(c['kind'] == 'broadcast' for c in once)
  assert {c['of'] for c in once} == set(split_params(exported_params(exported), lora_mask)[1])

  # A client uses the base it kept from round 1: a changed base in round 2's server state does
  # not reach it.
  kept = [{} for _ in range(plan['clients'])]
  values = {**exported.carried, **{n: a[0] for n, a in exported.rounds.items()}}
  first = run.run_round(exported, values, kept)
  second = {**{n: first[n] for n in exported.carried}, **{n: a[1] for n, a in
                                                          exported.rounds.items()}}
  tampered = {n: (v * 0 if n.startswith('state.params.') and 'lora' not in n else v)
              for n, v in second.items()}
  outputs = run.run_round(exported, tampered, kept)
  for name, value in history[1].items():
    if name.startswith('metrics.') or 'lora' in name:
      np.testing.assert_array_equal(outputs[name], value, err_msg=name)


def exported_params(exported: run.Export) -> dict:
  """The exported state's params by name ('state.params.<path>')."""
  return {n: v for n, v in exported.carried.items() if n.startswith('state.params.')}
