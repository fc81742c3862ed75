"""Tokens/s and time to first token of the KV-cache decoder and of the full-recompute reference.

    python -m benchmarks.decode [--new_tokens 256] [--prompt_len 32] [--repeats 3] [--quick]
    python -m benchmarks.decode --family gemma2   (or all: every dense family)

Models: `lm.StdlibTiny`'s (paxlike/configs/models.py lm_tiny; its rope lets the cache outgrow
max_len 128) and a 4-layer d256 Llama (vocab 256, d_ff 688, max_len 288), random float32 weights, at
batch 1 and 8, greedy. The KV-cache decoder is `paxlike.decode.generate`'s (prefill, then a
jitted while loop per cache size); the reference is what `--mode=decode` did before it: one
jitted forward pass over a fixed `max_len` window per token, from a Python loop. Its cost per
token does not depend on the position (the window is always full size), so it is timed over
`--reference_tokens` tokens. `same_tokens` says whether both made the same greedy tokens over
the reference's tokens. Medians (and the best) over repeats; the first (compiling) call is not
timed. tokens/s counts every new token of the batch over the whole time, prefill included.

`--presets 350m,1b` instead times the KV-cache decoder (greedy, random weights cast to the
model's compute dtype, bf16 for the presets, as a server holds them) of paxlike/configs/models.py's
lm_350m and lm_1b at each of `--batches`, against the HBM roofline: one decode step reads
every parameter and the whole KV cache once, so the roofline is batch × bandwidth / (parameter
bytes + cache bytes); at batch 1 it is ~bandwidth / parameter bytes (v5e: 819 GB/s). Reports
tokens/s (decode steps only: new tokens after the first over the time after it), the fraction of
the roofline, and the first token's latency (prefill of the prompt, `ttft_ms`). The bandwidth
comes from the device kind (paxlike.trainer.throughput's HBM_BYTES_PER_SEC, beside its FLOPs peak);
unknown (CPU) leaves the fraction null. `--quick` shrinks the presets to 2 layers of d 128
(heads of 64).
`--quantizations none,int8,nf4` times each weight-only quantized base (`model.base_quantization`:
the same weights stored int8 or NF4, dequantized in the matmuls; embeddings and norms as they
are) with its own roofline over its own stored bytes, and its tokens/s over the bf16 model's
(`vs_none`). Rows sit under the preset, then the kind: `out['1b']['int8']['batch_32']`.
`--layouts` (default unrolled, as a scanned stack decodes by default) times each kind decoded
as each of: `scan` (one stacked cache, which
the layer scan takes in and gives out whole every token), `loop` (`model.decode_layers='loop'`:
a loop over the layers, params sliced from the stack in the program, a cache per layer),
`unrolled` (the params split per layer beforehand, `scan_layers=False`); rows of a layout other
than the first under `KIND_LAYOUT`, with `vs_none` over the first layout's bf16 model.

`--family NAME` instead times batch-1 greedy KV-cache decoding of that Hugging Face family's
model (`paxlike.interop`, built from a config.json of the Llama's size: 4 layers, d 256, 4
heads, 2 kv heads, d_ff 688, vocab 256, with the family's own features: biases, q/k norms,
windows of 64, Gemma's norms and soft-caps) beside the plain Llama of that size, the same
prompts and new tokens, interleaved repeats; `ratio` is the family's tokens/s over the Llama's;
`cache_bytes` is its KV cache at batch 1 (local layers hold a ring of their window), and
`full_cache_bytes` what it was with every layer holding the whole cache (before issue 68).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

from benchmarks import common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__, 'a few tokens, one repeat (tests)')
  parser.add_argument('--new_tokens', type=int, default=256)
  parser.add_argument('--prompt_len', type=int, default=32)
  parser.add_argument('--reference_tokens', type=int, default=32)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--batches', default='1,8')
  parser.add_argument('--presets', default=None,
                      help='comma-separated paxlike/configs/models.py sizes (350m, 1b): '
                           'against the roofline')
  parser.add_argument('--quantizations', default='none',
                      help='with --presets: comma-separated base_quantization kinds (none, int8, '
                           'nf4), each timed on the same weights')
  parser.add_argument('--layouts', default='unrolled',
                      help='with --presets: comma-separated scan, loop, unrolled')
  parser.add_argument('--family', default=None,
                      help='an HF model_type (or all): its batch-1 decoding beside the Llama')
  args = parser.parse_args(argv)
  unknown = set(args.layouts.split(',')) - {'scan', 'loop', 'unrolled'}
  if unknown:
    parser.error(f'--layouts takes scan, loop and unrolled, not {", ".join(sorted(unknown))}')
  if args.quick:
    args.new_tokens, args.prompt_len, args.reference_tokens, args.repeats = 8, 8, 2, 1
    args.batches = '1,2'
  return args


def models() -> dict:
  import fiddle as fdl
  from paxlike.configs import models as model_configs
  from paxlike.layers import TransformerLM
  llama = TransformerLM(vocab_size=256, num_layers=4, d_model=256, num_heads=4, d_ff=688,
                        max_len=288, tied_embeddings=False, norm_eps=1e-5)
  return {'stdlib_tiny': fdl.build(model_configs.lm_tiny()), 'llama_4x256': llama}


@functools.lru_cache(maxsize=None)
def _next_tokens(model):
  """The reference's jitted step: greedy next tokens after `window[:, :length]`."""
  import jax
  import jax.numpy as jnp

  @jax.jit
  def step(params, window, length):
    logits = model.apply({'params': params}, window)
    return jnp.argmax(logits[:, length - 1], axis=-1).astype(jnp.int32)
  return step


def reference(model, params, prompts, new_tokens: int):
  """Full recompute, as paxlike/decode.py did: a `max_len` window per token (prompts of one
  length), the whole model rerun on it for every new token. (tokens [B, N], ttft_s, total_s)."""
  import numpy as np
  step = _next_tokens(model)
  context = model.max_len
  tokens = np.asarray(prompts, np.int32)
  start, first = time.perf_counter(), None
  for _ in range(new_tokens):
    visible = tokens[:, -context:]
    window = np.zeros((len(tokens), context), np.int32)
    window[:, :visible.shape[1]] = visible
    token = np.asarray(step(params, window, visible.shape[1]))
    first = first or time.perf_counter() - start
    tokens = np.concatenate([tokens, token[:, None]], axis=1)
  return tokens[:, len(prompts[0]):], first, time.perf_counter() - start


def kv_cache(model, params, prompts, new_tokens: int, cache_len: int):
  """The KV-cache decoder. (tokens [B, N], ttft_s, total_s)."""
  import jax
  import numpy as np
  from paxlike.decode import engine
  cache_size, width = engine.shapes_for(max(map(len, prompts)), new_tokens, cache_len)
  run = engine.decoder(model, engine.Options(cache_size))
  tokens, lengths = engine.left_pad(prompts, 0, width)
  live = np.ones(len(prompts), bool)
  start = time.perf_counter()
  state = run.prefill(params, tokens, lengths, live, jax.random.key(0))
  jax.block_until_ready(state.out)
  ttft = time.perf_counter() - start
  out = np.asarray(run.loop(params, state, np.int32(new_tokens)).out)[:, :new_tokens]
  return out, ttft, time.perf_counter() - start


def measure(fn, repeats: int) -> dict:
  """Median ttft and tokens/s (all new tokens over the whole time, prefill included) of
  `fn() -> (tokens, ttft, total)` over repeats, after a compiling call."""
  tokens, _, _ = fn()
  ttfts, rates, decode_rates = [], [], []
  for _ in range(repeats):
    tokens, ttft, total = fn()
    ttfts.append(ttft)
    rates.append(tokens.size / total)
    if tokens.shape[1] > 1 and total > ttft:  # The tokens after the first, over their time.
      decode_rates.append(tokens.shape[0] * (tokens.shape[1] - 1) / (total - ttft))
  row = {'tokens_per_sec': round(statistics.median(rates), 1),
         'best_tokens_per_sec': round(max(rates), 1),
         'ttft_ms': round(1e3 * statistics.median(ttfts), 2)}
  if decode_rates:
    row['decode_tokens_per_sec'] = round(statistics.median(decode_rates), 1)
  return row, tokens


def run_model(name: str, model, args: argparse.Namespace) -> dict:
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))['params']
  cache_len = max(model.max_len, args.prompt_len + args.new_tokens - 1)
  rng = np.random.default_rng(0)
  result = {}
  for batch in (int(b) for b in args.batches.split(',')):
    prompts = [rng.integers(1, model.vocab_size, args.prompt_len).astype(np.int32)
               for _ in range(batch)]
    common.log(f'{name} batch {batch}')
    fast, fast_tokens = measure(
        lambda: kv_cache(model, params, prompts, args.new_tokens, cache_len), args.repeats)
    slow, slow_tokens = measure(
        lambda: reference(model, params, prompts, args.reference_tokens), args.repeats)
    same = bool(np.array_equal(fast_tokens[:, :args.reference_tokens], slow_tokens))
    result[f'batch_{batch}'] = {'kv_cache': fast, 'reference': slow, 'same_tokens': same,
                                'speedup': round(fast['tokens_per_sec'] / slow['tokens_per_sec'],
                                                 1)}
  batches = sorted(result)
  if len(batches) > 1:
    rates = [result[b]['kv_cache']['tokens_per_sec'] for b in batches]
    result[f'{batches[-1]}_over_{batches[0]}'] = round(rates[-1] / rates[0], 2)
  return result


# Per family: the config.json keys beyond the shared size that give its features.
FAMILY_CONFIGS = {
    'llama': {}, 'mistral': {'sliding_window': 64}, 'qwen2': {},
    'qwen3': {'head_dim': 64}, 'phi3': {'sliding_window': 64},
    'gemma2': {'hidden_activation': 'gelu_pytorch_tanh', 'sliding_window': 64,
               'query_pre_attn_scalar': 64, 'attn_logit_softcapping': 50.0,
               'final_logit_softcapping': 30.0},
    'gemma3_text': {'hidden_activation': 'gelu_pytorch_tanh', 'sliding_window': 64,
                    'query_pre_attn_scalar': 64, 'sliding_window_pattern': 2,
                    'rope_local_base_freq': 10_000.0},
}


def family_model(name: str):
  """The TransformerLM of family `name` at the Llama's size."""
  import fiddle as fdl
  from paxlike import interop
  hf = dict(model_type=name, vocab_size=256, hidden_size=256, intermediate_size=688,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=288, rms_norm_eps=1e-5, tie_word_embeddings=False,
            **FAMILY_CONFIGS[name])
  return fdl.build(interop.config_from_hf(hf))


def cache_bytes(model, params, width: int, cache_size: int) -> int:
  """Bytes of the KV cache that a batch-1 prefill `width` wide makes in `cache_size` slots."""
  import jax
  import jax.numpy as jnp
  tokens = jnp.zeros((1, width), jnp.int32)
  cache = jax.eval_shape(lambda p: model.apply(
      {'params': p}, tokens, positions=jnp.arange(width)[None], decode=True,
      cache_len=cache_size, mutable=['cache'])[1], params)
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))


def run_families(names: list[str], args: argparse.Namespace) -> dict:
  """Batch-1 KV-cache tokens/s of each family beside the Llama's (interleaved repeats)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  from paxlike.decode import engine
  prompts = [np.random.default_rng(0).integers(1, 256, args.prompt_len).astype(np.int32)]
  cache_len = max(288, args.prompt_len + args.new_tokens - 1)
  runs, sizes = {}, {}
  cache_size, width = engine.shapes_for(args.prompt_len, args.new_tokens, cache_len)
  for name in ['llama', *[n for n in names if n != 'llama']]:
    model = family_model(name)
    params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))['params']
    sizes[name] = {'cache_slots': cache_size,
                   'cache_bytes': cache_bytes(model, params, width, cache_size),
                   'full_cache_bytes': cache_bytes(  # A window as wide as the cache.
                       model.clone(sliding_window=model.sliding_window and cache_size), params,
                       width, cache_size)}
    runs[name] = lambda m=model, p=params: kv_cache(m, p, prompts, args.new_tokens, cache_len)
    runs[name]()  # Compiles.
  rates = {name: [] for name in runs}
  for _ in range(args.repeats):
    for name, run in runs.items():
      tokens, _, total = run()
      rates[name].append(tokens.size / total)
  llama = statistics.median(rates['llama'])
  return {name: {'tokens_per_sec': round(statistics.median(r), 1),
                 'llama_tokens_per_sec': round(llama, 1),
                 'ratio': round(statistics.median(r) / llama, 3), **sizes[name]}
          for name, r in rates.items() if name in names}


def preset_model(name: str, quick: bool):
  import fiddle as fdl
  from paxlike.configs import models as model_configs
  model = fdl.build(getattr(model_configs, f'lm_{name}')())
  if quick:
    model = model.clone(num_layers=2, d_model=128, num_heads=2, num_kv_heads=1, d_ff=256,
                        vocab_size=512)  # Heads of 64: NF4's blocks.
  return model


def run_preset(name: str, args: argparse.Namespace, bandwidth: float | None) -> dict:
  """KV-cache tokens/s of a preset at each batch against the roofline (module docstring)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  from paxlike.decode import engine
  from paxlike.layers import quantization, stacking
  model = preset_model(name, args.quick)
  init = jax.jit(lambda key: jax.tree.map(lambda x: x.astype(model.dtype), nn.unbox(
      model.init(key, jnp.zeros((1, 8), jnp.int32)))['params']))
  float_params = init(jax.random.key(0))
  cache_size, _ = engine.shapes_for(args.prompt_len, args.new_tokens, model.max_len)
  head = model.head_size()
  out = {'param_dtype': jnp.dtype(model.dtype).name, 'cache_size': cache_size}
  layouts = args.layouts.split(',')
  for kind, layout in ((k, l) for k in args.quantizations.split(',') for l in layouts):
    # The same weights stored as the kind's model stores them (embeddings and norms as they are).
    params = (float_params if kind == 'none' else
              jax.jit(lambda p, kind=kind: quantization.quantize_tree(p, kind))(float_params))
    kind_model = model.clone(base_quantization=kind)
    if layout == 'unrolled':
      params = jax.jit(stacking.unstack_layers)(params)
      kind_model = kind_model.clone(scan_layers=False)
    else:
      kind_model = kind_model.clone(decode_layers=layout)
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    cache = jax.eval_shape(lambda p, m=kind_model: m.apply(
        {'params': p}, jnp.zeros((1, 8), jnp.int32), positions=jnp.arange(8)[None], decode=True,
        cache_len=cache_size, mutable=['cache'])[1]['cache'], params)
    rows = {'param_bytes': param_bytes, 'cache_entries': sorted(cache)}
    rng = np.random.default_rng(0)
    for batch in (int(b) for b in args.batches.split(',')):
      prompts = [rng.integers(1, model.vocab_size, args.prompt_len).astype(np.int32)
                 for _ in range(batch)]
      common.log(f'decode: {name} {kind} {layout} batch {batch}')
      row, _ = measure(lambda: kv_cache(kind_model, params, prompts, args.new_tokens,
                                        model.max_len), args.repeats)
      cache_bytes = (2 * model.num_layers * (model.num_kv_heads or model.num_heads) * head
                     * cache_size * batch * jnp.dtype(model.dtype).itemsize)
      if bandwidth:
        roofline = batch * bandwidth / (param_bytes + cache_bytes)
        row.update(roofline_tokens_per_sec=round(roofline, 1),
                   fraction_of_roofline=round(row['decode_tokens_per_sec'] / roofline, 4))
      if (kind, layout) != ('none', layouts[0]) and 'none' in out:
        row['vs_none'] = round(row['decode_tokens_per_sec']
                               / out['none'][f'batch_{batch}']['decode_tokens_per_sec'], 4)
      rows[f'batch_{batch}'] = row
    del params
    out[kind if layout == layouts[0] else f'{kind}_{layout}'] = rows
    # On stderr as each kind ends: a run killed at its time limit still shows what it measured.
    common.log(f'decode: {name} so far: {json.dumps(out)}')
  return out


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  import jax
  from paxlike.trainer import throughput
  out = {'benchmark': 'decode', 'quick': args.quick, 'platform': jax.devices()[0].platform,
         'new_tokens': args.new_tokens, 'prompt_len': args.prompt_len,
         'reference_tokens': args.reference_tokens, 'repeats': args.repeats}
  if args.presets:
    bandwidth = throughput.hbm_bytes_per_sec(jax.devices()[0].device_kind)
    out.update(device_kind=jax.devices()[0].device_kind, hbm_bytes_per_sec=bandwidth,
               batches=args.batches)
    for name in args.presets.split(','):
      out[name] = run_preset(name, args, bandwidth)
  elif args.family:
    names = list(FAMILY_CONFIGS) if args.family == 'all' else [args.family]
    if any(n not in FAMILY_CONFIGS for n in names):
      raise SystemExit(f'--family must be all or one of {", ".join(FAMILY_CONFIGS)}')
    out['families'] = run_families(names, args)
  else:
    for name, model in models().items():
      out[name] = run_model(name, model, args)
  common.emit(out)


if __name__ == '__main__':
  main()
