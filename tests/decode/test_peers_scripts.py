"""The peer benchmarks (benchmarks/peers/) start without the peers: torch and transformers are
only in `make peers`' venv, imported by the child processes the scripts time."""

import subprocess
import sys

from tests.helpers import REPO


def test_the_transformers_decode_script_runs_its_help_without_torch():
  proc = subprocess.run([sys.executable, '-X', 'importtime', 'benchmarks/peers/transformers_decode.py',
                         '--help'], cwd=REPO, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert '--peer_python' in proc.stdout and '--lengths' in proc.stdout
  imported = {line.split('|')[-1].strip() for line in proc.stderr.splitlines() if '|' in line}
  assert not {'torch', 'transformers', 'peft', 'jax'} & imported
