"""Model sizes as Fiddle configs."""

import fiddle as fdl
import jax.numpy as jnp

from paxlike.layers import CnnClassifier, MlpClassifier, TransformerLM


def lm_tiny() -> fdl.Config[TransformerLM]:
  """~0.4M parameters: CPU-sized byte LM."""
  return fdl.Config(TransformerLM, num_layers=2, d_model=128, num_heads=4, d_ff=384, max_len=128)


def mlp(num_classes: int = 10, hidden: tuple[int, ...] = (200, 200)) -> fdl.Config[MlpClassifier]:
  return fdl.Config(MlpClassifier, num_classes=num_classes, hidden=hidden)


def cnn(num_classes: int = 10) -> fdl.Config[CnnClassifier]:
  """The FedAvg CNN of McMahan et al. 2017."""
  return fdl.Config(CnnClassifier, num_classes=num_classes)


# Llama-like sizes: RMSNorm, SwiGLU, rope, untied embeddings, no biases. The big ones compute in
# bfloat16 with float32 params and scan over layers; each has a recommended mesh in
# paxlike/configs/sizes.py. Parameter counts are exact (tests/test_model_sizes.py checks them).


def _llama(**fields) -> fdl.Config[TransformerLM]:
  return fdl.Config(TransformerLM, tied_embeddings=False, use_rmsnorm=True, gated_mlp=True,
                    rope=True, norm_eps=1e-5, **fields)


def lm_tiny_llama() -> fdl.Config[TransformerLM]:
  """459,392 parameters: the Llama architecture (GQA 4:2, untied) at CPU-test size, bytes."""
  return _llama(vocab_size=256, num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                d_ff=384, max_len=256)


def lm_small_llama(vocab_size: int | None = None) -> fdl.Config[TransformerLM]:
  """The Llama architecture at CPU size (4 × 256, GQA 4:2, SwiGLU 688) for a tokenizer's
  vocabulary: `vocab_size=None` follows the data's tokenizer, rounded up to a multiple of 128."""
  return _llama(vocab_size=vocab_size, num_layers=4, d_model=256, num_heads=4, num_kv_heads=2,
                d_ff=688, max_len=512)


def lm_125m() -> fdl.Config[TransformerLM]:
  """134,105,856 parameters: GPT-3 Small shapes (12 × 768, 12 heads), SwiGLU d_ff 2048."""
  return _llama(vocab_size=32_000, num_layers=12, d_model=768, num_heads=12, d_ff=2048,
                max_len=2048, dtype=jnp.bfloat16, scan_layers=True)


def lm_350m() -> fdl.Config[TransformerLM]:
  """373,867,520 parameters: GPT-3 Medium's depth and width (24 × 1024), SwiGLU d_ff 2816, and
  8 heads of 128, Llama's head width. GPT-3 Medium's 16 heads of 64 have the same params and
  FLOPs but twice the attention scores: a TPU's attention kernel spends its time per score,
  and one v5e trained them at 37.1% MFU against 58.2% (docs/benchmarks.md)."""
  return _llama(vocab_size=32_000, num_layers=24, d_model=1024, num_heads=8, d_ff=2816,
                max_len=2048, dtype=jnp.bfloat16, scan_layers=True, remat_policy='dots')


def lm_1b() -> fdl.Config[TransformerLM]:
  """1,100,048,384 parameters: TinyLlama-1.1B shapes (22 × 2048, GQA 32:4, d_ff 5632)."""
  return _llama(vocab_size=32_000, num_layers=22, d_model=2048, num_heads=32, num_kv_heads=4,
                d_ff=5632, max_len=2048, dtype=jnp.bfloat16, scan_layers=True,
                remat_policy='dots')


def lm_8b() -> fdl.Config[TransformerLM]:
  """8,030,261,248 parameters: Llama-3-8B shapes (32 × 4096, GQA 32:8, d_ff 14336, 128k vocab)."""
  return _llama(vocab_size=128_256, num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8,
                d_ff=14_336, max_len=8192, rope_base=500_000.0, dtype=jnp.bfloat16,
                scan_layers=True, remat_policy='full')
