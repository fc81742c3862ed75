"""The `build` section of benchmarks/data_pipeline.py: the token store's build against the
tokenizer library's own batch encode of the same documents, in the same run and the same
process count. Not a benchmark itself (running it prints nothing).

For each tokenizer kind (a SentencePiece BPE `tokenizer.model` and a Hugging Face byte-level
BPE `tokenizer.json`, vocab 2000 each, trained on Tiny Shakespeare), over the same files (a
document per non-blank line):
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
`cpu_overhead` against the library's.

Instructions, which no load moves (valgrind --tool=callgrind, one copy, the store built in this
thread against the library's encode less a run that only loads): the build executed 19% more
than SentencePiece's encode (half of it np.fromiter turning its lists of ints into an array),
10% more than HF's encode_batch_fast and 13% fewer than its encode_batch; before the per-document
work went (blake2b, an array per document), 56% and 48% more. Two encoder threads (each
calling the library on one core) change when this work runs, not how much of it there is.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import shutil
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
