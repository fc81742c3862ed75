"""MFU of a ~1.1B-parameter decoder LM in bf16 on one GPU, at the largest batch that fits.

    benchmarks/gpu_mfu.sh            # sets up a CUDA venv, then runs this
    python benchmarks/gpu_mfu.py --dry-run   # a tiny model on CPU: checks the script end to end

The model is paxlike's `TransformerLM` in TinyLlama-1.1B shapes (`configs.models.lm_1b`):
22 layers × d_model 2048, GQA 32:4, SwiGLU d_ff 5632, rope, RMSNorm, untied 32k vocab; bf16
compute, float32 params, scan over layers and 'dots' remat (fields the layer lacks are dropped
and listed under `missing_fields`). Attention is `jax.nn.dot_product_attention` with the model's
`attention_impl`; `--attention auto` asks for cuDNN flash attention on GPU and falls back to
XLA if cuDNN refuses.
Training step: AdamW, mean cross-entropy, params and optimizer state donated.

Batch search: candidates from `--batches`, largest first. Each is compiled; XLA's memory
analysis (arguments + temps + outputs − aliases) of the first compile gives a linear estimate
that skips candidates which cannot fit the device's memory without compiling them; an OOM
at compile or run time moves on to the next. The first that runs is timed (≤ 2 steps in flight).
`mfu` uses model FLOPs (6·N + causal attention, `paxlike.model_stats`; remat recompute is not
counted) over the chip's bf16 peak (`paxlike.throughput`, or `--peak-tflops`). XLA's cost
analysis is not used: it counts a `scan`'s body once, not once per layer. Prints one JSON
object; without a GPU (and without --dry-run) it prints a `skipped` object and exits 0, so
`make bench` passes on CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

T_START = time.time()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--layers', type=int, default=22)
  parser.add_argument('--d-model', type=int, default=2048)
  parser.add_argument('--heads', type=int, default=32)
  parser.add_argument('--kv-heads', type=int, default=4)
  parser.add_argument('--d-ff', type=int, default=5632)
  parser.add_argument('--vocab', type=int, default=32_000)
  parser.add_argument('--seq-len', type=int, default=2048)
  parser.add_argument('--batches', default='64,48,32,24,16,12,8,4,2,1',
                      help='candidate batch sizes (sequences), tried largest first')
  parser.add_argument('--steps', type=int, default=10, help='timed steps')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--attention', choices=('auto', 'cudnn', 'xla'), default='auto')
  parser.add_argument('--remat', default='dots', help="TransformerLM.remat_policy")
  parser.add_argument('--no-scan', action='store_true', help='unrolled layers')
  parser.add_argument('--memory-limit-gb', type=float,
                      help="device memory to plan for (default: the device's bytes_limit)")
  parser.add_argument('--peak-tflops', type=float,
                      help="the chip's dense bf16 peak (default: paxlike.throughput's table)")
  parser.add_argument('--budget-s', type=float, default=240,
                      help='stop trying new batch sizes after this many seconds')
  parser.add_argument('--dry-run', '--quick', dest='dry_run', action='store_true',
                      help='a tiny model on whatever device there is (CPU here)')
  args = parser.parse_args(argv)
  if args.dry_run:
    args.layers, args.d_model, args.heads, args.kv_heads, args.d_ff = 2, 64, 4, 2, 128
    args.vocab, args.seq_len, args.steps, args.warmup = 256, 32, 2, 1
    args.batches = '8,4' if args.batches == parser.get_default('batches') else args.batches
  return args


def build_model(args: argparse.Namespace) -> tuple[Any, list[str]]:
  """The TransformerLM, and the requested fields this version of it lacks."""
  import jax.numpy as jnp
  from paxlike.layers import TransformerLM
  fields = dict(vocab_size=args.vocab, num_layers=args.layers, d_model=args.d_model,
                num_heads=args.heads, num_kv_heads=args.kv_heads, d_ff=args.d_ff,
                max_len=args.seq_len, tied_embeddings=False, use_rmsnorm=True, gated_mlp=True,
                rope=True, norm_eps=1e-5, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                scan_layers=not args.no_scan, remat_policy=args.remat)
  known = TransformerLM.__dataclass_fields__
  missing = sorted(k for k in fields if k not in known)
  return TransformerLM(**{k: v for k, v in fields.items() if k in known}), missing


def is_oom(error: BaseException) -> bool:
  text = str(error)
  return 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower()


def flops_per_token(model: Any, seq_len: int) -> float:
  """Model training FLOPs per token (paxlike.model_stats; 6·N + 12·L·d·T/2 if it is absent)."""
  try:
    from paxlike import model_stats
    return model_stats.flops_per_token(model, seq_len)
  except ImportError:
    kv = model.num_kv_heads or model.num_heads
    head = model.d_model // model.num_heads
    n = model.num_layers * (model.d_model * head * 2 * (model.num_heads + kv)
                            + 3 * model.d_model * model.d_ff) + model.d_model * model.vocab_size
    return 6.0 * n + 12.0 * model.num_layers * model.d_model * (seq_len + 1) / 2


class Trainer:
  """Params, optimizer state and the jitted step of one model."""

  def __init__(self, model: Any, seq_len: int):
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    self.jax, self.model, self.seq_len = jax, model, seq_len
    self.optimizer = optax.adamw(3e-4, b1=0.9, b2=0.95, weight_decay=0.1)
    sample = jnp.zeros((1, seq_len), jnp.int32)
    self.init_params = jax.jit(lambda key: nn.meta.unbox(model.init(key, sample)['params']))
    self.state: tuple[Any, Any] | None = None
    self._steps: dict[str, Any] = {}

  def step_for(self, attention: str) -> Any:
    """The jitted train step with `attention` ('xla' or 'cudnn') as the attention_impl."""
    if attention not in self._steps:
      import optax
      jax, model = self.jax, self.model.clone(attention_impl=attention)

      def loss_fn(params, tokens):
        logits = model.apply({'params': params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

      def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

      self._steps[attention] = jax.jit(step, donate_argnums=(0, 1))
    return self._steps[attention]

  def fresh_state(self) -> None:
    """(Re)creates params and optimizer state (a failed donated step may have consumed them)."""
    self.state = None
    params = self.init_params(self.jax.random.key(0))
    self.state = (params, self.jax.jit(self.optimizer.init)(params))

  def param_count(self) -> int:
    return sum(x.size for x in self.jax.tree.leaves(self.state[0]))

  def compile(self, batch: int, attention: str) -> Any:
    jax = self.jax
    specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.state)
    tokens = jax.ShapeDtypeStruct((batch, self.seq_len + 1), jax.numpy.int32)
    return self.step_for(attention).lower(*specs, tokens).compile()

  def time_steps(self, compiled: Any, batch: int, warmup: int, steps: int) -> float:
    """Seconds per step after `warmup` steps."""
    jax = self.jax
    tokens = jax.random.randint(jax.random.key(1), (batch, self.seq_len + 1), 0,
                                self.model.vocab_size, dtype=jax.numpy.int32)

    def one():
      params, opt_state, loss = compiled(*self.state, tokens)
      self.state = (params, opt_state)
      return loss

    common.timed_loop(one, warmup)
    return common.timed_loop(one, steps) / steps


def needed_bytes(compiled: Any) -> tuple[int, int] | None:
  """(total, argument) bytes from XLA's memory analysis, or None where there is none."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  total = (analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
           + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)
  return total, analysis.argument_size_in_bytes


def search(args: argparse.Namespace, trainer: Trainer, attention: str,
           limit: float | None) -> dict[str, Any]:
  """Tries the batch candidates largest first; returns the measurement of the first that runs.

  An OOM (at compile or run time) moves on to the next candidate; any other error with cuDNN
  attention switches to XLA attention and retries the same candidate."""
  tried: list[dict[str, Any]] = []
  estimate: tuple[float, float] | None = None  # (fixed bytes, bytes per sequence)
  fallback_error = None
  candidates = sorted({int(b) for b in args.batches.split(',')}, reverse=True)
  i = 0
  while i < len(candidates):
    batch = candidates[i]
    if time.time() - T_START > args.budget_s:
      tried.append({'batch': batch, 'result': 'skipped: time budget spent'})
      i += 1
      continue
    if estimate and limit and estimate[0] + estimate[1] * batch > limit:
      gib = (estimate[0] + estimate[1] * batch) / 2**30
      tried.append({'batch': batch, 'result': f'skipped: estimated {gib:.2f} GiB'})
      i += 1
      continue
    stage, began = 'compile', time.time()
    try:
      compiled = trainer.compile(batch, attention)
      compile_s = time.time() - began
      needed = needed_bytes(compiled)
      if needed and estimate is None:
        estimate = (needed[1], (needed[0] - needed[1]) / batch)
      if needed and limit and needed[0] > limit:
        tried.append({'batch': batch, 'result': f'skipped: needs {needed[0] / 2**30:.2f} GiB'})
        i += 1
        continue
      stage = 'run'
      step_s = trainer.time_steps(compiled, batch, args.warmup, args.steps)
    except Exception as error:  # XLA and cuDNN raise several kinds.
      if stage == 'run':  # A failed donated step may have consumed the state.
        trainer.fresh_state()
      if is_oom(error):
        tried.append({'batch': batch, 'result': f'oom at {stage}'})
        i += 1
        continue
      if attention == 'xla':
        raise
      fallback_error = f'{type(error).__name__}: {str(error).splitlines()[0][:300]}'
      common.log(f'cuDNN attention failed at {stage} ({fallback_error}); using XLA attention')
      attention, estimate = 'xla', None
      continue
    tried.append({'batch': batch, 'result': 'ran'})
    return {'batch': batch, 'step_time_s': step_s, 'compile_s': compile_s,
            'compiled': compiled, 'attention': attention, 'tried': tried,
            'attention_fallback_error': fallback_error,
            'needed_gib': needed and needed[0] / 2**30}
  return {'tried': tried, 'attention_fallback_error': fallback_error}


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  import jax
  from paxlike import throughput
  device = jax.devices()[0]
  base = {'benchmark': 'gpu_mfu', 'device_kind': device.device_kind,
          'platform': device.platform, 'jax': jax.__version__, 'dry_run': args.dry_run}
  if device.platform != 'gpu' and not args.dry_run:
    common.emit({**base, 'skipped': 'no GPU: run benchmarks/gpu_mfu.sh on an H100/H200, '
                 'or --dry-run for a tiny CPU check'})
    return 0
  model, missing = build_model(args)
  trainer = Trainer(model, args.seq_len)
  trainer.fresh_state()
  stats = device.memory_stats() or {}
  limit = (args.memory_limit_gb * 2**30 if args.memory_limit_gb
           else stats.get('bytes_limit'))
  attention = args.attention
  if attention == 'auto':
    attention = 'cudnn' if device.platform == 'gpu' else 'xla'
  params = trainer.param_count()
  common.log(f'gpu_mfu: {params:,} params on {device.device_kind}, '
             f'seq {args.seq_len}, attention {attention}')
  found = search(args, trainer, attention, limit and 0.97 * limit)
  if 'batch' not in found:
    common.emit({**base, 'error': 'no batch size ran', 'params': params, 'tried': found['tried']})
    return 1
  tokens_per_sec = found['batch'] * args.seq_len / found['step_time_s']
  model_flops = flops_per_token(model, args.seq_len) * tokens_per_sec
  peak = (args.peak_tflops * 1e12 if args.peak_tflops
          else throughput.peak_flops_per_sec(device.device_kind))
  peak_memory = (device.memory_stats() or {}).get('peak_bytes_in_use')
  common.emit({
      **base, 'params': params, 'batch': found['batch'], 'seq_len': args.seq_len,
      'tokens_per_step': found['batch'] * args.seq_len,
      'step_time_s': round(found['step_time_s'], 4), 'tokens_per_sec': round(tokens_per_sec, 1),
      'tflops_per_sec': model_flops / 1e12, 'mfu': peak and model_flops / peak,
      'peak_tflops': peak and peak / 1e12,
      'attention': found['attention'], 'attention_fallback_error': found['attention_fallback_error'],
      'scan_layers': getattr(model, 'scan_layers', False),
      'remat_policy': getattr(model, 'remat_policy', None), 'dtype': 'bfloat16',
      'missing_fields': missing, 'compile_s': round(found['compile_s'], 1),
      'needed_gib': found['needed_gib'] and round(found['needed_gib'], 2),
      'peak_gib_in_use': peak_memory and round(peak_memory / 2**30, 2),
      'memory_limit_gib': limit and round(limit / 2**30, 2),
      'tried': found['tried'], 'total_s': round(time.time() - T_START, 1),
  })
  return 0


if __name__ == '__main__':
  sys.exit(main())
