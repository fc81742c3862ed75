"""The real builders, prepared from local sources (the suite's data root: tests/fixture_data.py)
and read back with random access."""

import gzip
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from paxlike.data import ImageData
from paxlike.data import idx
from paxlike.data import make_builder
from paxlike.data import prepare
from paxlike.data import root
from paxlike.data import shakespeare
from paxlike.errors import RunFailure
from paxlike.errors import UserError
from tests import fixture_data
from tests.fixture_data import write_idx


def load_split(name: str, split: str, **kwargs):
  """The split as the trainer reads it: prepared (the first time), then read."""
  return prepare.read_split(prepare.prepared(name, **kwargs), split)


def read_all(name: str, split: str, **kwargs) -> list[dict]:
  rows = load_split(name, split, **kwargs)
  return rows.__getitems__(list(range(len(rows))))


def test_fashion_mnist_counts_and_fields(prepared):
  for split, (_, _, n) in fixture_data.FASHION_FILES.items():
    rows = read_all('fashion_mnist', split)
    assert len(rows) == n
    assert all(e['image'].shape == (28, 28, 1) and e['image'].dtype == np.uint8 for e in rows)
    images, labels = fixture_data.fashion_like(n, seed=1 if split == 'train' else 2)
    assert sorted(e['label'] for e in rows) == sorted(labels.tolist())
    by_image = {e['image'].tobytes(): e['label'] for e in rows}  # Each image keeps its label.
    assert by_image == {i[:, :, None].tobytes(): int(l) for i, l in zip(images, labels)}


def test_digits_counts_stratified_and_disjoint(prepared):
  train, test = read_all('digits', 'train'), read_all('digits', 'test')
  assert len(train) + len(test) == 1797
  train_ids, test_ids = {e['index'] for e in train}, {e['index'] for e in test}
  assert not train_ids & test_ids and len(train_ids | test_ids) == 1797
  test_labels = np.bincount([e['label'] for e in test], minlength=10)
  assert np.all(np.abs(test_labels - 0.2 * 179.7) <= 2)  # 20% of each class (~180 each).
  assert max(int(e['image'].max()) for e in train) == 16


def test_shakespeare_roles_and_split(prepared):
  train, test = read_all('shakespeare', 'train'), read_all('shakespeare', 'test')
  roles = {e['client_id'].decode() for e in train}
  assert {'MENENIUS', 'First Citizen', 'ROMEO', 'JULIET'} <= roles
  assert not {e['index'] for e in train} & {e['index'] for e in test}
  first = min(train + test, key=lambda e: e['index'])
  assert bytes(first['text']).decode() == ('First Citizen:\n'
                                           'Before we proceed any further, hear me speak.\n')
  per_role = {}
  for e in train + test:
    per_role.setdefault(e['client_id'], []).append(len(e['text']))
  assert min(sum(v) for v in per_role.values()) >= 1000
  held = np.array([e['client_id'] for e in test])
  for role, lengths in per_role.items():
    assert (held == role).sum() == np.floor(0.1 * len(lengths) + 0.5)


def test_stdlib_clients_and_split(prepared):
  train, test = read_all('stdlib', 'train'), read_all('stdlib', 'test')
  clients = {e['client_id'].decode() for e in train}
  assert {'json', 'asyncio', 'email', 'os', 'collections'} <= clients
  paths = [e['path'].decode() for e in train + test]
  assert len(paths) == len(set(paths)) > 500
  assert not any(part in ('test', 'tests', 'idle_test', 'site-packages')
                 for p in paths for part in p.split('/'))
  assert 0.02 < len(test) / len(paths) < 0.1
  decoder = next(e for e in train + test if e['path'] == b'json/decoder.py')
  assert decoder['client_id'] == b'json' and b'class JSONDecoder' in bytes(decoder['text'])


def test_shakespeare_config_is_reproducible(tmp_path, monkeypatch):
  config = shakespeare.shakespeare_config(min_role_chars=5_000, test_fraction=0.25)
  contents = []
  for run in ('a', 'b'):
    monkeypatch.setenv(root.TFDS_DIR_ENV, str(tmp_path / run))
    rows = read_all('shakespeare', 'test', config=config)
    contents.append([(e['index'], e['client_id'], bytes(e['text'])) for e in rows])
  assert contents[0] == contents[1] and len(contents[0]) > 0
  assert len({c for _, c, _ in contents[0]}) < 10  # Few roles speak 5k characters.


@pytest.mark.slow  # Three processes each import tfds and race to prepare Shakespeare.
def test_concurrent_preparation_is_safe(tmp_path, monkeypatch):
  code = ('from paxlike.data import prepared, read_split; '
          "print(len(read_split(prepared('shakespeare'), 'train')))")
  env = {'PATH': '', root.TFDS_DIR_ENV: str(tmp_path), 'HOME': str(tmp_path),
         root.DATA_DIR_ENV: str(root.data_root())}
  monkeypatch.setenv(root.TFDS_DIR_ENV, str(tmp_path))
  variant = pathlib.Path(make_builder('shakespeare').data_dir).parent  # .../shakespeare/default
  stale = variant / 'incomplete.KILLED_1.0.0'
  stale.mkdir(parents=True)
  procs = [subprocess.Popen([sys.executable, '-c', code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=pathlib.Path(root.repo_root()))
           for _ in range(3)]
  outputs = [p.communicate(timeout=120) for p in procs]
  assert [p.returncode for p in procs] == [0, 0, 0], outputs
  assert {out for out, _ in outputs} == {f'{len(load_split("shakespeare", "train"))}\n'.encode()}
  assert sum(err.count(b'prepared shakespeare from local files') for _, err in outputs) == 1
  assert not any(b'Downloading' in err for _, err in outputs)  # The files are local.
  assert not stale.exists()
  assert [p.name for p in variant.iterdir()] == ['1.0.0']


def fake_mnist(folder: pathlib.Path, n_train: int = 30, n_test: int = 7) -> None:
  folder.mkdir(parents=True)
  rng = np.random.default_rng(0)
  for split, n in (('train', n_train), ('test', n_test)):
    images_file, labels_file = idx.FILES[split]
    write_idx(folder / images_file, rng.integers(0, 256, (n, 28, 28)))
    write_idx(folder / labels_file, np.arange(n) % 10)


def test_same_code_reads_mnist_from_a_source_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(root.TFDS_DIR_ENV, str(tmp_path / 'tfds'))
  fake_mnist(tmp_path / 'mnist')
  train = read_all('mnist', 'train', source_dir=tmp_path / 'mnist')
  assert len(train) == 30 and sorted(e['label'] for e in train) == sorted(np.arange(30) % 10)
  assert len(load_split('mnist', 'test', source_dir=tmp_path / 'mnist')) == 7


def test_corrupt_idx_file_is_a_run_failure(tmp_path):
  write_idx(tmp_path / 'x.gz', np.zeros((3, 4)))
  with gzip.open(tmp_path / 'bad.gz', 'wb') as f:
    f.write(b'\x00\x00\x08\x01' + (10).to_bytes(4, 'big') + b'short')
  assert idx.read_idx(tmp_path / 'x.gz').shape == (3, 4)
  with pytest.raises(RunFailure, match='bad.gz'):
    idx.read_idx(tmp_path / 'bad.gz')


@pytest.mark.parametrize('name,missing,hint', [
    ('shakespeare', 'tinyshakespeare/input.txt', 'karpathy/char-rnn'),
    ('fashion_mnist', 'fashion-mnist/train-images-idx3-ubyte.gz', 'zalandoresearch'),
])
def test_missing_source_file_is_a_user_error(tmp_path, monkeypatch, name, missing, hint):
  (tmp_path / 'data').mkdir()
  monkeypatch.setenv(root.DATA_DIR_ENV, str(tmp_path / 'data'))
  monkeypatch.setenv(root.TFDS_DIR_ENV, str(tmp_path / 'tfds'))
  with pytest.raises(UserError) as error:
    load_split(name, 'train')
  message = str(error.value)
  assert missing in message and hint in message and '\n' not in message
  assert f'into {tmp_path / "data" / missing.split("/")[0]}' in message


def test_roots_follow_the_environment(tmp_path, monkeypatch):
  (tmp_path / 'd').mkdir()
  monkeypatch.setenv(root.DATA_DIR_ENV, str(tmp_path / 'd'))
  monkeypatch.setenv(root.TFDS_DIR_ENV, str(tmp_path / 't'))
  assert root.data_root() == tmp_path / 'd' and root.prepared_dir() == tmp_path / 't'
  monkeypatch.delenv(root.DATA_DIR_ENV)
  checkout, shared = tmp_path / 'work' / 'paxlike', tmp_path / 'work' / 'shared' / 'data'
  checkout.mkdir(parents=True)
  (checkout / 'pyproject.toml').touch()
  monkeypatch.setattr(root, 'repo_root', lambda: checkout)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  assert root.data_root() == tmp_path / 'cache' / 'paxlike' / 'data'  # Nothing beside it.
  shared.mkdir(parents=True)
  assert root.data_root() == shared  # ../shared/data beside a checkout.
  (checkout / 'pyproject.toml').unlink()
  assert root.data_root() == tmp_path / 'cache' / 'paxlike' / 'data'  # An installed package.
  with pytest.raises(UserError, match='unknown dataset'):
    make_builder('imagenet')
  assert prepare.DATASETS.keys() >= {'stdlib', 'shakespeare', 'fashion_mnist', 'digits'}


@pytest.mark.parametrize('name', ['shakespeare', 'fashion_mnist', 'mnist'])
def test_a_missing_explicit_data_dir_is_a_user_error_even_when_prepared(prepared, tmp_path,
                                                                         monkeypatch, name):
  monkeypatch.setenv(root.DATA_DIR_ENV, str(tmp_path / 'typo'))
  with pytest.raises(UserError, match=f'data dir {tmp_path / "typo"} .* does not exist'):
    load_split(name, 'train')


def test_cache_dirs_follow_xdg_cache_home(tmp_path, monkeypatch):
  monkeypatch.delenv(root.TFDS_DIR_ENV, raising=False)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert root.prepared_dir() == tmp_path / 'paxlike' / 'tfds'
  assert root.user_cache_dir() / 'data' == tmp_path / 'paxlike' / 'data'


@pytest.mark.parametrize('dataset', ['digits', 'fashion_mnist'])
def test_declared_image_shape_is_the_prepared_one(prepared, dataset):
  """print_config reads the declared shape; training the prepared one."""
  data = ImageData(dataset=dataset)
  assert data.image_shape == data.train.images.shape[1:]


# Every builder class (mnist is fashion_mnist's, from files the suite's data root lacks).
@pytest.mark.parametrize('name', ['digits', 'fashion_mnist', 'shakespeare', 'stdlib'])
def test_a_run_leaves_no_directory_in_the_temp_dir(prepared, tmp_path, monkeypatch, name):
  """What a run asks of a dataset (its source's fingerprint, its declared features, its
  prepared dir) leaves nothing in the temp dir: tfds's own DatasetInfo made an empty one for
  each builder not yet prepared (local_info.py)."""
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(scratch))
  prepare.source_fingerprint(name)
  assert prepare.declared_info(name).features
  assert load_split(name, 'train')
  assert list(scratch.iterdir()) == []
