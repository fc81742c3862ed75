"""A changed corpus is prepared afresh, and a job dir refuses to resume on changed data."""

import hashlib
import json
import os
import shutil

import pytest

from paxlike.data import fingerprint
from paxlike.data import lm
from paxlike.data import make_builder
from paxlike.data import prepare
from paxlike.data import root
from paxlike.errors import UserError
from tests import helpers
from tests.fixture_data import SHAKESPEARE_SLICE as SHAKESPEARE


@pytest.fixture
def corpus(tmp_path, monkeypatch):
  """A private copy of the Tiny Shakespeare slice as the data root, and a private tfds dir."""
  (tmp_path / 'data' / 'tinyshakespeare').mkdir(parents=True)
  shutil.copy(SHAKESPEARE, tmp_path / 'data' / 'tinyshakespeare' / 'input.txt')
  monkeypatch.setenv(root.DATA_DIR_ENV, str(tmp_path / 'data'))
  monkeypatch.setenv(root.TFDS_DIR_ENV, str(tmp_path / 'tfds'))
  return tmp_path / 'data' / 'tinyshakespeare' / 'input.txt'


def upper_case(path) -> None:
  path.write_text(path.read_text(encoding='utf-8').upper(), encoding='utf-8')


def test_digest_hashes_names_and_contents(tmp_path):
  (tmp_path / 'a').write_bytes(b'xy')
  sha = hashlib.sha256(b'xy').hexdigest()
  assert fingerprint.digest({'n': tmp_path / 'a'}) == hashlib.sha256(f'n\0{sha}\n'.encode()).hexdigest()
  assert fingerprint.digest({'m': tmp_path / 'a'}) != fingerprint.digest({'n': tmp_path / 'a'})


def test_a_changed_source_is_prepared_afresh_and_a_touched_one_is_not(corpus):
  def speeches() -> list[bytes]:
    return [bytes(t) for t in lm.read_documents('shakespeare', 'train')[0]]

  before = make_builder('shakespeare').data_dir
  texts = speeches()
  stat = corpus.stat()
  os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # Touched, same bytes.
  assert make_builder('shakespeare').data_dir == before
  upper_case(corpus)
  assert make_builder('shakespeare').data_dir != before
  upper = speeches()  # Not the stale cache: every speech is upper case now.
  assert all(t == t.upper() for t in upper) and not all(t == t.upper() for t in texts)


def test_the_fingerprint_is_the_sources_not_its_path(corpus, tmp_path, monkeypatch):
  here = prepare.source_fingerprint('shakespeare')
  shutil.copytree(tmp_path / 'data', tmp_path / 'moved')
  monkeypatch.setenv(root.DATA_DIR_ENV, str(tmp_path / 'moved'))
  moved = prepare.source_fingerprint('shakespeare')
  assert moved['sha256'] == here['sha256'] and moved['source'] != here['source']
  assert moved['source'] == str(tmp_path / 'moved' / 'tinyshakespeare' / 'input.txt')


def test_resume_on_changed_data_is_refused_unless_allowed(tmp_path):
  old = {'dataset': 'shakespeare', 'source': '/d/input.txt', 'sha256': 'a' * 64}
  fingerprint.check_resume(tmp_path, old, allow_change=False)  # Nothing recorded yet.
  fingerprint.record(tmp_path, old)
  assert json.loads((tmp_path / fingerprint.FILE).read_text()) == old
  fingerprint.check_resume(tmp_path, dict(old, source='/elsewhere/input.txt'), False)
  new = dict(old, sha256='b' * 64)
  with pytest.raises(UserError, match=r'trained on shakespeare data with fingerprint aaaaaaaaaaaa, '
                                      r'but the data now has bbbbbbbbbbbb \(/d/input.txt\)'):
    fingerprint.check_resume(tmp_path, new, allow_change=False)
  fingerprint.check_resume(tmp_path, new, allow_change=True)


@pytest.mark.slow
def test_upper_cased_corpus_changes_step_one_and_refuses_the_old_resume(tmp_path):
  data = tmp_path / 'data'
  (data / 'tinyshakespeare').mkdir(parents=True)
  corpus = data / 'tinyshakespeare' / 'input.txt'
  shutil.copy(SHAKESPEARE, corpus)
  env = helpers.cli_env(**{root.TFDS_DIR_ENV: str(tmp_path / 'tfds')})

  def train(job: str, steps: int, check: bool = True, *flags: str):
    return helpers.run_cli('--exp=lm.ShakespeareTiny', '--fdl_fiddler=tiny', f'--data_dir={data}',
                           f'--job_log_dir={tmp_path / job}', f'--fdl_set=train.num_steps={steps}',
                           *flags, env=env, check=check)

  train('original', 1)
  upper_case(corpus)  # In place: same path, same name, new content.
  train('upper', 1)
  original, upper = (helpers.metric_rows(tmp_path / j)[0] for j in ('original', 'upper'))
  assert original['loss'] != upper['loss'] and original['eval_loss'] != upper['eval_loss']
  recorded = json.loads((tmp_path / 'original' / fingerprint.FILE).read_text())
  assert recorded['sha256'] == fingerprint.digest({'input.txt': SHAKESPEARE})

  before = helpers.snapshot(tmp_path / 'original')
  proc = train('original', 2, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(
      f'paxlike: error: {tmp_path / "original"} was trained on shakespeare data with fingerprint')
  assert helpers.snapshot(tmp_path / 'original') == before
  # Eval still runs on the changed data, but says so.
  evaluated = train('original', 1, True, '--mode=eval')
  assert 'was trained on shakespeare data with fingerprint' in evaluated.stderr
  assert 'these eval numbers are on the data as it is now' in evaluated.stderr
  assert json.loads(evaluated.stdout.strip().splitlines()[-1])['step'] == 1
  assert helpers.snapshot(tmp_path / 'original') == before
