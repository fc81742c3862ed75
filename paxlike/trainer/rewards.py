"""GRPO's reward functions: two built in, how a config names its own, and the checked call.

A reward function is a plain callable `fn(prompts, completions, **fields) -> list[float]`: one
reward per completion, given the prompt texts and completion texts (each completion without
the token it stopped at) and, as keywords, the other fields of the prompt rows that it names
as parameters (all of them when it takes **kwargs), one value per completion; e.g. `answer`.

A config names one as a callable (saved as a reference, which loading a config.json imports
only from allow-listed modules: paxlike/config/allow_list.py) or on the command line as a
'module.function' string, resolved here under the same rules: this module's functions, or a
module the user allowed with --allow_import. What is not allowed, missing or not callable is a
UserError (exit 2), and so is a function that returns other than numbers (a string, even
'1.0', or None: TRL reads None as "no reward", paxlike refuses it) at its first call; what a
function does wrong at a step otherwise (raises, returns the wrong number of rewards or a
non-finite one) is a RunFailure (exit 1). Either is raised before the step is taken.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from paxlike.errors import RunFailure, UserError

INTEGER = r'-?\d+'  # regex_format's default pattern: a completion that is one integer.


def final_answer(completion: str) -> str:
  """The final answer a completion gives: what follows its last '####' (GSM8K's marker), else
  its last non-empty line, stripped."""
  if '####' in completion:
    return completion.rsplit('####', 1)[1].strip()
  lines = [line.strip() for line in completion.splitlines() if line.strip()]
  return lines[-1] if lines else ''


def exact_match(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[Any]
                ) -> list[float]:
  """1.0 where a completion's final answer (`final_answer`) equals the row's `answer` field
  (as text, stripped), else 0.0."""
  del prompts
  return [float(final_answer(c) == str(a).strip()) for c, a in zip(completions, answer)]


def regex_format(prompts: Sequence[str], completions: Sequence[str], pattern: str = INTEGER
                 ) -> list[float]:
  """1.0 where the whole completion (stripped) matches the regular expression `pattern`, else
  0.0. Another pattern: `fdl.Partial(regex_format, pattern=...)` in a config."""
  del prompts
  compiled = re.compile(pattern)
  return [float(compiled.fullmatch(c.strip()) is not None) for c in completions]


def resolve(name: str, allow: Iterable[str] = ()) -> Callable[..., Any]:
  """The function a 'module.function' name names, when a config may name it: UserError when
  the module is neither this one nor allowed (`allow`: the --allow_import modules), or has no
  such callable."""
  from paxlike.config import allow_list, names  # pylint: disable=import-outside-toplevel
  allow = (*allow, __name__)

  def refusal(fn: Any) -> str | None:
    return allow_list.refusal(fn, allow) or (
        'it is a class, not a function' if isinstance(fn, type) else None)
  return names.resolve(str(name), 'reward function', (*allow_list.ALLOWED_MODULES, *allow),
                       refusal)


def checked_fns(fns: Any, allow: Iterable[str] = ()) -> tuple[Callable[..., Any], ...]:
  """`fns` as a non-empty tuple of callables, names resolved (`resolve`)."""
  if isinstance(fns, str) or callable(fns):
    fns = (fns,)
  if not isinstance(fns, (tuple, list)) or not fns:
    raise UserError('loss.reward_fns must name at least one reward function, e.g. '
                    "--fdl_set=\"loss.reward_fns=('paxlike.trainer.rewards.exact_match',)\"")
  out = tuple(resolve(fn, allow) if isinstance(fn, str) else fn for fn in fns)
  for fn in out:
    if not callable(fn):
      raise UserError(f'loss.reward_fns: {fn!r} is not a function')
  return out


def resolve_in_config(cfg: Any, allow: Iterable[str]) -> None:
  """Replaces the 'module.function' names in the `reward_fns` of every config inside `cfg`
  (a GrpoLoss's) by the functions (UserError for one a config may not name), so the saved
  config names them as references, which a reload imports under the allow-list again."""
  import fiddle as fdl  # pylint: disable=import-outside-toplevel
  from fiddle import daglish  # pylint: disable=import-outside-toplevel
  for value, _ in daglish.iterate(cfg):
    if isinstance(value, fdl.Buildable) and 'reward_fns' in value.__arguments__:
      fns = value.reward_fns
      fns = (fns,) if isinstance(fns, str) else fns
      if isinstance(fns, (tuple, list)) and any(isinstance(fn, str) for fn in fns):
        value.reward_fns = tuple(resolve(fn, allow) if isinstance(fn, str) else fn
                                 for fn in fns)


def _name(fn: Any) -> str:
  fn = getattr(fn, 'func', fn)  # functools.partial
  return getattr(fn, '__name__', type(fn).__name__)


def _fields_for(fn: Any, fields: dict[str, list[Any]]) -> dict[str, list[Any]]:
  """The row fields `fn` takes as keywords: those it names, or all with **kwargs."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return {}
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
    return dict(fields)
  names = {p.name for p in params}
  return {k: v for k, v in fields.items() if k in names}


def _numbers(name: str, values: Any) -> np.ndarray:
  """float64 [n] of what reward function `name` returned; UserError naming the first value
  that is not a real number (a string, None, ...), RunFailure when it is no sequence."""
  try:
    values = list(values)
  except TypeError:
    raise RunFailure(f'reward function {name} returned {type(values).__name__}, not a list of '
                     'numbers') from None
  for i, value in enumerate(values):
    if not isinstance(value, (numbers.Real, np.bool_)):
      raise UserError(f'reward function {name} returned {type(value).__name__} {value!r} for '
                      f'completion {i}: a reward function must return one number per '
                      'completion (not strings or None)')
  return np.asarray(values, np.float64)


def score(fns: Sequence[Callable[..., Any]], weights: Sequence[float] | None,
          prompts: list[str], completions: list[str], fields: dict[str, list[Any]]
          ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """(float32 [N]: the weighted sum of the rewards, {function name: its rewards [N]}).
  RunFailure naming the function when one raises, returns other than N numbers or a
  non-finite one."""
  n, total, each = len(completions), np.zeros(len(completions), np.float64), {}
  for i, fn in enumerate(fns):
    name = _name(fn)
    try:
      values = fn(prompts, completions, **_fields_for(fn, fields))
    except Exception as error:  # The user's code: name it, one line.
      raise RunFailure(f'reward function {name} raised: '
                       f'{type(error).__name__}: {error}') from None
    values = _numbers(name, values)
    if values.shape != (n,):
      raise RunFailure(f'reward function {name} returned {values.size} rewards for {n} '
                       f'completions')
    if not np.all(np.isfinite(values)):
      bad = values[~np.isfinite(values)][0]
      raise RunFailure(f'reward function {name} returned a non-finite reward ({bad})')
    total += (1.0 if weights is None else weights[i]) * values
    each[name] = values.astype(np.float32)
  if not math.isfinite(float(np.max(np.abs(total), initial=0.0))):
    raise RunFailure('the weighted sum of the rewards is not finite')
  return total.astype(np.float32), each
