"""The language-model family (`TransformerLM`): token items, closed-form FLOPs (lm_flops.py),
the memory estimate (lm_memory.py), a posterior-mixed ensemble, decoding, and the vocabulary
check against the data.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.federated.ensemble import ensemble_log_probs
from paxlike.errors import UserError
from paxlike.families import lm_memory
from paxlike.families.base import Family, check_item, mask_items
from paxlike.families.lm_flops import flops_per_token
from paxlike.families.shapes import param_count
from paxlike.layers import TransformerLM
from paxlike.core.loss import LossFn


def step_flops(model: TransformerLM, loss_fn: LossFn, boxed_params: Any, batches: dict,
               num_devices: int) -> float:
  """6N + attention per token × the round's tokens, per device."""
  del loss_fn, boxed_params  # The formula needs only the model's fields.
  tokens = batches['mask'].size
  return flops_per_token(model, batches['inputs'].shape[-1]) * tokens / num_devices


def input_sample(data: Any) -> jax.ShapeDtypeStruct:
  """A token window of one: int32 [1, seq_len]."""
  return jax.ShapeDtypeStruct((1, data.seq_len), jnp.int32)


def kernel_line(model: TransformerLM, data: Any) -> str:
  """`# attention kernel: NAME` (what 'auto' resolves to here). Raises UserError when the
  model forces a kernel this platform cannot run."""
  return f'# attention kernel: {model.attention_kernel(data.seq_len)}\n'


def summary(model: TransformerLM, data: Any) -> str:
  """The attention kernel, params and the closed-form training FLOPs per token."""
  seq_len = data.seq_len
  quantized = getattr(model, 'base_quantization', 'none') != 'none'
  count = param_count(model.clone(base_quantization='none') if quantized else model, seq_len)
  note = f' (base stored as {model.base_quantization})' if quantized else ''
  return (kernel_line(model, data) + f'# params: {count:,}{note}\n'
          f'# train FLOPs per token (seq_len {seq_len}): {flops_per_token(model, seq_len):.4g}\n')


def complete(model: TransformerLM, data: Any) -> TransformerLM:
  """`vocab_size=None` follows the data: its `vocab_size` (a text source's tokenizer's) rounded
  up to a multiple of 128 (`paxlike.tokenizers.vocab_for_model`)."""
  if model.vocab_size is not None:
    return model
  vocab = data.vocab_size
  if vocab is None:
    raise UserError(f"model.vocab_size=None follows the data's vocabulary, but "
                    f'{type(data).__name__} has no vocab_size: set model.vocab_size')
  from paxlike.tokenizers import vocab_for_model  # pylint: disable=import-outside-toplevel
  return model.clone(vocab_size=vocab_for_model(vocab))


def check_data(model: TransformerLM, data: Any) -> None:
  """Token data whose vocabulary the model covers (`data.vocab_size`: the byte sources' 256, a
  text source's tokenizer's)."""
  check_item(FAMILY, model, data)
  vocab = data.vocab_size
  if vocab is not None and model.vocab_size < vocab:
    raise UserError(f'model.vocab_size={model.vocab_size} is smaller than the data\'s '
                    f'vocab_size={vocab} (its tokenizer\'s ids): set model.vocab_size >= {vocab}')


def shrink(model_config: Any) -> None:
  """One layer (a MoE one, for a MoE model)."""
  model_config.num_layers = 1
  if getattr(model_config, 'num_experts', 0):
    model_config.moe_every = 1


FAMILY = Family(
    name='lm', item='tokens', can_decode=True, complete=complete, check_data=check_data,
    items_per_step=mask_items, step_flops=step_flops, input_sample=input_sample,
    summary=summary, kernel_line=kernel_line, memory_summary=lm_memory.summary,
    mix_ensemble=ensemble_log_probs, shrink=shrink)


def is_lm(model: nn.Module | type) -> bool:
  """Whether `model` (or a model class) is in this family."""
  return issubclass(model if isinstance(model, type) else type(model), TransformerLM)
