"""Language models, trained centrally: byte-level on the built-in corpora, and on your own text
with a real tokenizer (`TextLM`, `ShakespeareSentencePiece`); fine-tuned (SFT, LoRA) and
post-trained (DPO, GRPO). Shared parts: paxlike/experiments/_lm_parts.py."""

import fiddle as fdl

from paxlike.configs import models, tasks
from paxlike.experiments import _lm_parts
from paxlike.experiments._lm_parts import ALL_PROJECTIONS, ByteLm, LlamaBase as _Llama
from paxlike.data import TextData, data_root
from paxlike.data.preference_data import PreferenceData
from paxlike.data.prompt_data import PromptData
from paxlike.data.text_files import Fields
from paxlike.layers import TransformerLM
from paxlike.experiment import Experiment
from paxlike.registry import register
from paxlike.trainer.preference_loss import PreferenceLoss


@register
class StdlibTiny(ByteLm):
  """The default job: a 2-layer byte LM on this interpreter's standard library source.

  python -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=/tmp/paxlike/stdlib_tiny
  About 2.5 minutes on 2 CPU cores (4-11 steps/s). eval_loss falls from 5.5 (untrained) to
  1.82 at step 200 and 1.48 at step 600 nats/byte, far below the unigram byte entropy of the
  held-out files (3.03 nats; 3.26 on the training files).
  """


@register
class StdlibMoe(ByteLm):
  """StdlibTiny with mixture-of-experts MLPs: 4 experts of width 192 in each of the 2 layers,
  each byte routed to 2 of them (top-2, capacity factor 1.25), so the active MLP is the
  width of StdlibTiny's (384) while the model holds twice its MLP params.

  python -m paxlike.main --exp=lm.StdlibMoe --job_log_dir=/tmp/paxlike/stdlib_moe
  On 8 CPU devices, experts sharded 4 ways (4 expert × 2 data):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m paxlike.main \\
      --exp=lm.StdlibMoe --fdl_fiddler=cpu8_expert --job_log_dir=/tmp/paxlike/stdlib_moe8
  Rows log moe_aux_loss, moe_balance_loss, moe_z_loss, moe_dropped_fraction and
  moe_max_expert_load; what a run gives: docs/models.md, "Mixture of experts".
  """

  def task(self):
    model = models.lm_tiny()
    model.d_ff, model.num_experts, model.experts_per_token = 192, 4, 2
    return tasks.centralized_task(model, num_steps=600, peak_lr=3e-3)


@register
class ShakespeareTiny(ByteLm):
  """A char (byte) LM on Tiny Shakespeare from the data root.

  python -m paxlike.main --exp=lm.ShakespeareTiny --job_log_dir=/tmp/paxlike/shakespeare_tiny
  """

  DATASET = 'shakespeare'


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
                      fields=fdl.Config(Fields, txt_document='paragraph'), tokenizer='bytes',
                      seq_len=self.SEQ, batch_size=self.BATCH, eval_batch_size=self.BATCH)


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
    cfg.model.lora_rank, cfg.model.lora_targets = 16, ALL_PROJECTIONS
    return cfg

  def datasets(self):
    cfg = super().datasets()
    cfg.fields = fdl.Config(Fields, prompt_field='prompt', completion_field='completion')
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
    cfg.fields = fdl.Config(Fields, messages_field='messages')
    return cfg


@register
class DpoTiny(Experiment):
  """DPO on CPU with nothing to download: LoRA (rank 8, attention) on the 2-layer byte LM, on
  4,000 pairs made from the standard library's source (paxlike/data/preference_synth.py:
  chosen = a module's next line, rejected = that line with its words shuffled).

  python -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=/tmp/paxlike/stdlib_tiny
  python -m paxlike.main --exp=lm.DpoTiny --job_log_dir=/tmp/paxlike/dpo_tiny \\
      --fdl_set=train.init_from=job:/tmp/paxlike/stdlib_tiny
  What it gives (held-out reward accuracy from 0.5 to above 0.9, both implicit rewards falling,
  the rejected faster): docs/reproductions/dpo.md. Without init_from the base is the untrained
  model (the reference is then that random base).
  `--fdl_set=loss.kind=simpo` (or ipo, orpo; loss.beta, loss.gamma, loss.label_smoothing)
  trains a variant. Rows log rewards/chosen, rewards/rejected, rewards/margins,
  rewards/accuracies, logps/chosen and logps/rejected, and the same on held-out pairs (eval_).
  """

  STEPS, PEAK_LR = 300, 2e-3

  def task(self):
    return _lm_parts.dpo_tiny_task(self.STEPS, self.PEAK_LR)

  def datasets(self):
    return _lm_parts.stdlib_pairs_data()


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
    cfg.model.lora_rank, cfg.model.lora_targets = 16, ALL_PROJECTIONS
    cfg.loss = fdl.Config(PreferenceLoss, kind='dpo', beta=0.1)
    return cfg

  def datasets(self):
    return fdl.Config(PreferenceData, seq_len=self.SEQ, batch_size=self.BATCH,
                      eval_batch_size=self.BATCH)


@register
class ArithmeticSft(Experiment):
  """SFT of the 2-layer byte LM on short additions ('37+58=' -> '95'), the start of GrpoTiny.

  python -m paxlike.data.arithmetic_synth  # writes /tmp/paxlike/arithmetic/arithmetic.jsonl
  python -m paxlike.main --exp=lm.ArithmeticSft --job_log_dir=/tmp/paxlike/arithmetic_sft
  """

  def task(self):
    return _lm_parts.arithmetic_sft_task()

  def datasets(self):
    return _lm_parts.arithmetic_sft_data()


@register
class GrpoTiny(Experiment):
  """GRPO on CPU, nothing to download: LoRA on ArithmeticSft's model, 16 additions a step, 8
  sampled answers each, rewarded 1 for the exact sum (paxlike.trainer.rewards.exact_match).

  python -m paxlike.main --exp=lm.GrpoTiny --job_log_dir=/tmp/paxlike/grpo_tiny \\
      --fdl_set=train.init_from=job:/tmp/paxlike/arithmetic_sft@200
  (after ArithmeticSft's commands; the reward curve: docs/reproductions/grpo.md). Rows log
  reward (mean), reward_std, reward_max, kl, clip_ratio, completion_length; eval_loss is the
  held-out answers' NLL and eval_reward the mean reward of greedy completions of the held-out
  prompts; samples.jsonl holds each logged step's first completions with their rewards.
  """

  STEPS, PEAK_LR = 200, 2e-3

  def task(self):
    return _lm_parts.grpo_tiny_task(self.STEPS, self.PEAK_LR)

  def datasets(self):
    return _lm_parts.arithmetic_prompts()


@register
class GrpoLlama(FinetuneLlama):
  """GRPO of a Hugging Face checkpoint with LoRA (rank 16 on every projection; the reference
  is the checkpoint, the adapters off): JSONL rows of `prompt` (or chat `messages`) and
  `answer`, rewarded by the exact match of the final answer (README "RL with verifiable
  rewards (GRPO)").

  python -m paxlike.main --exp=lm.GrpoLlama --job_log_dir=/tmp/grpo \\
      --fdl_set=train.init_from=hf:/path/to/llama --fdl_set=data.files='prompts/*.jsonl'
  """

  STEPS, PEAK_LR = 500, 1e-5

  def task(self):
    cfg = super().task()
    cfg.model.lora_rank, cfg.model.lora_targets = 16, ALL_PROJECTIONS
    cfg.loss = _lm_parts.grpo_loss(num_generations=8, max_completion_length=256)
    return cfg

  def datasets(self):
    return fdl.Config(PromptData, seq_len=512, batch_size=8, eval_batch_size=8)
