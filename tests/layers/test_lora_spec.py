"""LoraSpec is the one answer to "does this model have adapters?": read from the model's
`lora_rank`, `lora_alpha` and `lora_targets`; `merged` is the plain model (lora_rank 0) with
W + (alpha / r)·A·B in each adapted kernel (checked in numpy), and no module of paxlike reads
those fields except through it (a source scan)."""

from __future__ import annotations

import ast
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

import paxlike
from paxlike.layers import TransformerLM, lora
from paxlike.layers.lora import LoraSpec

ROOT = Path(paxlike.__file__).parent
TINY = dict(vocab_size=32, num_layers=1, d_model=16, num_heads=2, num_kv_heads=2, d_ff=24,
            max_len=16)
TOKENS = np.random.default_rng(0).integers(0, 32, (2, 6)).astype(np.int32)
FIELDS = ('lora_rank', 'lora_alpha', 'lora_targets')


def test_a_model_without_adapters_is_disabled():
  for model in (TransformerLM(**TINY), object()):
    spec = LoraSpec.of(model)
    assert not spec.enabled and spec.rank == 0 and spec.scale == 0.0 and spec.mask is None
  plain = TransformerLM(**TINY)
  assert LoraSpec.of(plain).base(plain) is plain
  params = {'w': np.ones(2)}
  assert LoraSpec.of(plain).merged(plain, params) == (plain, params)


def test_a_model_with_adapters_is_enabled_with_its_fields():
  model = TransformerLM(**TINY, lora_rank=2, lora_alpha=6.0, lora_targets=['query', 'wo'])
  spec = LoraSpec.of(model)
  assert spec == LoraSpec(rank=2, alpha=6.0, targets=('query', 'wo'))
  assert spec.enabled and spec.scale == 3.0 and spec.mask is lora.lora_mask
  assert spec.base(model).lora_rank == 0 and spec.base(model).lora_alpha == 6.0


def test_merged_is_the_plain_model_and_base_plus_scaled_a_times_b_in_numpy():
  model = TransformerLM(**TINY, lora_rank=2, lora_alpha=5.0, lora_targets=('query', 'wo'))
  params = nn.unbox(model.init(jax.random.key(0), TOKENS))['params']
  rng = np.random.default_rng(1)  # B is zeros at init: give the adapters something to add.
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: (rng.standard_normal(x.shape) * 0.1).astype(np.float32)
      if str(p[-1].key).endswith('_lora_b') else x, params)
  plain, merged = LoraSpec.of(model).merged(model, params)
  assert plain.lora_rank == 0 and not LoraSpec.of(plain).enabled
  assert not any(jax.tree.leaves(lora.lora_mask(merged)))  # No adapter leaf is left.
  block, out = params['block_0'], merged['block_0']
  for owner, name, kernel in (('attention', 'query', lambda t: t['attention']['query']),
                              ('mlp', 'wo', lambda t: t['mlp']['wo']['kernel'])):
    a = np.asarray(block[owner][f'{name}_lora_a'], np.float64)
    b = np.asarray(block[owner][f'{name}_lora_b'], np.float64)
    w = np.asarray(kernel(block), np.float64)
    want = w + 5.0 / 2 * (a.reshape(-1, 2) @ b.reshape(2, -1)).reshape(w.shape)
    np.testing.assert_allclose(np.asarray(kernel(out)), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(plain.apply({'params': merged}, TOKENS),
                             model.apply({'params': params}, TOKENS), rtol=1e-5, atol=1e-5)


def probes(root: Path = ROOT) -> list[str]:
  """'file:line' of each read of a model's LoRA fields in paxlike outside LoraSpec: a getattr
  or hasattr of one (anywhere but layers/lora.py), a `.lora_rank`-style read outside the layers
  (which declare the fields), and a `clone(lora_rank=...)` (adapters off: `LoraSpec.base`)."""
  found = []
  for path in sorted(root.rglob('*.py')):
    where = path.relative_to(root)
    in_layers, is_spec = where.parts[0] == 'layers', where.as_posix() == 'layers/lora.py'
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Call):
        func = getattr(node.func, 'id', None) or getattr(node.func, 'attr', None)
        asks = (func in ('getattr', 'hasattr') and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in FIELDS)
        clones = func == 'clone' and any(k.arg in FIELDS for k in node.keywords)
        bad = (asks or clones) and not is_spec
      else:
        bad = (isinstance(node, ast.Attribute) and node.attr in FIELDS
               and isinstance(node.ctx, ast.Load) and not in_layers)
      if bad:
        found.append(f'{where.as_posix()}:{node.lineno}')
  return found


def test_no_module_reads_the_lora_fields_but_the_spec():
  assert probes() == []


def test_the_scan_sees_each_way_of_asking(tmp_path):
  (tmp_path / 'layers').mkdir()
  (tmp_path / 'trainer').mkdir()
  (tmp_path / 'trainer' / 'step.py').write_text(
      "r = getattr(model, 'lora_rank', 0)\n"
      "on = hasattr(model, 'lora_alpha')\n"
      'r = task.model.lora_rank\n'
      'base = model.clone(lora_rank=0)\n'
      'cfg.model.lora_rank = 8\n'
      'spec = LoraSpec.of(model).enabled\n')
  (tmp_path / 'layers' / 'blocks.py').write_text(
      'x = self.lora_rank\ny = self.clone(lora_rank=0)\n')
  (tmp_path / 'layers' / 'lora.py').write_text("r = getattr(model, 'lora_rank', 0)\n")
  assert probes(tmp_path) == ['layers/blocks.py:2', 'trainer/step.py:1', 'trainer/step.py:2',
                              'trainer/step.py:3', 'trainer/step.py:4']


def test_a_reference_copy_is_kept_only_without_adapters_for_a_loss_that_needs_one():
  plain, adapted = LoraSpec.of(TransformerLM()), LoraSpec(rank=4, alpha=8.0, targets=('query',))
  assert plain.copies_reference(True) and not plain.copies_reference(False)
  assert not adapted.copies_reference(True) and not adapted.copies_reference(False)
