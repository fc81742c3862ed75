"""Parts the LM experiments (paxlike/experiments/lm.py) share; registers nothing, so no key
starts here.

`ByteLm` and `LlamaBase`: the byte LMs' and the large Llama runs' base classes;
`ALL_PROJECTIONS`: the LoRA targets of the fine-tunes; the tiny post-training tasks' configs
(DPO and GRPO on CPU, nothing to download).
"""

import fiddle as fdl

from paxlike.configs import models, sizes, tasks
from paxlike.data import LmData, TextData
from paxlike.data import arithmetic_synth, preference_synth
from paxlike.data.preference_data import PreferenceData
from paxlike.data.prompt_data import PromptData
from paxlike.data.text_files import Fields
from paxlike.experiment import Experiment
from paxlike.trainer import rewards
from paxlike.trainer.grpo_loss import GrpoLoss
from paxlike.trainer.preference_loss import PreferenceLoss

# LoRA on every projection of attention and the (gated) MLP: what the Llama fine-tunes adapt.
ALL_PROJECTIONS = ('query', 'key', 'value', 'out', 'wi_gate', 'wi_up', 'wo')


class ByteLm(Experiment):
  """The 2-layer byte LM (600 steps) on the built-in corpus `DATASET`, 128-byte rows, 16 a
  step."""

  DATASET = 'stdlib'

  def task(self):
    return tasks.centralized_task(models.lm_tiny(), num_steps=600, peak_lr=3e-3)

  def datasets(self):
    return fdl.Config(LmData, dataset=self.DATASET, seq_len=128, batch_size=16)


class LlamaBase(Experiment):
  """A Llama-shaped LM of `SIZE` (paxlike/configs/sizes.py: model, mesh) on bytes of this Python's
  standard library, at seq 2048 in bfloat16 (float32 params), `BATCH` sequences per step.

  The data is byte-level (token ids < 256, so most of the 32k vocab is idle). For a real
  tokenizer, plug in a data source of token ids with the same fields as `LmData` (e.g. a tfds
  builder of SentencePiece-encoded text) and set `model.vocab_size` to its vocabulary.
  `--mode=print_config` prints the per-device memory estimate (paxlike/memory.py).
  """

  SIZE, BATCH, PEAK_LR = '1b', 16, 3e-4

  def task(self):
    size = sizes.SIZES[self.SIZE]
    cfg = tasks.centralized_task(size.model(), num_steps=20_000, peak_lr=self.PEAK_LR,
                                 log_every=10, eval_every=1000, checkpoint_every=1000)
    cfg.mesh = size.mesh()
    return cfg

  def datasets(self):
    return fdl.Config(LmData, dataset='stdlib', seq_len=2048, batch_size=self.BATCH,
                      eval_batch_size=self.BATCH)


def dpo_tiny_task(steps: int, peak_lr: float) -> fdl.Config:
  """LoRA (rank 8, attention) on the 2-layer byte LM, DPO at beta 0.1."""
  model = models.lm_tiny()
  model.lora_rank, model.lora_targets = 8, ('query', 'key', 'value', 'out')
  cfg = tasks.centralized_task(model, num_steps=steps, peak_lr=peak_lr, log_every=10,
                               eval_every=50, checkpoint_every=100)
  cfg.loss = fdl.Config(PreferenceLoss, kind='dpo', beta=0.1)
  return cfg


def stdlib_pairs_data() -> fdl.Config:
  """The 4,000 pairs made from the standard library (paxlike/data/preference_synth.py)."""
  return fdl.Config(PreferenceData, files=preference_synth.STDLIB_PAIRS, tokenizer='bytes',
                    seq_len=128, batch_size=16, eval_batch_size=16, num_eval_batches=8)


def arithmetic_sft_task() -> fdl.Config:
  """The 2-layer byte LM, 300 steps; GrpoTiny starts from its step 200, short of exact, so
  GRPO has room (docs/reproductions/grpo.md)."""
  return tasks.centralized_task(models.lm_tiny(), num_steps=300, peak_lr=3e-3, log_every=20,
                                eval_every=100, checkpoint_every=100)


def arithmetic_sft_data() -> fdl.Config:
  """The additions file (paxlike/data/arithmetic_synth.py) as SFT rows: prompt 'a+b=', the
  loss on the answer and its EOS (a newline, bytes)."""
  return fdl.Config(TextData, files=arithmetic_synth.DEFAULT_FILE,
                    fields=fdl.Config(Fields, prompt_field='prompt', completion_field='completion'),
                    tokenizer='bytes', seq_len=64,
                    batch_size=32, eval_batch_size=32, eval_fraction=0.05, num_eval_batches=4)


def grpo_loss(**fields) -> fdl.Config:
  """GrpoLoss scored by the exact match of the final answer (the rows' `answer`)."""
  return fdl.Config(GrpoLoss, reward_fns=(rewards.exact_match,), **fields)


def grpo_tiny_task(steps: int, peak_lr: float) -> fdl.Config:
  """LoRA (rank 8, every projection) on the 2-layer byte LM, GRPO at G=8, 4 new tokens."""
  model = models.lm_tiny()
  model.lora_rank, model.lora_targets = 8, ALL_PROJECTIONS
  cfg = tasks.centralized_task(model, num_steps=steps, peak_lr=peak_lr, log_every=10,
                               eval_every=50, checkpoint_every=50)
  cfg.loss = grpo_loss(num_generations=8, max_completion_length=4, temperature=1.0,
                       beta=0.04, epsilon=0.2)
  return cfg


def arithmetic_prompts() -> fdl.Config:
  """The additions file's prompts (answers held for exact_match), 16 a step."""
  return fdl.Config(PromptData, files=arithmetic_synth.DEFAULT_FILE, tokenizer='bytes',
                    seq_len=8, batch_size=16, eval_batch_size=32, num_eval_batches=4,
                    eval_fraction=0.05)
