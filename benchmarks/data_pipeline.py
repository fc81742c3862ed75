"""TextData's pipeline: the token store's build, the loader and memory, against what they serve.

    python -m benchmarks.data_pipeline [--quick] [--only build,loader,steps,packing,rss]

Prints one JSON object (progress on stderr):
- `build` (benchmarks/data_build.py): for a SentencePiece and a Hugging Face BPE tokenizer
  (vocab 2000 each, trained on Tiny Shakespeare), over `build_copies` copies of it (a file each,
  a document per line), the store build's tokens/s against the library's own batch encode of
  the same lines, in one process and in `workers` processes; `overhead` is the library rate
  over the store rate, less 1 (goal <= 0.10). Alternating repeats, medians and best repeats.
- `loader`: round_batches at the StdlibTiny shape (seq 128 x 16) and the Llama125M shape (seq
  2048 x 32) over that store: called in a loop (`direct`: what the trainer's one prefetch
  thread, paxlike.data.prefetch, can produce), and through a grain MapDataset with
  `mp_prefetch` worker processes (`grain`, start-up excluded); tokens per second.
- `steps`: tokens per second a train step consumes: StdlibTiny's model (float32) timed here,
  Llama125M's estimated from a 1- and a 2-layer model of its width here (per-token cost: the
  rest + 12 layers; seq 512), and on an H200 at 40% MFU from its FLOPs per token (6N + 12LdT).
- `packing`: packing_efficiency on Tiny Shakespeare at seq 512, by line and by paragraph.
- `rss`: RssAnon (MiB) of a process iterating TextData batches (seq 512 x 16) over a store of
  each size (written from synthetic token arrays through token_store.Writer, its packing plan
  computed beforehand in `plan_s` seconds, as by a first run), and the difference.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common
from benchmarks import data_build

SECTIONS = ('build', 'loader', 'steps', 'packing', 'rss')
H200_BF16_FLOPS, MFU = 989e12, 0.4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--only', default=','.join(SECTIONS), help='comma-separated sections')
  parser.add_argument('--rss_mb', default=None, help='store sizes for rss (default 20,2000)')
  parser.add_argument('--rss_child', nargs=2, metavar=('FILES', 'STEPS'), help=argparse.SUPPRESS)
  parser.add_argument('--build_copies', type=int, default=None,
                      help='copies of Tiny Shakespeare the build section encodes (default 8)')
  parser.add_argument('--build_kinds', default='sentencepiece,bpe', help='tokenizers to build with')
  args = parser.parse_args(argv)
  args.copies, copies, args.repeats, args.build_repeats = (
      (1, 1, 1, 1) if args.quick else (48, 8, 3, 9))
  args.build_copies = args.build_copies or copies
  args.rss_mb = [float(x) for x in (args.rss_mb or ('2,20' if args.quick else '20,2000')
                                    ).split(',')]
  return args


def shakespeare() -> Path:
  """Tiny Shakespeare's input.txt in the data root (paxlike.data.root: $PAXLIKE_DATA_DIR, else
  ../shared/data beside the checkout, else the user cache)."""
  from paxlike.data import root
  return root.require_file(root.data_root() / 'tinyshakespeare' / 'input.txt', 'tinyshakespeare')


def make_corpus(directory: Path, copies: int) -> tuple[str, list[str], dict[str, Path]]:
  """(files glob, every non-blank line, kind -> tokenizer file): `copies` copies of Tiny
  Shakespeare in `directory`, a SentencePiece model and a Hugging Face BPE trained on it (as
  python -m paxlike.tokenizers train does) in its sibling sp/ and bpe/."""
  from paxlike.tokenizers import train
  text = shakespeare().read_text()
  directory.mkdir()
  for i in range(copies):
    shutil.copy(shakespeare(), directory / f'part{i:03d}.txt')
  tokenizers = {}
  for kind, name in (('sentencepiece', 'sp'), ('bpe', 'bpe')):
    out = directory.parent / name
    tokenizers[kind] = (out / train.FILE_NAMES[kind] if out.is_dir() else
                        train.write_tokenizer(kind, [text], 2000, out))
  lines = [line for line in text.splitlines() if line.strip()] * copies
  return str(directory / '*.txt'), lines, tokenizers


def round_batch(data, seed: int, step: int) -> dict:
  return data.round_batches(seed, step)[0]


def close_promptly(iterator) -> None:
  """`iterator.close()` of a grain mp_prefetch iterator, waiting at most a second for its worker.

  grain 0.2's close clears the batch queue, then joins the worker for up to 25 s before killing
  it; a worker whose queue feeder still holds a batch larger than a pipe's buffer (the
  llama125m rows here) cannot exit until that batch is read, and more than half of the quick
  runs waited the whole 25 s. Nothing the worker holds is needed once the rates are taken (the
  batch it still held is unlinked at exit by multiprocessing's resource tracker, which warns
  that it does)."""
  from grain._src.python.dataset.transformations import process_prefetch
  timeout = process_prefetch._PROCESS_KILL_TIMEOUT_S  # pylint: disable=protected-access
  process_prefetch._PROCESS_KILL_TIMEOUT_S = 1  # pylint: disable=protected-access
  try:
    iterator.close()
  finally:
    process_prefetch._PROCESS_KILL_TIMEOUT_S = timeout  # pylint: disable=protected-access


def loader_rates(args, files: str, tokenizer_dir: str) -> dict:
  """round_batches per second, called in a loop and through grain's mp_prefetch, in
  alternating windows of `steps` batches (the grain iterator started once, beforehand)."""
  import dataclasses
  import grain
  from absl import flags
  from paxlike.data import TextData
  from paxlike.data.text_files import Fields
  flags.FLAGS.mark_as_parsed()  # grain's workers read absl flags (paxlike.main parses them).
  base = TextData(files=files, fields=Fields(txt_document='line'), tokenizer=tokenizer_dir)
  out = {}
  for name, seq, batch in (('stdlib_tiny', 128, 16), ('llama125m', 2048, 32)):
    data = dataclasses.replace(base, seq_len=seq, batch_size=batch)
    data.round_batches(0, 0)  # Builds the plan.
    steps = 10 if args.quick else (300 if seq == 128 else 40)
    workers = 1 if args.quick else min(os.cpu_count() or 1, 4)
    dataset = grain.MapDataset.range(10**9).map(functools.partial(round_batch, data, 0))
    iterator = iter(dataset.to_iter_dataset().mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers)))
    next(iterator)  # Start-up (spawning, imports, opening the store) excluded.
    counter = iter(range(10**9))

    def window(fetch) -> float:
      start = time.perf_counter()
      for _ in range(steps):
        fetch()
      return steps / (time.perf_counter() - start)

    rates = common.alternate({'direct': lambda: window(lambda: round_batch(data, 0, next(counter))),
                              'grain': lambda: window(lambda: next(iterator))}, args.repeats)
    close_promptly(iterator)
    direct, pooled = common.median(rates['direct']), common.median(rates['grain'])
    tokens = seq * batch
    out[name] = {'seq_len': seq, 'batch_size': batch, 'direct_batches_per_sec': direct,
                 'direct_tokens_per_sec': direct * tokens, 'grain_workers': workers,
                 'grain_batches_per_sec': pooled, 'grain_tokens_per_sec': pooled * tokens}
    common.log(f'loader {name}: direct {direct:.1f}/s, grain {pooled:.1f}/s')
  return out


def step_seconds(model_cfg, batch: int, seq: int, steps: int) -> float:
  """Seconds per jitted AdamW train step of `model_cfg` on [batch, seq] tokens."""
  import fiddle as fdl
  import jax
  import jax.numpy as jnp
  import optax
  model = fdl.build(model_cfg)
  x = jnp.zeros((batch, seq), jnp.int32)
  params = model.init(jax.random.key(0), x)['params']
  opt = optax.adamw(1e-3)

  @jax.jit
  def step(params, state, x):
    loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
        model.apply({'params': p}, x), x).mean()
    updates, state = opt.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  carry = [jax.block_until_ready(step(params, opt.init(params), x))]

  def one_step():
    carry[0] = step(*carry[0], x)
    return carry[0]

  return common.timed_loop(one_step, steps) / steps


def step_rates(args) -> dict:
  import jax.numpy as jnp
  from paxlike.configs import models
  tiny = step_seconds(models.lm_tiny(), 16, 128, 5 if args.quick else 30)
  seq = 32 if args.quick else 512
  layer_times = []
  for layers in (1, 2):
    cfg = models.lm_125m()
    cfg.num_layers, cfg.dtype, cfg.max_len, cfg.scan_layers = layers, jnp.float32, seq, False
    if args.quick:  # The code path only: a narrow model.
      cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.vocab_size = 64, 2, 128, 512
    layer_times.append(step_seconds(cfg, 1, seq, 2 if args.quick else 3))
  per_layer = max(layer_times[1] - layer_times[0], 1e-9)
  per_token = (layer_times[0] - per_layer + 12 * per_layer) / seq
  n, layers, width = 134_105_856, 12, 768
  flops_per_token = 6 * n + 12 * layers * width * 2048
  return {'stdlib_tiny_cpu_tokens_per_sec': 16 * 128 / tiny,
          'llama125m_cpu_estimate_tokens_per_sec': 1 / per_token,
          'llama125m_h200_40pct_mfu_tokens_per_sec': H200_BF16_FLOPS * MFU / flops_per_token}


def packing_efficiency(tokenizer_dir: str) -> dict:
  from paxlike.data import TextData
  from paxlike.data.text_files import Fields
  out = {}
  for tokenizer in ('bytes', tokenizer_dir):
    for doc in ('line', 'paragraph'):
      data = TextData(files=str(shakespeare()), fields=Fields(txt_document=doc), tokenizer=tokenizer,
                      seq_len=512)
      kind = 'bytes' if tokenizer == 'bytes' else 'sentencepiece'
      out[f'{kind}_{doc}'] = data.describe()['packing_efficiency']
  return out


def synthetic_store(files: str, num_tokens: int, doc_tokens: int = 1000) -> None:
  """Writes a store of `num_tokens` tokens (zeros, documents of `doc_tokens`, random hashes:
  about 1% held out) through token_store.Writer, under the key TextData(files=files) looks
  for, so TextData opens it as those files' store without tokenizing anything."""
  import numpy as np
  from paxlike.data import text_files, token_build, token_store
  from paxlike.tokenizers import load_tokenizer
  named, fields, tok = text_files.expand(files), text_files.Fields(), load_tokenizer('bytes')
  key = token_store.store_key(named, fields, tok)
  final = token_store.token_dir() / key[:32]
  tmp = final.with_name(final.name + '.writing')
  tmp.mkdir(parents=True)
  writer = token_store.Writer(tmp, token_store.token_dtype(tok.vocab_size))
  rng, docs = np.random.default_rng(0), num_tokens // doc_tokens
  per_chunk = (32 << 20) // doc_tokens
  for first in range(0, docs, per_chunk):
    n = min(per_chunk, docs - first)
    encoded = token_build.Encoded(np.zeros(n * doc_tokens, np.uint16),
                                  np.full(n, doc_tokens, np.int64),
                                  rng.integers(0, 2**64, n, dtype=np.uint64), np.zeros(n, np.int32))
    writer.add(encoded, np.zeros(n, np.int32), np.zeros(n, np.int32))
  (tmp / 'clients.json').write_text('[]\n')
  writer.finish(token_store.base_manifest(key, named, fields, tok))
  os.replace(tmp, final)


def rss_anon_mb() -> float:
  """This process's anonymous resident memory (not file-backed pages such as memory maps)."""
  for line in Path('/proc/self/status').read_text().splitlines():
    if line.startswith('RssAnon:'):
      return int(line.split()[1]) / 1024
  raise RuntimeError('no RssAnon in /proc/self/status')


def rss_child(files: str, steps: str) -> dict:
  """(In a child process) RssAnon after `steps` training batches and the eval batches."""
  from paxlike.data import TextData
  from paxlike.data.text_files import Fields
  data = TextData(files=files, seq_len=512, batch_size=16)
  for step in range(int(steps)):
    data.round_batches(0, step)
  data.eval_batches()
  return {'rss_anon_mb': rss_anon_mb(), 'store_mb': data.store.manifest['num_tokens'] * 2 / 2**20}


def rss_by_size(args) -> dict:
  from paxlike.data import TextData, token_store
  out = {}
  for size in args.rss_mb:
    root = Path(tempfile.mkdtemp(dir=args.tmp))
    env = common.child_env(1, **{token_store.TOKEN_DIR_ENV: str(root / 'tokens')})
    (root / 'tiny.txt').write_text('a corpus whose store is synthetic\n')
    os.environ[token_store.TOKEN_DIR_ENV] = str(root / 'tokens')
    synthetic_store(str(root / 'tiny.txt'), int(size * 2**20 / 2))
    start = time.perf_counter()
    TextData(files=str(root / 'tiny.txt'), seq_len=512).round_batches(0, 0)  # Caches the plan.
    plan_s = time.perf_counter() - start
    child = common.rerun(__spec__, '--rss_child', str(root / 'tiny.txt'),
                         '20' if args.quick else '200')
    measured = common.run_child(child, env)
    out[f'{size:g}'] = {'store_mb': round(measured['store_mb'], 1),
                        'rss_anon_mb': round(measured['rss_anon_mb'], 1), 'plan_s': plan_s}
    shutil.rmtree(root)
  sizes = [f'{s:g}' for s in args.rss_mb]
  out['difference_mb'] = out[sizes[-1]]['rss_anon_mb'] - out[sizes[0]]['rss_anon_mb']
  return out


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.rss_child:
    common.emit(rss_child(*args.rss_child))
    return
  sections = args.only.split(',')
  result = {'benchmark': 'data_pipeline', 'quick': args.quick, **common.machine()}
  with tempfile.TemporaryDirectory() as tmp:
    args.tmp = tmp
    os.environ['PAXLIKE_TOKEN_DIR'] = str(Path(tmp) / 'tokens')
    corpus = functools.cache(lambda: make_corpus(Path(tmp) / 'corpus', args.copies))
    files = lambda: corpus()[0]
    sp = lambda: str(corpus()[2]['sentencepiece'].parent)
    # Made for the first section that reads it, not at all for `--only steps,rss` (the
    # tokenizers are trained by the first make_corpus; the build's copies share them).
    runs = {'build': lambda: data_build.build_rates(
                args, *make_corpus(Path(tmp) / 'build', args.build_copies)),
            'loader': lambda: loader_rates(args, files(), sp()), 'steps': lambda: step_rates(args),
            'packing': lambda: packing_efficiency(sp()), 'rss': lambda: rss_by_size(args)}
    for section in sections:
      start = time.perf_counter()
      result[section] = runs[section]()
      common.log(f'{section}: {time.perf_counter() - start:.1f} s')
  common.emit(result)


if __name__ == '__main__':
  main()
