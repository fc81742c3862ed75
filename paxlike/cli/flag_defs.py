"""The flags paxlike's commands share, in groups a program asks for: CONFIG (the task config a
command runs and the machine's settings: `paxlike train`, `export`, `flower`), JOB (a job's
restore and its processes), DECODE (sampling) and MODE (`python -m paxlike.main`'s --mode and
--list, which are commands of `paxlike`). A group is defined once per process, whichever programs ask for it, and its flags are
key flags of the program that asked, so that the program's `--help` lists them."""

from __future__ import annotations

import sys
from typing import Callable

from absl import flags

from paxlike.trainer.restore_fallback import FALLBACKS

FLAGS = flags.FLAGS
MODES = ('train', 'eval', 'decode', 'print_config')
_DEFINED: dict[str, tuple[str, ...]] = {}  # Group name -> the flags it defined.


def _config() -> None:
  flags.DEFINE_string('exp', None, 'Registered experiment key or unique suffix (e.g. '
                      'lm.StdlibTiny), or my_package.my_module.MyExperiment, which imports '
                      'my_package.my_module.')
  flags.DEFINE_string('job_log_dir', None, 'Directory for checkpoints, metrics and summaries.')
  flags.DEFINE_multi_string('fdl_set', [], 'PATH=VALUE override of a task config field '
                            '(repeatable).')
  flags.DEFINE_string('fdl_config', None, 'A serialized config.json to run instead of --exp.')
  flags.DEFINE_multi_string('fdl_fiddler', [], 'A fiddler from paxlike/configs/fiddlers.py (or an '
                            'allowed dotted name) applied to the config before the overrides.')
  flags.DEFINE_multi_string('allow_import', [], 'Extra module allowed in '
                            '--fdl_config/--fdl_fiddler.')
  flags.DEFINE_string('data_dir', None, 'Data root (else $PAXLIKE_DATA_DIR, else ../shared/data).')
  flags.DEFINE_bool('verify_data', False, 'Hash every corpus file and check the token store '
                    'again, instead of trusting their recorded size and times.')
  flags.DEFINE_bool('allow_config_change', False, 'Resume a job dir whose saved config differs.')
  flags.DEFINE_string('compilation_cache_dir', None, 'Persistent XLA compilation cache, so a '
                      'rerun skips compiling (default: ~/.cache/paxlike/jax; empty: off).')


class _FallbackParser(flags.EnumParser):
  """`--restore_fallback` alone (or =true) means `previous`; `--norestore_fallback` means `off`."""

  def parse(self, argument):
    return super().parse({'true': 'previous', 'false': 'off'}.get(str(argument).lower(), argument))


def _job() -> None:
  flags.DEFINE_flag(flags.Flag(
      _FallbackParser(FALLBACKS), flags.ArgumentSerializer(), 'restore_fallback', 'off',
      'If the latest checkpoint is corrupt: off (fail), previous (restore the newest readable '
      'step; fail if none is), from_scratch (as previous, but start from step 0 if none is).',
      boolean=True))
  flags.DEFINE_string('coordinator_address', None, 'Multi-process: host:port of process 0.')
  flags.DEFINE_integer('num_processes', None, 'Multi-process: number of processes.')
  flags.DEFINE_integer('process_id', None, 'Multi-process: this process, in [0, num_processes).')
  flags.DEFINE_integer('distributed_init_timeout', 300, 'Multi-process: seconds to wait for all '
                       'processes to join.')
  flags.DEFINE_integer('heartbeat_timeout', 60, 'Multi-process: seconds after which a silent '
                       'peer counts as dead and the survivors exit non-zero.')


def _decode() -> None:
  flags.DEFINE_string('prompt', 'def ', 'Decode: the text to continue.')
  flags.DEFINE_string('prompts_file', None, 'Decode: a file of prompts, one per line (a batch).')
  flags.DEFINE_integer('decode_length', 200, 'Decode: the most tokens to sample per prompt.')
  flags.DEFINE_integer('top_k', 0, 'Decode: sample among the k likeliest tokens (0 = all).')
  flags.DEFINE_float('top_p', 1.0, 'Decode: sample within the smallest set of probability p.')
  flags.DEFINE_float('temperature', 0.8, 'Decode: sampling temperature (0 = greedy).')
  flags.DEFINE_integer('decode_seed', 0, 'Decode: sampling seed.')
  flags.DEFINE_bool('chat', False, "Decode: each prompt is a user turn of the tokenizer's chat "
                    'template (with its generation prompt); the reply stops at its end of turn.')


def _mode() -> None:
  flags.DEFINE_string('mode', 'train', f'One of {", ".join(MODES)}.')
  flags.DEFINE_bool('list', False, 'List the registered experiments (key, origin, summary) and '
                    'exit.')


GROUPS: dict[str, Callable[[], None]] = {
    'config': _config, 'job': _job, 'decode': _decode, 'mode': _mode}
CONFIG, JOB, DECODE, MODE = GROUPS


def define(*groups: str) -> None:
  """Defines each of `groups` (CONFIG, JOB, DECODE, MODE) not yet defined in this process and
  makes its flags key flags of the running program (the `--help` of `sys.argv[0]`)."""
  for group in groups:
    if group not in _DEFINED:
      before = set(FLAGS)
      GROUPS[group]()
      _DEFINED[group] = tuple(sorted(set(FLAGS) - before))
    show_in_help(*_DEFINED[group])


def show_in_help(*names: str) -> None:
  """Makes the flags `names` key flags of the running program (`sys.argv[0]`), which absl's
  `--help` lists, wherever they were defined."""
  for name in names:
    FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
