"""tfds builder: Tiny Shakespeare split into speeches, one client per speaking role (LEAF/TFF)."""

import collections
import dataclasses
import pathlib
import re

import numpy as np
import tensorflow_datasets as tfds

from paxlike.data import local_info
from paxlike.data import root
from paxlike.data import split

_HEADER = re.compile(r'^([^\n:][^\n]*):$')


@dataclasses.dataclass
class ShakespeareConfig(tfds.core.BuilderConfig):
  """Roles with fewer than `min_role_chars` characters are dropped; `test_fraction` of each
  remaining role's speeches (chosen by hash) is the test split."""
  min_role_chars: int = 1000
  test_fraction: float = 0.1


def shakespeare_config(min_role_chars: int = 1000, test_fraction: float = 0.1) -> ShakespeareConfig:
  """A config whose name encodes its fields ('default' for the defaults)."""
  if (min_role_chars, test_fraction) == (1000, 0.1):
    return ShakespeareConfig(name='default')
  name = f'min{min_role_chars}_test{round(test_fraction * 1000):04d}'
  return ShakespeareConfig(name=name, min_role_chars=min_role_chars, test_fraction=test_fraction)


def parse_speeches(text: str) -> list[tuple[str, str]]:
  """(role, speech) pairs; a speech is a `ROLE:` line plus the lines up to the next blank line.

  Each speech keeps its header and ends with a newline. Paragraphs without a header or without
  any spoken line (a bare `ROLE:` in the source) are skipped.
  """
  speeches = []
  for para in re.split(r'\n\s*\n', text):
    lines = para.strip('\n').split('\n')
    match = _HEADER.match(lines[0])
    if match and len(lines) > 1:
      speeches.append((match.group(1).strip(), '\n'.join(lines) + '\n'))
  return speeches


def role_sizes(speeches: list[tuple[str, str]]) -> dict[str, int]:
  """Characters spoken per role, headers included."""
  sizes: dict[str, int] = collections.Counter()
  for role, speech in speeches:
    sizes[role] += len(speech)
  return dict(sizes)


class Shakespeare(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Speeches of Tiny Shakespeare with `client_id` = role; source is `input.txt`."""

  name = 'shakespeare'
  VERSION = tfds.core.Version('1.0.0')
  # No url checksums file; also keeps tfds from importing the optional importlib_resources.
  code_path = None
  RELEASE_NOTES = {'1.0.0': 'Speeches by role, per-role hashed held-out fraction.'}
  BUILDER_CONFIGS = [shakespeare_config()]

  def __init__(self, *, source_file: str | pathlib.Path | None = None, **kwargs):
    self.source_file = (pathlib.Path(source_file) if source_file
                        else root.data_root() / 'tinyshakespeare' / 'input.txt')
    super().__init__(**kwargs)

  def source_location(self) -> pathlib.Path:
    return self.source_file

  def source_files(self) -> dict[str, pathlib.Path]:
    """The file the dataset is built from (its fingerprint keys the prepared data)."""
    return {'input.txt': root.require_file(self.source_file, 'tinyshakespeare')}

  def _info(self) -> tfds.core.DatasetInfo:
    cfg = self.builder_config
    return local_info.LocalDatasetInfo(
        builder=self,
        description=(f'Tiny Shakespeare speeches by role; roles under {cfg.min_role_chars} '
                     f'chars dropped; {cfg.test_fraction:g} of each role held out.'),
        features=tfds.features.FeaturesDict({
            'text': tfds.features.Tensor(shape=(None,), dtype=np.uint8),
            'client_id': tfds.features.Text(),
            'index': tfds.features.Scalar(dtype=np.int64),  # Speech number in the source.
        }),
        homepage='https://github.com/karpathy/char-rnn',
    )

  def _split_generators(self, dl_manager):
    cfg = self.builder_config
    path = self.source_files()['input.txt']
    speeches = parse_speeches(path.read_text(encoding='utf-8'))
    sizes = role_sizes(speeches)
    kept = [(i, r, s) for i, (r, s) in enumerate(speeches) if sizes[r] >= cfg.min_role_chars]
    keys = [f'{i:05d}' for i, _, _ in kept]
    test = split.holdout_per_group(keys, [r for _, r, _ in kept], cfg.test_fraction)
    return {
        'train': self._generate_examples([k for k, t in zip(kept, test) if not t]),
        'test': self._generate_examples([k for k, t in zip(kept, test) if t]),
    }

  def _generate_examples(self, speeches: list[tuple[int, str, str]]):
    for i, role, speech in speeches:
      yield i, {'text': np.frombuffer(speech.encode('utf-8'), np.uint8), 'client_id': role,
                'index': i}
