"""Flower's waits as the local federation shortens them (paxlike/deploy/flower/polling.py and
flower_patches.py), checked against flwr's own functions: a missing array is pulled again within a
fraction of a second (Flower's own retries wait 1 s, then 2 s), and the SuperNode's loop sleeps
at most 0.3 s where it slept 3 s."""

import json
import time

from tests.helpers import cli_env, run_python


def _pull_after_misses(pull_objects, misses: int) -> tuple[dict, list[float]]:
  """`pull_objects` of one array whose first `misses` pulls find it missing: (what it returned,
  the times of the pulls)."""
  from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError
  times = []

  def pull(object_id: str) -> bytes:
    times.append(time.monotonic())
    if len(times) <= misses:
      raise ObjectUnavailableError(object_id)
    return b'array'
  return pull_objects(['a'], pull), times


def test_a_missing_array_is_pulled_again_within_a_fraction_of_a_second():
  from flwr.supercore.inflatable import inflatable_utils

  from paxlike.deploy.flower import polling
  got, times = _pull_after_misses(polling.sooner(inflatable_utils.pull_objects), misses=3)
  assert got == {'a': b'array'} and len(times) == 4
  # Waits of 0.02, 0.04 and 0.08 s (±20% jitter); Flower's own would be about 1 + 2 + 4 s.
  assert times[-1] - times[0] < 0.5


SUPERNODE = """
import json, time
from flwr.supernode import start_client_internal as loop
from flwr.supercore.inflatable import inflatable_utils
from paxlike.deploy.flower import flower_patches
before = (loop.time is time, loop.pull_objects is inflatable_utils.pull_objects)
assert flower_patches.apply('supernode')
began = time.monotonic()
loop.time.sleep(3)  # The loop's sleep after a pull that found no message.
print(json.dumps({'before': before, 'slept': time.monotonic() - began,
                  'keywords': loop.pull_objects.keywords, 'clock': loop.time.time() > 0}))
"""


def test_the_local_supernode_sleeps_at_most_0_3_seconds_and_pulls_sooner():
  proc = run_python(['-c', SUPERNODE], cli_env(), timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout)
  assert out['before'] == [True, True]  # What it changes is Flower's own, as imported.
  assert 0.29 <= out['slept'] < 1.0 and out['clock']
  assert out['keywords'] == {'initial_backoff': 0.02, 'backoff_cap': 0.2}
