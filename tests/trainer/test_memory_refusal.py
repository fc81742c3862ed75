"""A train step that cannot fit in a device's memory is refused before step 1 (exit 2, one line
naming XLA's figure and the budget). XLA:CPU reports no memory limit, so these tests set the
budget per device with train.memory_budget_gb."""

import os
import re
import sys

import pytest
from absl import app

from paxlike import main, registry
from paxlike.config import config_io
from paxlike.configs import fiddlers
from paxlike.federated import chunking
from paxlike.errors import UserError
from paxlike.trainer import build, program
from tests.helpers import TINY
from tests.tiny_task import tiny_task


def xla_figure(task) -> float:
  """Arguments + outputs − aliased + temporaries of the compiled step (XLA:CPU), by hand."""
  task.data.prepare()
  stats = program.compile_train_step(task, program.place(task)).memory_analysis()
  return (stats.argument_size_in_bytes + stats.output_size_in_bytes
          - stats.alias_size_in_bytes + stats.temp_size_in_bytes)


def test_setup_refuses_a_step_over_the_budget_with_both_numbers_and_accepts_one_under():
  needed = xla_figure(tiny_task())
  over = tiny_task(f'train.memory_budget_gb={needed * 0.99 / 1e9!r}')
  with pytest.raises(UserError) as refused:
    build.setup(over, evaluator=False)
  numbers = [float(x) for x in re.findall(r'(\d+\.\d+) GB', str(refused.value))]
  assert numbers == [round(needed / 1e9, 2), round(needed * 0.99 / 1e9, 2)], refused.value
  assert 'train.memory_budget_gb' in str(refused.value)
  fits = build.setup(tiny_task(f'train.memory_budget_gb={needed * 1.01 / 1e9!r}'),
                     evaluator=False)
  assert build.compiled_bytes(fits.step) == needed


def federated_task(*overrides: str):
  """federated.StdlibDiLoCo (a cohort of 4 replicas) at the `tiny` fiddler's size, with rows
  enough that activations outweigh the state (117 MB all at once, 54 MB one at a time)."""
  registry.import_all()
  cfg = registry.get('federated.StdlibDiLoCo')().config()
  fiddlers.tiny(cfg)
  config_io.apply_overrides(cfg, ['data.seq_len=64', 'data.batch_size=16', 'data.local_steps=2',
                                *overrides])
  return config_io.build(cfg)


def test_a_federated_round_over_the_budget_is_told_to_train_fewer_clients_at_a_time():
  needed = xla_figure(federated_task('algorithm.client_chunk=4'))  # All 4 at once.
  # The advice is real: one client at a time needs less memory for the same round.
  assert xla_figure(federated_task('algorithm.client_chunk=1')) < needed
  over = federated_task('algorithm.client_chunk=4',
                        f'train.memory_budget_gb={needed * 0.99 / 1e9!r}')
  with pytest.raises(UserError, match=r"fewer of the round's 4 clients at a time than 4 \("):
    build.setup(over, evaluator=False)


def test_a_round_that_does_not_fit_all_at_once_retries_with_fewer_clients(monkeypatch, capsys):
  # As on an accelerator, where an unset client_chunk maps the whole cohort of 4 at once.
  monkeypatch.setattr(chunking, 'default_client_chunk', lambda platform, clients: None)
  two, four = (xla_figure(federated_task(f'algorithm.client_chunk={n}')) for n in (2, 4))
  budget = f'train.memory_budget_gb={(two + four) / 2 / 1e9!r}'  # 2 at a time fit, 4 do not.
  fitted = build.setup(federated_task(budget), evaluator=False)
  assert build.compiled_bytes(fitted.step) == two  # The step compiled is the 2-at-a-time round.
  assert '4 clients at a time do not fit' in capsys.readouterr().err
  # A chunk the config sets is the config's: refused, not retried.
  with pytest.raises(UserError, match=r"fewer of the round's 4 clients at a time than 4"):
    build.setup(federated_task('algorithm.client_chunk=4', budget), evaluator=False)
  # Where not even one client at a time fits, the last refusal stands.
  tiny = f'train.memory_budget_gb={xla_figure(federated_task("algorithm.client_chunk=1")) / 2e9!r}'
  with pytest.raises(UserError, match='does not fit|needs'):
    build.setup(federated_task(tiny), evaluator=False)


def test_the_cli_exits_2_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(os, '_exit', sys.exit)  # main.exit_with ends the process with os._exit.
  job = tmp_path / 'job'
  main.FLAGS.unparse_flags()
  with pytest.raises(SystemExit) as exited:
    app.run(main.main, argv=['paxlike', *TINY, '--fdl_set=train.memory_budget_gb=0.001',
                             f'--job_log_dir={job}'], flags_parser=main.parse_flags)
  err = capsys.readouterr().err.strip().splitlines()
  assert exited.value.code == 2 and len(err) == 1, err
  assert re.search(r'needs \d+\.\d+ GB per device .* allows 0\.00 GB', err[0]), err[0]
  assert not job.exists() or not any(job.iterdir())


def test_a_budget_must_be_positive():
  with pytest.raises(UserError, match='memory_budget_gb must be a positive'):
    tiny_task('train.memory_budget_gb=0.0')
