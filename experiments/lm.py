"""Language models, trained centrally: byte-level on the built-in corpora, and on your own text
with a real tokenizer (`TextLM`, `ShakespeareSentencePiece`)."""

import fiddle as fdl

from configs import models, sizes, tasks
from paxlike.data import LmData, TextData, data_root
from paxlike.data import preference_synth
from paxlike.data.preference_data import PreferenceData
from paxlike.layers import TransformerLM
from paxlike.experiment import Experiment
from paxlike.registry import register
from paxlike.trainer.preference_loss import PreferenceLoss


@register
class StdlibTiny(Experiment):
  """The default job: a 2-layer byte LM on this interpreter's standard library source.

  python -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=/tmp/paxlike/stdlib_tiny
  About 2.5 minutes on 2 CPU cores (4-11 steps/s). eval_loss falls from 5.5 (untrained) to
  1.82 at step 200 and 1.48 at step 600 nats/byte, far below the unigram byte entropy of the
  held-out files (3.03 nats; 3.26 on the training files).
  """

  def task(self):
    return tasks.centralized_task(models.lm_tiny(), num_steps=600, peak_lr=3e-3)

  def datasets(self):
    return fdl.Config(LmData, dataset='stdlib', seq_len=128, batch_size=16)


@register
class StdlibMoe(Experiment):
  """StdlibTiny with mixture-of-experts MLPs: 4 experts of width 192 in each of the 2 layers,
  each byte routed to 2 of them (top-2, capacity factor 1.25), so the active MLP is the
  width of StdlibTiny's (384) while the model holds twice its MLP params.

  python -m paxlike.main --exp=lm.StdlibMoe --job_log_dir=/tmp/paxlike/stdlib_moe
  About 5 minutes on 2 busy CPU cores (~2 steps/s). Seen: eval_loss 1.82 at step 200, 1.50 at
  600 (StdlibTiny: 1.82, 1.48), dropped choices 11% at step 50 and 3-4% from step 400, the
  busiest of the 4 experts 34% of the choices at the end, balance loss 1.04.
  On 8 CPU devices, experts sharded 4 ways (4 expert × 2 data):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m paxlike.main \\
      --exp=lm.StdlibMoe --fdl_fiddler=cpu8_expert --job_log_dir=/tmp/paxlike/stdlib_moe8
  Rows log moe_aux_loss, moe_balance_loss, moe_z_loss, moe_dropped_fraction and
  moe_max_expert_load (docs/models.md, "Mixture of experts").
  """

  def task(self):
    model = models.lm_tiny()
    model.d_ff, model.num_experts, model.experts_per_token = 192, 4, 2
    return tasks.centralized_task(model, num_steps=600, peak_lr=3e-3)

  def datasets(self):
    return fdl.Config(LmData, dataset='stdlib', seq_len=128, batch_size=16)


@register
class ShakespeareTiny(Experiment):
  """A char (byte) LM on Tiny Shakespeare from the data root.

  python -m paxlike.main --exp=lm.ShakespeareTiny --job_log_dir=/tmp/paxlike/shakespeare_tiny
  """

  def task(self):
    return tasks.centralized_task(models.lm_tiny(), num_steps=600, peak_lr=3e-3)

  def datasets(self):
    return fdl.Config(LmData, dataset='shakespeare', seq_len=128, batch_size=16)


class _Llama(Experiment):
  """A Llama-shaped LM of `SIZE` (configs/sizes.py: model, mesh) on bytes of this Python's
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


@register
class Llama125M(_Llama):
  """125M Llama, batch 32 × 2048 on one H200 (data parallel beyond).

  python -m paxlike.main --exp=lm.Llama125M --job_log_dir=/tmp/paxlike/llama125m
  """

  SIZE, BATCH, PEAK_LR = '125m', 32, 6e-4


@register
class Llama350M(_Llama):
  """350M Llama, batch 32 × 2048 on one H200 (FSDP beyond).

  python -m paxlike.main --exp=lm.Llama350M --job_log_dir=/tmp/paxlike/llama350m
  """

  SIZE, BATCH, PEAK_LR = '350m', 32, 3e-4


@register
class Llama1B(_Llama):
  """TinyLlama-1.1B shapes, batch 16 × 2048 on one H200 (FSDP beyond).

  python -m paxlike.main --exp=lm.Llama1B --job_log_dir=/tmp/paxlike/llama1b
  """

  SIZE, BATCH, PEAK_LR = '1b', 16, 3e-4


@register
class Llama8B(_Llama):
  """Llama-3-8B shapes for a pod: FSDP × tensor parallel 4, global batch 256 × 2048
  (`--mode=print_config` prints the memory per device at 8, 64 and 256 devices).

  python -m paxlike.main --exp=lm.Llama8B --job_log_dir=gs://.../llama8b  # via scripts/launch_*
  """

  SIZE, BATCH, PEAK_LR = '8b', 256, 1.5e-4


@register
class TextLM(Experiment):
  """A small Llama-shaped LM on your own text files, packed into 512-token rows, with the
  vocabulary of your tokenizer (README: "Train on your own text").

  python -m paxlike.tokenizers train --files='corpus/*.txt' --vocab_size=4000 \\
      --kind=sentencepiece --out=/tmp/tok
  python -m paxlike.main --exp=lm.TextLM --job_log_dir=/tmp/textlm \\
      --fdl_set=data.files='corpus/*.txt' --fdl_set=data.tokenizer=/tmp/tok/tokenizer.model
  Without overrides: Tiny Shakespeare from the data root, one document per paragraph, bytes.
  """

  STEPS, PEAK_LR, SEQ, BATCH = 2000, 1e-3, 512, 8

  def task(self):
    return tasks.centralized_task(models.lm_small_llama(), num_steps=self.STEPS,
                                  peak_lr=self.PEAK_LR, log_every=10)

  def datasets(self):
    return fdl.Config(TextData, files=str(data_root() / 'tinyshakespeare' / 'input.txt'),
                      txt_document='paragraph', tokenizer='bytes', seq_len=self.SEQ,
                      batch_size=self.BATCH, eval_batch_size=self.BATCH)


@register
class ShakespeareSentencePiece(TextLM):
  """Tiny Shakespeare with a SentencePiece tokenizer trained on it (vocab 2000 → the model's
  2048), each speech a document.

  python -m paxlike.tokenizers train --files=../shared/data/tinyshakespeare/input.txt \\
      --vocab_size=2000 --kind=sentencepiece --out=/tmp/paxlike/shakespeare_sp
  python -m paxlike.main --exp=lm.ShakespeareSentencePiece --job_log_dir=/tmp/shakespeare_sp
  """

  TOKENIZER = '/tmp/paxlike/shakespeare_sp/tokenizer.model'

  def datasets(self):
    cfg = super().datasets()
    cfg.tokenizer = self.TOKENIZER
    return cfg


@register
class FinetuneLlama(Experiment):
  """Continue training a Hugging Face Llama checkpoint (or another paxlike job's params) on your
  own text: the model's shape and the tokenizer come from the checkpoint's directory.

  python -m paxlike.main --exp=lm.FinetuneLlama --job_log_dir=/tmp/finetune \\
      --fdl_set=train.init_from=hf:/path/to/llama --fdl_set=data.files='corpus/*.jsonl'
  `job:DIR` or `job:DIR@STEP` starts from a paxlike job's params. Add
  `--fdl_set=model.lora_rank=16` to train LoRA adapters only.
  """

  REQUIRED = ('train.init_from', 'data.files')
  STEPS, PEAK_LR, SEQ, BATCH = 1000, 2e-5, 1024, 8

  def task(self):
    return tasks.centralized_task(fdl.Config(TransformerLM), num_steps=self.STEPS,
                                  peak_lr=self.PEAK_LR, log_every=10, eval_every=100,
                                  checkpoint_every=100)

  def datasets(self):
    return fdl.Config(TextData, seq_len=self.SEQ, batch_size=self.BATCH,
                      eval_batch_size=self.BATCH)


@register
class SftLlama(FinetuneLlama):
  """Supervised fine-tuning with LoRA (rank 16 on the attention and MLP projections): JSONL
  rows of `prompt` and `completion`, the loss on completion tokens only.

  python -m paxlike.main --exp=lm.SftLlama --job_log_dir=/tmp/sft \\
      --fdl_set=train.init_from=hf:/path/to/llama --fdl_set=data.files='sft/*.jsonl'
  """

  PEAK_LR = 2e-4

  def task(self):
    cfg = super().task()
    cfg.model.lora_rank = 16
    cfg.model.lora_targets = ('query', 'key', 'value', 'out', 'wi_gate', 'wi_up', 'wo')
    return cfg

  def datasets(self):
    cfg = super().datasets()
    cfg.prompt_field, cfg.completion_field = 'prompt', 'completion'
    return cfg


@register
class ChatSftLlama(SftLlama):
  """Chat fine-tuning with LoRA: JSONL rows of `messages` ([{"role": ..., "content": ...}, ...]),
  rendered with the checkpoint's chat template (tokenizer_config.json or chat_template.jinja
  beside its tokenizer.json), the loss on the assistant's tokens only.

  python -m paxlike.main --exp=lm.ChatSftLlama --job_log_dir=/tmp/chat \\
      --fdl_set=train.init_from=hf:/path/to/instruct --fdl_set=data.files='chat/*.jsonl'
  python -m paxlike.main --exp=lm.ChatSftLlama --job_log_dir=/tmp/chat --mode=decode --chat \\
      --fdl_set=train.init_from=hf:/path/to/instruct --fdl_set=data.files='chat/*.jsonl' \\
      --prompt='What is RoPE?'
  """

  def datasets(self):
    cfg = super().datasets()
    cfg.prompt_field, cfg.messages_field = None, 'messages'
    return cfg


@register
class DpoTiny(Experiment):
  """DPO on CPU with nothing to download: LoRA (rank 8, attention) on the 2-layer byte LM, on
  4,000 pairs made from the standard library's source (paxlike/data/preference_synth.py:
  chosen = a module's next line, rejected = that line with its words shuffled).

  python -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=/tmp/paxlike/stdlib_tiny
  python -m paxlike.main --exp=lm.DpoTiny --job_log_dir=/tmp/paxlike/dpo_tiny \\
      --fdl_set=train.init_from=job:/tmp/paxlike/stdlib_tiny
  Seen from StdlibTiny's step 600 (2 busy CPU cores, ~5 minutes): held-out reward accuracy
  0.93 at step 50 and 0.94 at step 300 (margin 1.26 -> 3.48); both implicit rewards fall
  (chosen -5.4, rejected -8.9 at step 300): DPO lowers the chosen line's likelihood below the
  reference's too, the rejected one's faster. Without init_from the base is the untrained
  model (the reference is then that random base).
  `--fdl_set=loss.kind=simpo` (or ipo, orpo; loss.beta, loss.gamma, loss.label_smoothing)
  trains a variant. Rows log rewards/chosen, rewards/rejected, rewards/margins,
  rewards/accuracies, logps/chosen and logps/rejected, and the same on held-out pairs (eval_).
  """

  STEPS, PEAK_LR = 300, 2e-3

  def task(self):
    model = models.lm_tiny()
    model.lora_rank, model.lora_targets = 8, ('query', 'key', 'value', 'out')
    cfg = tasks.centralized_task(model, num_steps=self.STEPS, peak_lr=self.PEAK_LR,
                                 log_every=10, eval_every=50, checkpoint_every=100)
    cfg.loss = fdl.Config(PreferenceLoss, kind='dpo', beta=0.1)
    return cfg

  def datasets(self):
    return fdl.Config(PreferenceData, files=preference_synth.STDLIB_PAIRS,
                      tokenizer='bytes', seq_len=128, batch_size=16, eval_batch_size=16,
                      num_eval_batches=8)


@register
class DpoLlama(FinetuneLlama):
  """DPO of a Hugging Face checkpoint with LoRA (rank 16 on the attention and MLP projections;
  the reference is the checkpoint itself, the adapters off): JSONL rows of `prompt`, `chosen`,
  `rejected` strings, or chat pairs (`chosen`/`rejected` message lists, rendered with the
  checkpoint's chat template; README "Preference tuning (DPO)").

  python -m paxlike.main --exp=lm.DpoLlama --job_log_dir=/tmp/dpo \\
      --fdl_set=train.init_from=hf:/path/to/llama --fdl_set=data.files='pairs/*.jsonl'
  """

  STEPS, PEAK_LR, SEQ, BATCH = 1000, 5e-5, 1024, 8

  def task(self):
    cfg = super().task()
    cfg.model.lora_rank = 16
    cfg.model.lora_targets = ('query', 'key', 'value', 'out', 'wi_gate', 'wi_up', 'wo')
    cfg.loss = fdl.Config(PreferenceLoss, kind='dpo', beta=0.1)
    return cfg

  def datasets(self):
    return fdl.Config(PreferenceData, seq_len=self.SEQ, batch_size=self.BATCH,
                      eval_batch_size=self.BATCH)
