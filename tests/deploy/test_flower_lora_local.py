"""Federated LoRA on text (TextLoraFedAvg at test size: three clients, a file each, all on
one node) on a local Flower federation of real processes (SuperLink, SuperNode, a ClientApp process
per message): its rows equal `python -m paxlike.main`'s, and its frozen base, which the plan
broadcasts once, crosses the network in round 1 only. Round 2's message carries none of it: the
node's ClientApp process reads it from the `context.state` its SuperNode kept, so a Flower that
did not keep it would fail round 2. The export and the trainer's run are shared with
test_flower_secure's LoRA federation (flower_procs.lora_run)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.deploy import flower_procs as fp
from tests.helpers import TIMING_FIELDS, cli_env, metric_rows, run_python

pytestmark = pytest.mark.slow  # An export, Flower processes, a trainer run.

ROUNDS = fp.LORA_ROUNDS


def test_lora_rows_equal_the_simulation_and_the_base_is_sent_once(tmp_path_factory, tmp_path):
  flags, export, job = fp.lora_run(tmp_path_factory)
  began = fp.now_ticks()
  out = tmp_path / 'run'
  done = run_python(['-m', 'paxlike.deploy.flower.local', *flags, f'--export_dir={export}',
                     f'--out={out}', f'--rounds={ROUNDS}', '--nodes=1', '--round_timeout=120'],
                    cli_env(), timeout=600)  # Forked, like the CLI runs (tests/forked_cli.py).
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

  simulated, deployed = metric_rows(job), fp.rows(out / 'server' / 'metrics.jsonl')
  assert [r['step'] for r in simulated] == [r['step'] for r in deployed] == [1, 2]
  assert 'eval_loss' in deployed[-1]
  for sim, dep in zip(simulated, deployed):
    shared = set(sim) & set(dep) - TIMING_FIELDS - {'step'}
    assert {'loss', 'accuracy', 'clients'} <= shared, sorted(shared)
    for key in shared:
      np.testing.assert_allclose(dep[key], sim[key], rtol=1e-5, atol=1e-6, err_msg=key)
  plan = json.loads((export / 'plan.json').read_text())
  once_bytes = plan['download_once_bytes']
  assert once_bytes > 10 * plan['download_bytes_per_client']  # The base dominates round 1.
  first, second = (c['bytes_down'] for c in fp.rows(out / 'server' / 'cohorts.jsonl'))
  assert 0 <= first - second - once_bytes <= 256 * len(
      [e for e in plan['communication'] if e.get('once')])  # The base, with its arrays' headers.
  assert [e['step'] for e in fp.rows(out / 'logs' / 'node0.jsonl')] == [1, 2]
  assert fp.flower_processes_since(began) == []
