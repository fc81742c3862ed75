"""The token store's costs: its build against the tokenizer library's own batch encode (the
`build` section of benchmarks/data_pipeline.py), and the data start-up of a run whose store
exists (run directly).

    python -m benchmarks.data_build [--quick] [--corpus_mb 1024] [--repeats 5]

Start-up (this file run directly; one JSON line): a corpus of `corpus_mb` MB of text in 16
files whose store exists (written through token_store.Writer under the key TextData looks
for, after the one full hash a build makes), then `repeats` fresh processes each timing
`TextData(files=...).store` (imports not counted): `startup_s`, the median, with the bytes
the start read (`startup_read_mb`, /proc/self/io rchar: the corpus, the store's manifest and
anything else) and whether it opened a corpus file; `verify_s` and `verify_read_mb` the same
under --verify_data ($PAXLIKE_VERIFY_DATA=1), which re-reads every corpus file. The corpus is
in the page cache (written just before); its files' times are set an hour back, as a corpus
at rest has them, and it is first hashed file_hashes.RACY_NS after it was written. `--quick`: 4 MB, one repeat (for the test suite).

Build (`build_rates`): for each tokenizer kind (a SentencePiece BPE `tokenizer.model` and a
Hugging Face byte-level BPE `tokenizer.json`, vocab 2000 each, trained on Tiny Shakespeare),
over the same files (a document per non-blank line):
- `library`: the library's batch encode of every line, already in memory (reading is not
  counted), BATCH lines per call (SentencePiece `encode(list, out_type=int)`, and
  `library_numpy`: its arrays, `return_type='numpy'`; Hugging Face `encode_batch`,
  `library_fast`: `encode_batch_fast`, which skips the offsets, and `library_ids`: that and
  each Encoding's `.ids`, the lists a caller reads the ids from). Both libraries use every core
  from one process (their own thread pools); the store's overhead is taken against the fastest.
- `library_processes`: the same, split into `workers` contiguous shares encoded at once by
  `workers` spawned processes that hold the lines already (their start-up not counted).
- `store`: token_store.build in this process (read, encode, hash, write) as TextData runs it,
  with `workers` encoder threads calling the library on cores // workers threads each (see
  paxlike/data/token_build.py); `store_one_encoder`: one encoder thread, the library on every
  core; `store_processes`: `workers` spawned processes (their start-up counted).
Every run is repeated `build_repeats` times in alternating order (common.alternate); rates are
given as the median and the best repeat (the one least slowed by the machine's other load).
`overhead_median` / `overhead_best` (library rate over store rate, less 1) compare `store` with
the best library run in one process ('1'; HF's `library_ids` alone: 'ids'), the two runs of
`workers` processes, and the best of each overall ('any'); `overhead_paired`: the median
over repeats of each repeat's overheads (a repeat's runs are back to back, so load drifting
between repeats falls on both sides of each ratio). `cpu_s`: this process's CPU seconds (all
its threads) in the in-process runs, which other load moves less than wall time;
`cpu_overhead` against the library's. Measured numbers: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks import common

BATCH = 1 << 16  # Lines per library call.

_LIBRARY: dict[str, Any] = {}  # In a library_processes worker: its encoder and the lines.


def library_encoder(kind: str, path: Path, fast: bool = False) -> Callable[[list[str]], Any]:
  """The library's own batch encode of a list of lines, as a user of the library calls it
  (`fast`: HF encode_batch_fast, SentencePiece's numpy output)."""
  if kind == 'sentencepiece':
    import sentencepiece as spm
    processor = spm.SentencePieceProcessor(model_file=str(path))
    if fast:
      return lambda lines: processor.encode(lines, return_type='numpy')
    return lambda lines: processor.encode(lines, out_type=int)
  import tokenizers
  tok = tokenizers.Tokenizer.from_file(str(path))
  encode = tok.encode_batch_fast if fast else tok.encode_batch
  return lambda lines: encode(lines, add_special_tokens=False)


def hf_ids_encoder(path: Path) -> Callable[[list[str]], list[list[int]]]:
  """Hugging Face's encode_batch_fast and each Encoding's ids: what a caller gets ids by."""
  encode = library_encoder('bpe', path, fast=True)
  return lambda lines: [encoding.ids for encoding in encode(lines)]


def encode_all(encode: Callable[[list[str]], Any], lines: list[str]) -> None:
  for start in range(0, len(lines), BATCH):
    encode(lines[start:start + BATCH])


def _init_library(kind: str, path: Path, fast: bool, lines: list[str]) -> None:
  _LIBRARY.update(encode=library_encoder(kind, path, fast), lines=lines)


def _encode_share(share: int, shares: int) -> int:
  lines = _LIBRARY['lines']
  size = -(-len(lines) // shares)
  encode_all(_LIBRARY['encode'], lines[share * size:(share + 1) * size])
  return share


class LibraryPool:
  """`workers` spawned processes holding the lines, encoding their shares on each `run()`."""

  def __init__(self, kind: str, path: Path, fast: bool, lines: list[str], workers: int):
    self.workers = workers
    self.pool = concurrent.futures.ProcessPoolExecutor(
        workers, multiprocessing.get_context('spawn'), _init_library, (kind, path, fast, lines))
    list(self.pool.map(time.sleep, [0.5] * workers))  # Every worker started.

  def run(self) -> None:
    list(self.pool.map(_encode_share, range(self.workers), [self.workers] * self.workers))

  def close(self) -> None:
    self.pool.shutdown()


def timed(tokens: int, fn: Callable[[], Any], cpu: dict[str, list[float]], name: str) -> float:
  """Tokens per second of `fn()`; its CPU seconds in this process appended to cpu[name]."""
  start, start_cpu = time.perf_counter(), time.process_time()
  fn()
  cpu.setdefault(name, []).append(time.process_time() - start_cpu)
  return tokens / (time.perf_counter() - start)


def kind_rates(args, kind: str, files: str, lines: list[str], path: Path) -> dict:
  """One tokenizer kind's runs (see the module docstring); `path` its tokenizer file."""
  from paxlike.data import text_files, token_build, token_store
  from paxlike.tokenizers import load_tokenizer
  tok, named = load_tokenizer(path), text_files.expand(files)
  fields, workers = text_files.Fields(txt_document='line'), os.cpu_count() or 1
  library = library_encoder(kind, path)
  tokens = sum(map(len, (ids for s in range(0, len(lines), BATCH)
                         for ids in tok.encode_batch(lines[s:s + BATCH]))))
  cpu: dict[str, list[float]] = {}

  def store(num_workers: int, pool_min_bytes: int) -> None:
    out = Path(tempfile.mkdtemp(dir=args.tmp))
    defaults = token_build.POOL_MIN_BYTES, token_build.PROCESS_MIN_WORKERS
    token_build.POOL_MIN_BYTES, token_build.PROCESS_MIN_WORKERS = pool_min_bytes, 2
    try:
      token_store.build(out, named, fields, tok, num_workers, 'k')
    finally:
      token_build.POOL_MIN_BYTES, token_build.PROCESS_MIN_WORKERS = defaults
      shutil.rmtree(out)

  runs = {'library': library}
  runs['library_numpy' if kind == 'sentencepiece' else 'library_fast'] = library_encoder(
      kind, path, fast=True)
  if kind == 'bpe':
    runs['library_ids'] = hf_ids_encoder(path)
  runs = {name: (lambda e=encode: encode_all(e, lines)) for name, encode in runs.items()}
  runs['store'] = lambda: store(workers, 1 << 62)
  if workers > 1:
    runs['store_one_encoder'] = lambda: store(1, 1 << 62)
  timed_runs = lambda named: {name: (lambda n=name, f=fn: timed(tokens, f, cpu, n))
                              for name, fn in named.items()}
  values = common.alternate(timed_runs(runs), args.build_repeats)
  if workers > 1:  # Apart, so that the library's idle pool is not beside the runs above.
    pool = LibraryPool(kind, path, kind == 'bpe', lines, workers)  # The faster form each.
    try:
      values.update(common.alternate(timed_runs({
          'store_processes': lambda: store(workers, 0), 'library_processes': pool.run}),
          args.build_repeats))
    finally:
      pool.close()
  return summary(values, cpu, tokens, workers)


def summary(values: dict[str, list[float]], cpu: dict[str, list[float]], tokens: int,
            workers: int) -> dict:
  """Rates (median and best repeat), the overheads and the spreads of one kind's runs."""
  out: dict[str, Any] = {'tokens': tokens, 'workers': workers}
  for stat, pick in (('median', common.median), ('best', max)):
    rates = {name: pick(v) for name, v in values.items()}
    out[f'{stat}_tokens_per_sec'] = {name: round(rate) for name, rate in rates.items()}
    out[f'overhead_{stat}'] = overheads(rates, workers)
  repeats = [overheads({name: v[r] for name, v in values.items()}, workers)
             for r in range(min(map(len, values.values())))]
  out['overhead_paired'] = {key: round(common.median([o[key] for o in repeats]), 4)
                            for key in repeats[0]}
  out['cpu_s'] = {name: round(common.median(v), 3) for name, v in cpu.items()
                  if not name.endswith('processes')}
  library_cpu = min(v for n, v in out['cpu_s'].items() if n.startswith('library'))
  out['cpu_overhead'] = {n: round(s / library_cpu - 1, 3) for n, s in out['cpu_s'].items()
                         if n.startswith('store')}
  out['spread'] = {name: round(common.spread(v), 3) for name, v in values.items()}
  return out


def overheads(rates: dict[str, float], workers: int) -> dict[str, float]:
  """Library rate over store rate, less 1: the best library run in one process against
  `store` ('1'; HF's library_ids: 'ids'), the two in `workers` processes, and the best of
  each overall ('any')."""
  best = lambda prefix, names: max(rates[n] for n in names if n.startswith(prefix))
  one = [n for n in rates if not n.endswith('processes')]
  out = {'1': best('library', one) / rates['store'] - 1}
  if 'library_ids' in rates:
    out['ids'] = rates['library_ids'] / rates['store'] - 1
  if 'store_processes' in rates:
    out[str(workers)] = rates['library_processes'] / rates['store_processes'] - 1
  out['any'] = best('library', rates) / best('store', rates) - 1
  return {k: round(v, 4) for k, v in out.items()}


def build_rates(args, files: str, lines: list[str], tokenizers: dict[str, Path]) -> dict:
  """Every kind's runs (`tokenizers`: kind -> tokenizer file), with the corpus's size."""
  from paxlike.data import text_files
  size = sum(p.stat().st_size for p in text_files.expand(files).values())
  out: dict[str, Any] = {'copies': args.build_copies, 'documents': len(lines),
                         'corpus_mb': round(size / 2**20, 2)}
  for kind in args.build_kinds.split(','):
    out[kind] = kind_rates(args, kind, files, lines, tokenizers[kind])
    common.log(f'build {kind}: overhead {out[kind]["overhead_median"]} (medians), '
               f'{out[kind]["overhead_best"]} (best repeats)')
  return out


START_FILES = 16  # The start-up corpus's files.


def write_corpus(directory: Path, megabytes: float) -> str:
  """A glob of START_FILES .txt files of random lowercase lines, `megabytes` MB in all, their
  times an hour back (a corpus at rest)."""
  import numpy as np
  directory.mkdir(parents=True)
  rng, size = np.random.default_rng(0), int(megabytes * 2**20) // START_FILES
  old = time.time() - 3600
  for i in range(START_FILES):
    text = rng.integers(ord('a'), ord('z') + 1, size, dtype=np.uint8)
    text[79::80] = ord('\n')
    path = directory / f'part{i:03d}.txt'
    path.write_bytes(text.tobytes())
    os.utime(path, (old, old))
  return str(directory / '*.txt')


def startup_child(files: str) -> dict[str, Any]:
  """(In a fresh process) seconds and bytes read of TextData's start on `files`' existing store,
  and whether it opened a corpus file."""
  from paxlike.data import TextData, text_files
  corpus = {str(p) for p in text_files.expand(files).values()}
  opened = []
  sys.addaudithook(lambda event, args: opened.append(1) if event == 'open' and isinstance(
      args[0], (str, Path)) and str(args[0]) in corpus else None)
  data = TextData(files=files, fields=text_files.Fields(txt_document='file'))
  read_before, start = read_bytes(), time.perf_counter()
  store = data.store
  seconds = time.perf_counter() - start
  return {'seconds': seconds, 'read_mb': (read_bytes() - read_before) / 2**20,
          'opened_corpus': bool(opened), 'store': str(store.path)}


def read_bytes() -> int:
  """The bytes this process has read so far (/proc/self/io rchar, page cache included)."""
  for line in Path('/proc/self/io').read_text().splitlines():
    if line.startswith('rchar:'):
      return int(line.split()[1])
  raise RuntimeError('no rchar in /proc/self/io')


def startup(args) -> dict[str, Any]:
  """The start-up figure (see the module docstring) in `args.tmp`."""
  from benchmarks import data_pipeline
  from paxlike.data import file_hashes, token_store
  files = write_corpus(Path(args.tmp) / 'corpus', args.corpus_mb)
  time.sleep(file_hashes.RACY_NS / 1e9)  # Hashed in a later timestamp tick than written.
  tokens = str(Path(args.tmp) / 'tokens')
  os.environ[token_store.TOKEN_DIR_ENV] = tokens
  start = time.perf_counter()
  data_pipeline.synthetic_store(files, 100_000)
  first_s = time.perf_counter() - start
  env = common.child_env(1, **{token_store.TOKEN_DIR_ENV: tokens})
  runs: dict[str, list[dict]] = {'startup': [], 'verify': []}

  def child(name: str, extra: dict[str, str]) -> float:
    runs[name].append(common.run_child(common.rerun(__spec__, '--startup_child', files),
                                       {**env, **extra}))
    return runs[name][-1]['seconds']

  common.alternate({'startup': lambda: child('startup', {}),
                    'verify': lambda: child('verify', {token_store.VERIFY_ENV: '1'})},
                   args.repeats)
  out = {'benchmark': 'data_startup', 'quick': args.quick, **common.machine(),
         'corpus_mb': args.corpus_mb, 'files': START_FILES, 'repeats': args.repeats,
         'first_open_s': round(first_s, 3), 'goal_s': 1.0}
  for name, rows in runs.items():
    out[f'{name}_s'] = round(common.median([r['seconds'] for r in rows]), 4)
    out[f'{name}_read_mb'] = round(common.median([r['read_mb'] for r in rows]), 3)
    out[f'{name}_opened_corpus'] = any(r['opened_corpus'] for r in rows)
  out['same_store'] = len({r['store'] for rows in runs.values() for r in rows}) == 1
  return out


def main(argv: list[str] | None = None) -> None:
  parser = common.parser('The data start-up with an existing store.', 'a 4 MB corpus, one repeat')
  parser.add_argument('--corpus_mb', type=float, default=None, help='corpus size (1024)')
  parser.add_argument('--repeats', type=int, default=None, help='fresh processes each (5)')
  parser.add_argument('--startup_child', metavar='FILES', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.startup_child:
    common.emit(startup_child(args.startup_child))
    return
  args.corpus_mb = args.corpus_mb or (4 if args.quick else 1024)
  args.repeats = args.repeats or (1 if args.quick else 5)
  with tempfile.TemporaryDirectory() as tmp:
    args.tmp = tmp
    common.emit(startup(args))


if __name__ == '__main__':
  main()
