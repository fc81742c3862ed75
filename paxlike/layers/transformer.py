"""Decoder-only transformer language model with logical axis annotations."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.layers import attention_kernels, lm_checks, lm_features, lora, moe, pipeline
from paxlike.layers.lm_checks import REMAT_POLICIES
from paxlike.layers.attention import CausalSelfAttention
from paxlike.layers.blocks import EMBED_ACT, MLP_ACT, MLP_ACTIVATIONS, DecoderBlock, Mlp, make_norm
from paxlike.layers.rope import RopeScaling
from paxlike.layers.stacking import stack_layers, unstack_layers

DType = Any

VOCAB_ACT = ('batch', 'length', 'vocab')
__all__ = ['EMBED_ACT', 'MLP_ACT', 'MLP_ACTIVATIONS', 'REMAT_POLICIES', 'BlockGroup',
           'DecoderBlock', 'Mlp', 'TransformerLM', 'make_norm', 'stack_layers', 'unstack_layers']
def _scan_step(block: DecoderBlock, x: jax.Array, segment_ids: jax.Array | None,
               positions: jax.Array | None, local: jax.Array | None = None, *,
               deterministic: bool, decode: bool,
               cache_len: int | None) -> tuple[jax.Array, None]:
  """One layer as an `nn.scan` body: the residual stream is the carry; `local` is the step's
  slice of the scanned local/global flags (None when every layer is alike)."""
  return block(x, deterministic, decode, cache_len, segment_ids, positions, local), None


class BlockGroup(nn.Module):
  """Consecutive layers run as one: the scan step of a model whose every `moe_every`-th layer
  is a MoE layer. Params 'layer_{j}' per block."""

  layer: tuple[nn.Module, ...]

  def __call__(self, x: jax.Array, deterministic: bool, decode: bool = False,
               cache_len: int | None = None, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, local: jax.Array | None = None) -> jax.Array:
    for j, block in enumerate(self.layer):
      x = block(x, deterministic, decode, cache_len, segment_ids, positions,
                None if local is None else local[j])
    return x


class TransformerLM(nn.Module):
  """Decoder-only LM: tokens int32[B, T] -> logits float32[B, T, vocab_size].

  `num_kv_heads=None` means num_heads (plain multi-head attention); fewer
  gives grouped-query attention (1: multi-query). `rope=False` adds a learned
  absolute position embedding of `max_len` rows (then T <= max_len); with rope
  there is no position parameter and `max_len` is unused. `sliding_window=W`
  lets each token attend to itself and the W - 1 previous tokens.
  `mlp_activation` is 'silu' or 'gelu'; None means 'silu' when `gated_mlp`
  (SwiGLU) and 'gelu' otherwise, so `gated_mlp=True, mlp_activation='gelu'`
  is GeGLU ('gelu_tanh' and 'gelu_exact' name the approximation). `qk_norm`
  RMS-normalises query and key heads. `norm_eps` is the epsilon of every norm.

  Model-family features (see `lm_features` and paxlike/interop): `head_dim` (None:
  d_model // num_heads); `qkv_bias`, `out_bias`; `rope_scaling` (a `rope.RopeScaling`);
  `global_every=k` with a sliding window makes every k-th layer (k-1, 2k-1, ...) global and
  the rest local (Gemma 2: 2, Gemma 3: 6; 0: every layer local), local layers using
  `local_rope_base` (unscaled) when set; `norm_weight_offset` (Gemma: 1, norms scale by 1 + w);
  `sandwich_norm` (norms after attention and MLP too); `scale_embeddings` (× sqrt(d_model));
  `query_scale` (softmax scale, None: 1/sqrt(head_dim)); `attn_logit_softcap` and
  `final_logit_softcap` (cap · tanh(x / cap) on attention scores and on the logits).

  Efficiency: `dtype` is the compute dtype (params stay `param_dtype`; logits
  are always float32). `scan_layers` runs the layers as one `nn.scan`: params
  live under 'blocks' with a leading 'layers' axis instead of 'block_{i}' (see
  `stack_layers`). A scanned stack decodes (`decode_layers`) 'unrolled' (the default: the
  decode engine splits the params per layer first, where each device has room for the copy,
  else decodes by 'scan'), by 'scan', one stacked cache that the layer scan takes in and gives
  out whole every token, or by 'loop', a loop over the layers with each layer's params sliced
  from the stack inside the program and a cache of its own (a local layer's the ring of its
  window, with no copy of the params). On one TPU v5e the 350M decoded at batch 1 at 99% of
  the HBM roofline unrolled, 73% by the loop and 55% by the scan (docs/benchmarks.md).
  `remat_policy` is 'none', 'full' (recompute the whole block in the backward pass), 'dots'
  (keep the matmul outputs, recompute the rest) or 'dots_attention' (also keep the attention
  kernel's outputs: splash's forward is not run again). `fused_qkv` computes q, k and v with
  one matmul (same params).
  `attention_impl` names the attention kernel; 'auto' picks the fastest this platform runs
  (`attention_kernel` says which).

  LoRA: `lora_rank` > 0 adds adapters `<kernel>_lora_a` / `<kernel>_lora_b` beside each kernel
  named in `lora_targets` (any of 'query', 'key', 'value', 'out', 'wi_gate', 'wi_up', 'wi',
  'wo'), scaled by `lora_alpha / lora_rank`; `lora.merge_lora` folds them in. In a MoE layer
  each expert gets adapters of its own on the targeted MLP kernels.

  Mixture of experts (`paxlike.layers.moe`): `num_experts` > 0 makes every `moe_every`-th
  layer's MLP (layers moe_every - 1, 2·moe_every - 1, ...) a `moe.MoeMlp` of `num_experts`
  experts of width `d_ff`, each token routed to `experts_per_token` of them with
  `capacity_factor` (None or 0: dropless); `aux_loss_weight` and `router_z_loss_weight` weigh
  the losses the layers sow into the 'moe' collection. `moe_d_ff` is each expert's width (None:
  d_ff, which then sizes the dense layers only); `moe_renormalize` whether the top-k gates are
  renormalised to sum to 1 (None: when experts_per_token > 1); `moe_shared_d_ff` > 0 adds a
  shared expert of that width under a sigmoid gate (Qwen2-MoE). Scanned with `moe_every` > 1,
  one scan step is a `BlockGroup` of `moe_every` layers (params 'blocks/layer_{j}'), so
  num_layers must be a multiple of moe_every.
  """

  vocab_size: int = 256
  num_layers: int = 2
  d_model: int = 128
  num_heads: int = 4
  num_kv_heads: int | None = None
  d_ff: int = 512
  max_len: int = 256
  tied_embeddings: bool = True
  use_rmsnorm: bool = True
  gated_mlp: bool = True
  rope: bool = True
  rope_base: float = 10_000.0
  dropout_rate: float = 0.0
  sliding_window: int | None = None
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  mlp_activation: str | None = None
  qk_norm: bool = False
  norm_eps: float = 1e-6
  head_dim: int | None = None
  qkv_bias: bool = False
  out_bias: bool = False
  rope_scaling: RopeScaling | None = None
  local_rope_base: float | None = None
  global_every: int = 0
  norm_weight_offset: float = 0.0
  sandwich_norm: bool = False
  scale_embeddings: bool = False
  query_scale: float | None = None
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  scan_layers: bool = False
  decode_layers: str = 'unrolled'  # How a scanned stack decodes: 'unrolled', 'scan' or 'loop'.
  remat_policy: str = 'none'
  attention_impl: str = 'auto'  # 'auto', 'xla', 'cudnn' or 'splash': see attention_kernels.
  fused_qkv: bool = False  # q, k and v by one 2-D matmul (see CausalSelfAttention).
  # A frozen base for LoRA: 'int8' or 'nf4' stores every attention and MLP kernel quantized
  # (embeddings, norms and the head stay as they are; see paxlike.layers.quantization).
  base_quantization: str = 'none'
  double_quant: bool = True  # NF4's absmax constants quantized too (QLoRA's "double").
  lora_rank: int = 0  # 0 = no adapters; see paxlike.layers.lora.
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ('query', 'value')
  num_experts: int = 0  # 0 = dense MLPs; see paxlike.layers.moe.
  experts_per_token: int = 2
  moe_every: int = 1
  # GPipe microbatches when the context mesh has a 'stage' axis (the trainer sets it from
  # train.microbatches; see paxlike.layers.pipeline and docs/pipeline.md).
  pipeline_microbatches: int = 1
  capacity_factor: float | None = 1.25
  aux_loss_weight: float = 0.01
  router_z_loss_weight: float = 1e-3
  moe_d_ff: int | None = None
  moe_renormalize: bool | None = None
  moe_shared_d_ff: int = 0
  moe_dispatch: str = 'auto'  # A dropless MoE's matmul: see moe_dispatch.resolve.

  def head_size(self) -> int:
    """Features per attention head."""
    return self.head_dim or self.d_model // self.num_heads

  def is_local_layer(self, layer: int) -> bool:
    """Whether layer `layer` (0-based) attends within `sliding_window` (see `global_every`)."""
    return lm_features.is_local_layer(self, layer)

  def is_moe_layer(self, layer: int) -> bool:
    """Whether layer `layer` (0-based) has a MoE MLP."""
    return self.num_experts > 0 and (layer + 1) % self.moe_every == 0

  def attention_kernel(self, seq_len: int, segmented: bool = False) -> str:
    """The attention kernel that runs at `seq_len` on this platform ('xla', 'cudnn' or
    'splash'; `segmented`: for packed batches with segment ids); raises UserError when a
    forced `attention_impl` cannot run here."""
    return attention_kernels.resolve(
        self.attention_impl, dtype=self.dtype, num_heads=self.num_heads,
        num_kv_heads=self.num_kv_heads or self.num_heads,
        head_dim=self.head_size(), seq_len=seq_len,
        sliding_window=self.sliding_window, segmented=segmented,
        softcap=self.attn_logit_softcap)

  def _moe_mlp(self, activation: str) -> moe.MoeMlp:
    """An unbound MoE MLP, for a block to adopt as 'mlp'."""
    return moe.MoeMlp(
        self.moe_d_ff or self.d_ff, self.num_experts, self.experts_per_token, self.capacity_factor,
        self.aux_loss_weight, self.router_z_loss_weight, self.gated_mlp, self.dtype,
        self.param_dtype, activation, renormalize=self.moe_renormalize,
        shared_d_ff=self.moe_shared_d_ff, dispatch=self.moe_dispatch,
        lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
        lora_targets=tuple(t for t in self.lora_targets if t in lora.MLP_TARGETS), parent=None)

  def _block(self, name: str | None, is_moe: bool = False, is_local: bool = True
             ) -> DecoderBlock:
    """A layer (or, scanned, the stack). The unbound attention is adopted as 'attention', the
    unbound MoE MLP (`is_moe`) as 'mlp'; `name=None` leaves it unbound too. `is_local`: the
    layer's kind (a scanned stack of mixed kinds gets its flags as scanned inputs)."""
    attention = CausalSelfAttention(
        num_heads=self.num_heads,
        num_kv_heads=self.num_kv_heads or self.num_heads,
        head_dim=self.head_size(),
        rope=self.rope,
        rope_base=self.rope_base,
        sliding_window=self.sliding_window,
        qk_norm=self.qk_norm,
        norm_eps=self.norm_eps,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        implementation=self.attention_impl,
        fused_qkv=self.fused_qkv,
        base_quantization=self.base_quantization,
        double_quant=self.double_quant,
        lora_rank=self.lora_rank,
        lora_alpha=self.lora_alpha,
        lora_targets=tuple(t for t in self.lora_targets if t in lora.ATTENTION_TARGETS),
        **lm_features.attention_fields(self, is_local),
        parent=None,
    )
    block_cls = DecoderBlock
    if self.remat_policy != 'none':
      block_cls = nn.remat(block_cls, policy=REMAT_POLICIES[self.remat_policy],
                           prevent_cse=not self.scan_layers, static_argnums=(2, 3, 4))
    activation = self.mlp_activation or ('silu' if self.gated_mlp else 'gelu')
    return block_cls(
        attention,
        d_ff=self.d_ff,
        gated_mlp=self.gated_mlp,
        use_rmsnorm=self.use_rmsnorm,
        dropout_rate=self.dropout_rate,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        mlp_activation=activation,
        norm_eps=self.norm_eps,
        lora_rank=self.lora_rank,
        lora_alpha=self.lora_alpha,
        lora_targets=tuple(t for t in self.lora_targets if t in lora.MLP_TARGETS),
        mlp=self._moe_mlp(activation) if is_moe else None,
        sandwich_norm=self.sandwich_norm,
        norm_weight_offset=self.norm_weight_offset,
        base_quantization=self.base_quantization,
        double_quant=self.double_quant,
        **({'parent': None} if name is None else {'name': name}),
    )

  def _layers(self, x: jax.Array, deterministic: bool, decode: bool, cache_len: int | None,
              segment_ids: jax.Array | None, positions: jax.Array | None) -> jax.Array:
    """All decoder layers, unrolled ('block_{i}') or scanned ('blocks', stacked on 'layers';
    a decode cache is stacked the same way, or with `decode_layers='loop'` one per layer)."""
    if (self.scan_layers and not decode and not self.is_initializing()
        and pipeline.stage_count(jax.sharding.get_abstract_mesh()) > 1):
      return self._pipelined(x, segment_ids, positions)
    if not self.scan_layers:
      for i in range(self.num_layers):
        block = self._block(f'block_{i}', self.is_moe_layer(i), self.is_local_layer(i))
        x = block(x, deterministic, decode, cache_len, segment_ids, positions)
      return x
    if decode and not self.is_initializing() and self.loops_to_decode():
      return self._looped_layers(x, deterministic, cache_len, segment_ids, positions)
    group = self.moe_every if self.num_experts else 1
    flags = lm_features.scanned_local_flags(self, group)  # None: every layer alike.
    scan = nn.scan(
        functools.partial(_scan_step, deterministic=deterministic, decode=decode,
                          cache_len=cache_len),
        variable_axes={'params': 0, 'cache': 0, moe.COLLECTION: 0},
        split_rngs={'params': True, 'dropout': True},
        in_axes=(nn.broadcast, nn.broadcast) + ((0,) if flags is not None else ()),
        length=self.num_layers // group,
        metadata_params={nn.PARTITION_NAME: 'layers'},
    )
    uniform = self.is_local_layer(0)  # The kind of every layer when they are alike.
    if group == 1:
      body = self._block('blocks', self.num_experts > 0, uniform)
    else:
      body = BlockGroup(tuple(self._block(None, self.is_moe_layer(j), uniform)
                              for j in range(group)), name='blocks')
    x, _ = scan(body, x, segment_ids, positions, *(() if flags is None else (flags,)))
    return x

  def loops_to_decode(self) -> bool:
    """Whether this model's scanned stack decodes by a loop over its layers (`decode_layers`)."""
    return self.scan_layers and self.decode_layers == 'loop'

  def _looped_layers(self, x: jax.Array, deterministic: bool, cache_len: int | None,
                     segment_ids: jax.Array | None, positions: jax.Array | None) -> jax.Array:
    """The scanned stack ('blocks') decoding as a loop over its layers: each layer's params
    sliced from the stack, its cache its own ('layer_{i}', sized by its kind)."""
    stacked = self.variables['params']['blocks']
    group = self.moe_every if self.num_experts else 1
    for step in range(self.num_layers // group):
      params = jax.tree.map(lambda p, step=step: p[step], stacked)
      for j in range(group):
        i = step * group + j
        block = self._block(None, self.is_moe_layer(i), self.is_local_layer(i))
        name = f'layer_{i}'
        variables = {'params': params if group == 1 else params[f'layer_{j}']}
        if self.has_variable('cache', name):
          variables['cache'] = self.get_variable('cache', name)
        x, mutated = block.apply(variables, x, deterministic, True, cache_len, segment_ids,
                                 positions, mutable=['cache'])
        self.put_variable('cache', name, mutated['cache'])
    return x

  def _pipelined(self, x: jax.Array, segment_ids: jax.Array | None,
                 positions: jax.Array | None) -> jax.Array:
    """The scanned stack ('blocks', made by the scan at init) as a GPipe pipeline over the
    context mesh's 'stage' axis, `pipeline_microbatches` microbatches (deterministic only)."""
    block = self._block(None)  # Unbound, remat as configured: one layer of the stack.

    def layer(params: Any, h: jax.Array, extra: tuple) -> jax.Array:
      return block.apply({'params': params}, h, True, False, None, *extra)

    return pipeline.pipelined_layers(layer, self.variables['params']['blocks'], x,
                                     (segment_ids, positions),
                                     microbatches=self.pipeline_microbatches)

  @nn.compact
  def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False, cache_len: int | None = None) -> jax.Array:
    """tokens int32[B, T] -> logits float32[B, T, vocab_size]; dropout iff not deterministic.

    Packed documents: `segment_ids` int32[B, T] (1, 2, ... per document, 0 for padding) keep
    attention inside each document, and `positions` int32[B, T] (restarting at 0 per document)
    place rope or the learned position embedding; None means one document at 0..T-1.
    `decode=True` runs on a mutable 'cache' collection (see `CausalSelfAttention`), created on
    the first call with `cache_len` slots (default `max_len`); then `positions` are required.
    """
    lm_checks.check_model(self, tokens.shape[1])
    if decode and positions is None:
      raise ValueError('decode=True needs the positions of the new tokens')
    cache_len = (cache_len or self.max_len) if decode else None
    embed_init = nn.initializers.normal(stddev=self.d_model**-0.5)
    embed = nn.Embed(
        self.vocab_size,
        self.d_model,
        embedding_init=nn.with_logical_partitioning(embed_init, ('vocab', 'embed')),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='embed',
    )
    x = embed(tokens)
    if self.scale_embeddings:  # Gemma: × sqrt(d_model), rounded to the compute dtype.
      x = x * jnp.asarray(self.d_model**0.5, self.dtype)
    if not self.rope:
      pos_init = nn.with_logical_partitioning(embed_init, (None, 'embed'))
      pos = self.param('pos_embed', pos_init, (self.max_len, self.d_model), self.param_dtype)
      rows = pos[: tokens.shape[1]][None] if positions is None else pos[positions]
      x = x + jnp.asarray(rows, self.dtype)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = nn.with_logical_constraint(x, EMBED_ACT)
    x = self._layers(x, deterministic, decode, cache_len, segment_ids, positions)
    x = make_norm(self.use_rmsnorm, self.dtype, self.param_dtype, 'final_norm', self.norm_eps,
                  self.norm_weight_offset)(x)
    if self.tied_embeddings:
      logits = embed.attend(x)
    else:
      head_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'vocab'))
      logits = nn.Dense(
          self.vocab_size,
          use_bias=False,
          kernel_init=head_init,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name='lm_head',
      )(x)
    logits = logits.astype(jnp.float32)
    if self.final_logit_softcap is not None:
      logits = jnp.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap
    return nn.with_logical_constraint(logits, VOCAB_ACT)
