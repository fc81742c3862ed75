"""Training objectives are looked up in one place (paxlike/trainer/objectives): each loss config
picks its objective, a loss and data of different kinds are one-line errors, no module outside
the objectives package asks a loss's type or a data source's batch kind, and a new objective
registered from its own module (here, this test's) trains and evaluates through the normal
build path with nothing else changed: its loss, its metrics' means, its held-out metrics and
its files in the job dir."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import paxlike
from paxlike.config import config_io
from paxlike.core.loss import MaskedMeanLoss
from paxlike.errors import UserError
from paxlike.trainer import build, losses, loop, objectives
from paxlike.trainer.grpo_loss import GrpoLoss
from paxlike.trainer.objectives.model import model_eval_step
from paxlike.trainer.preference_loss import PreferenceLoss
from paxlike.trainer.rewards import exact_match
from tests.helpers import metric_rows
from tests.tiny_task import tiny_config

ROOT = Path(paxlike.__file__).parent


def source(kind: str) -> Any:
  """A stand-in data source that gives batches of `kind` (all the lookup reads of one)."""
  return type(f'{kind.title()}Rows', (), {'batch_kind': kind})()


@pytest.mark.parametrize('loss, data_kind, name', [
    (None, 'sequences', 'model'),
    (PreferenceLoss(kind='simpo'), 'pairs', 'preference'),
    (GrpoLoss(reward_fns=(exact_match,)), 'prompts', 'grpo'),
])
def test_each_loss_config_picks_its_objective(loss, data_kind, name):
  assert objectives.for_task(loss, source(data_kind)).name == name
  assert objectives.for_task(loss).name == name  # Before the data is known.


@pytest.mark.parametrize('loss, data_kind, words', [
    (None, 'pairs', "PairsRows gives preference pairs, which train with a preference loss: "
                    "set loss=PreferenceLoss(kind='dpo', ...)"),
    (None, 'prompts', 'PromptsRows gives prompts, which train with GRPO: set loss=GrpoLoss'),
    (PreferenceLoss(), 'sequences', 'PreferenceLoss trains on preference pairs; SequencesRows '
                                    'gives none (use PreferenceData)'),
    (GrpoLoss(reward_fns=(exact_match,)), 'pairs',
     'GrpoLoss trains on prompts; PairsRows gives none (use PromptData)'),
    ('dpo', 'pairs', 'Task.loss must be None or one of GrpoLoss, PreferenceLoss, got str'),
])
def test_a_loss_and_data_of_different_kinds_are_one_line_errors(loss, data_kind, words):
  with pytest.raises(UserError) as error:
    objectives.for_task(loss, source(data_kind))
  assert str(error.value).startswith(words) and '\n' not in str(error.value)


def names(node: ast.AST) -> set[str]:
  """The names and attribute names `node` reads."""
  return ({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} |
          {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)})


def choices_outside_objectives(root: Path = ROOT) -> list[str]:
  """'file:line' of each isinstance test against a registered loss type, each comparison of a
  batch kind and each test of a `loss` against None in paxlike, outside the objectives package
  and the data sources (which define the kinds)."""
  loss_types = {o.loss_type.__name__ for o in objectives.registry().values()}
  found = []
  for path in sorted(root.rglob('*.py')):
    where = path.relative_to(root).parts
    if where[:2] == ('trainer', 'objectives') or where[0] == 'data':
      continue
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      asks_type = isinstance(node, ast.Call) and getattr(node.func, 'id', '') == 'isinstance'
      compares = names(node) if isinstance(node, ast.Compare) else set()
      asks_none = 'loss' in compares and any(
          isinstance(n, ast.Constant) and n.value is None for n in ast.walk(node))
      if (asks_type and names(node) & loss_types) or 'batch_kind' in compares or asks_none:
        found.append(f'{path.relative_to(root)}:{node.lineno}')
  return found


def test_no_module_outside_the_lookup_decides_the_objective():
  assert choices_outside_objectives() == []


def test_the_check_sees_each_way_of_deciding(tmp_path):
  (tmp_path / 'trainer' / 'objectives').mkdir(parents=True)
  (tmp_path / 'trainer' / 'step.py').write_text(
      'grpo = isinstance(task.loss, GrpoLoss)\n'
      'pairs = task.data.batch_kind == "pairs"\n'
      'plain = task.loss is None\n'
      'fine = isinstance(task.model, TransformerLM)\n')
  (tmp_path / 'trainer' / 'objectives' / 'lookup.py').write_text('x = loss is None\n')
  assert choices_outside_objectives(tmp_path) == ['trainer/step.py:1', 'trainer/step.py:2',
                                                  'trainer/step.py:3']


@dataclasses.dataclass(frozen=True)
class ScaledLoss:
  """A toy objective's config: the model's own loss times `scale`."""

  scale: float = 2.0


def scaled_loss_fn(model: Any, loss: ScaledLoss) -> MaskedMeanLoss:
  """The model's loss times `loss.scale`, with the mean scored-target share as `scored`."""
  plain = losses.model_loss_fn(model)

  def sums(params, batch, rng):
    total, (count, metrics) = plain.sums(params, batch, rng)
    return loss.scale * total, (count, {**metrics, 'scored': count})
  return MaskedMeanLoss(sums)


def open_marker(step: Any, job_dir: Path, start: int, primary: bool) -> None:
  del step
  if primary:
    (job_dir / 'scaled.txt').write_text(f'opened at step {start}\n')


SCALED = objectives.Objective(
    name='scaled', loss_type=ScaledLoss, batch_kind='sequences', batch_noun='sequences',
    data_hint='LmData', loss_fn=scaled_loss_fn, eval_step=model_eval_step,
    metrics=('accuracy', 'scored'),
    held_out=lambda task, program: lambda params: {'scale': task.loss.scale},
    open_run=open_marker)


@pytest.fixture
def registered_toy():
  objectives.register(SCALED)
  try:
    yield SCALED
  finally:
    objectives.registry().pop(SCALED.name)


def trained_rows(job: Path, loss: Any) -> list[dict]:
  """The rows of 2 steps of the tiny LM with `loss`, built and run as the CLI does."""
  cfg = tiny_config('train.num_steps=2', 'train.log_every=1', 'train.eval_every=2',
                    'train.checkpoint_every=2', 'data.num_eval_batches=1')
  cfg.loss = loss
  loop.train(build.setup(config_io.build(cfg)), job)
  return metric_rows(job)


def test_a_new_objective_is_one_registration_away(registered_toy, tmp_path):
  with pytest.raises(ValueError, match='clashes'):
    objectives.register(registered_toy)
  plain = trained_rows(tmp_path / 'plain', None)
  scaled = trained_rows(tmp_path / 'scaled', ScaledLoss(scale=2.0))
  assert scaled[0]['loss'] == 2 * plain[0]['loss']  # Step 1: the same params, scaled exactly.
  assert scaled[0]['accuracy'] == plain[0]['accuracy']
  assert scaled[0]['scored'] == 1.0 and 'scored' not in plain[0]  # Its metric, averaged.
  assert scaled[1]['eval_scale'] == 2.0 and 'eval_scale' not in plain[1]
  assert 'eval_loss' in scaled[1]  # The model's eval, as the record says.
  assert (tmp_path / 'scaled' / 'scaled.txt').read_text() == 'opened at step 0\n'
  with pytest.raises(UserError, match='ScaledLoss trains on sequences; PairsRows gives none'):
    objectives.for_task(ScaledLoss(), source('pairs'))


def test_a_loss_config_class_in_an_objectives_module_may_be_saved_and_loaded():
  """A new objective's loss config (a class in its module under paxlike.trainer.objectives)
  passes the saved-config allow list as the built-in losses' do; its functions do not."""
  from paxlike.config import allow_list
  cls = type('KtoLoss', (), {'__module__': 'paxlike.trainer.objectives.kto'})
  assert allow_list.refusal(cls) is None
  fn = lambda: None
  fn.__module__ = 'paxlike.trainer.objectives.kto'
  assert 'whose functions a config may not call' in allow_list.refusal(fn)
