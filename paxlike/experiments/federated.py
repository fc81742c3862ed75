"""Federated and distributed training: FedAvg(M), FedAdam/Yogi/Adagrad, FedProx, SCAFFOLD,
DP-FedAvg, DiLoCo, PAPA, BTM; one step = one round. Results: docs/federated_results.md.

The data sets a round's shape (`--fdl_set=data.local_steps=8 --fdl_set=data.clients_per_round=16`);
a fixed-cohort algorithm names its count too, and a mismatch is refused (DiLoCo on 8 domains:
`algorithm.num_replicas=8 data.clients_per_round=8 data.num_clients=8`). Rates:
`optimizer.learning_rate` (clients), `algorithm.server_optimizer.learning_rate`. A `clients`
mesh axis on 8 devices: `--fdl_set=mesh.ici=(2,4) --fdl_set="mesh.axes=('clients','data')"`.
"""

import fiddle as fdl

from paxlike.configs import models, optimizers, tasks
from paxlike.experiments._federated_parts import (DOMAINS, EVERY, ROUNDS, Digits, Federated,
                                                  Shakespeare)
from paxlike.data import ImageData, LmData, TextData, data_root
from paxlike.data import preference_synth
from paxlike.data.preference_data import PreferenceData
from paxlike.data.text_files import Fields
from paxlike.layers import TransformerLM
from paxlike.registry import register
from paxlike.trainer.preference_loss import PreferenceLoss

@register
class ShakespeareFedAvg(Shakespeare):
  """FedAvg, 8 of 147 roles per round, 4 local AdamW steps (constant lr 3e-3), server lr 1.

  python -m paxlike.main --exp=federated.ShakespeareFedAvg --job_log_dir=/tmp/fedavg"""


@register
class ShakespeareFedAdam(Shakespeare):
  """FedAdam: FedAvg's clients with a server Adam (lr 1e-2, τ 1e-3), exactly as Reddi et al.'s
  Algorithm 2 (`--fdl_set=algorithm.flavour=optax` for optax's bias-corrected Adam).

  python -m paxlike.main --exp=federated.ShakespeareFedAdam --job_log_dir=/tmp/fedadam"""
  ALGORITHM = 'fed_adam'


@register
class ShakespeareFedYogi(Shakespeare):
  """FedYogi: FedAdam's setup with Yogi's additive second moment (Algorithm 2, lr 1e-2, τ 1e-3).

  python -m paxlike.main --exp=federated.ShakespeareFedYogi --job_log_dir=/tmp/fedyogi"""
  ALGORITHM = 'fed_yogi'


@register
class ShakespeareFedAdagrad(Shakespeare):
  """FedAdagrad: FedAdam's setup with Adagrad's growing second moment and server momentum 0.9
  (Algorithm 2, lr 1e-2, τ 1e-3).

  python -m paxlike.main --exp=federated.ShakespeareFedAdagrad --job_log_dir=/tmp/fedadagrad"""
  ALGORITHM = 'fed_adagrad'


@register
class ShakespeareFedAvgM(Shakespeare):
  """FedAvgM: FedAvg with server momentum (SGD lr 1, β 0.9, Hsu et al. 2019).

  python -m paxlike.main --exp=federated.ShakespeareFedAvgM --job_log_dir=/tmp/fedavgm"""
  ALGORITHM = 'fed_avgm'


@register
class ShakespeareFedProx(Shakespeare):
  """FedProx (Li et al. 2020): ShakespeareFedAvg with μ/2‖w − w_global‖² (μ = 0.01) in every
  client's objective, holding heterogeneous clients near the global model.

  python -m paxlike.main --exp=federated.ShakespeareFedProx --job_log_dir=/tmp/fedprox"""
  PROX_MU = 0.01


@register
class ShakespeareDiLoCo(Shakespeare):
  """DiLoCo: 4 replicas, each on a fixed quarter of the roles (non-IID domains), 8 inner AdamW
  steps per round, outer Nesterov SGD (lr 0.7, momentum 0.9).

  python -m paxlike.main --exp=federated.ShakespeareDiLoCo --job_log_dir=/tmp/diloco"""
  ALGORITHM, COHORT, DATA = 'diloco', ('num_replicas', 4), dict(DOMAINS, local_steps=8)


@register
class ShakespearePapa(Shakespeare):
  """PAPA: a population of 4 on the pooled speeches, each from its own random init, windows and
  AdamW state; every 2 rounds of 5 local steps (the paper's 10 SGD steps) each member moves 1%
  to the mean (α 0.99). PAPA-all / PAPA-2 (`algorithm.variant='all'` / `'pairs'`) average every
  few epochs: `algorithm.every` = epochs × steps per epoch / 5.

  python -m paxlike.main --exp=federated.ShakespearePapa --job_log_dir=/tmp/papa"""
  ALGORITHM, ALGORITHM_ARGS, COHORT = 'papa', dict(alpha=0.99, every=2), ('population', 4)
  DATA = dict(partition='pooled', local_steps=5)


@register
class ShakespeareBtm(Shakespeare):
  """Branch-train-merge: a seed trained on all domains for 10 rounds, then 4 experts branched
  from it, one per domain of roles (runs of plays); evaluated as their size-weighted average
  (eval_loss) and as the ensemble weighted by the domain posterior (eval_ensemble_loss).

  python -m paxlike.main --exp=federated.ShakespeareBtm --job_log_dir=/tmp/btm"""
  ALGORITHM, ALGORITHM_ARGS, COHORT = 'btm', dict(seed_steps=10), ('num_experts', 4)
  DATA = dict(DOMAINS, local_steps=4)


@register
class ShakespeareCentralized(Shakespeare):
  """The baseline: the same model trained centrally on the pooled speeches with the clients'
  optimizer (AdamW, constant lr 3e-3), one step of batch 32 per round.

  python -m paxlike.main --exp=federated.ShakespeareCentralized --job_log_dir=/tmp/central"""
  def task(self):
    cfg = tasks.centralized_task(self.model(), num_steps=ROUNDS, **EVERY)
    cfg.optimizer = self.OPTIMIZER(*self.OPTIMIZER_ARGS)
    return cfg

  def datasets(self):
    return fdl.Config(LmData, dataset='shakespeare', seq_len=64, batch_size=32)


@register
class StdlibDiLoCo(Shakespeare):
  """DiLoCo on the standard library: 4 replicas sampling the pooled source independently (the
  data-parallel setting of the paper), 8 inner AdamW steps, outer Nesterov SGD.

  python -m paxlike.main --exp=federated.StdlibDiLoCo --job_log_dir=/tmp/stdlib_diloco"""
  ALGORITHM, COHORT, DATA = 'diloco', ('num_replicas', 4), dict(local_steps=8)

  def datasets(self):
    return fdl.Config(LmData, dataset='stdlib', partition='pooled', seq_len=64, batch_size=8,
                      **self.data_fields())


@register
class ShakespeareDpFedAvg(Shakespeare):
  """DP-FedAvg on Shakespeare: all 147 roles every round (no amplification), updates clipped
  adaptively (to the median norm, from C = 0.5), summed, noised at z = 8: client-level DP at
  δ = 1e-5 by RDP (`dp_epsilon` in metrics.jsonl; `--mode=print_config` prints the run's). The
  noise's share grows as √(params) / cohort, so the LM is 1 layer, 32 wide (~20k parameters).

  python -m paxlike.main --exp=federated.ShakespeareDpFedAvg --job_log_dir=/tmp/dp_fedavg"""
  MODEL_FIELDS = dict(num_layers=1, d_model=32, num_heads=2, d_ff=64)
  DATA = dict(clients_per_round=147, sampling='fixed', local_steps=4)
  DP = dict(clip_norm=0.5, noise_multiplier=8.0, delta=1e-5)


@register
class DigitsFedAvg(Digits):
  """FedAvg of an MLP on scikit-learn's digits: 20 clients with Dirichlet(α=0.3) label skew,
  5 per round, 5 local SGD steps (lr 0.1) of batch 16.

  python -m paxlike.main --exp=federated.DigitsFedAvg --job_log_dir=/tmp/digits"""
  DATA = dict(num_clients=20, clients_per_round=5)


@register
class DigitsDpFedAvg(Digits):
  """DP-FedAvg on digits: 400 clients of 3–4 images, 100 a round drawn without replacement, a
  32-unit MLP (fewer coordinates to noise); updates clipped adaptively (from C = 0.5), noised at
  z = 6. Refused at start if the run would spend more than ε = 10 at δ = 1e-5.

  python -m paxlike.main --exp=federated.DigitsDpFedAvg --job_log_dir=/tmp/digits_dp"""
  MODEL_FIELDS = dict(hidden=(32,))
  DATA = dict(num_clients=400, clients_per_round=100)
  DP = dict(clip_norm=0.5, noise_multiplier=6.0, delta=1e-5, max_epsilon=10.0)


@register
class DigitsScaffold(Digits):
  """SCAFFOLD on DigitsFedAvg's 20 clients, all every round (its control variates are per
  client), 5 local SGD steps (lr 0.1) along the drift-corrected gradient g − cᵢ + c.

  python -m paxlike.main --exp=federated.DigitsScaffold --job_log_dir=/tmp/digits_scaffold"""
  ALGORITHM, COHORT, DATA = 'scaffold', ('num_clients', 20), dict(num_clients=20, sampling='fixed')


@register
class FashionMnistFedAvg(Federated):
  """FedAvg of McMahan et al.'s CNN narrowed to 16/32 channels, 128 units (32/64/512 takes ~35 s
  a round on 2 CPU cores) on Fashion-MNIST: 100 clients of 2 label-sorted shards, 10 per round,
  2 local SGD steps (lr 0.05) of batch 16; eval on the first 2,048 test images.

  python -m paxlike.main --exp=federated.FashionMnistFedAvg --job_log_dir=/tmp/fmnist"""
  MODEL, MODEL_FIELDS = staticmethod(models.cnn), dict(features=(16, 32), dense=128)
  OPTIMIZER, OPTIMIZER_ARGS = staticmethod(optimizers.sgd), (0.05,)

  def datasets(self):
    return fdl.Config(ImageData, dataset='fashion_mnist', partition='shards', num_clients=100,
                      shards_per_client=2, clients_per_round=10, local_steps=2, batch_size=16,
                      eval_batch_size=256, num_eval_batches=8)


@register
class TextFedAvg(Federated):
  """FedAvg on a tokenized corpus: 4 clients a round, 4 local steps of 8 packed 128-token rows,
  the model's vocabulary from the tokenizer. Natural clients: one per file
  (`data.partition=file`) or per value of a JSONL field (`data.partition=field
  data.fields.client_field=author`); by default Tiny Shakespeare's paragraphs, pooled, in bytes.

  python -m paxlike.main --exp=federated.TextFedAvg --job_log_dir=/tmp/textfedavg \\
      --fdl_set=data.files='corpus/*.jsonl' --fdl_set=data.tokenizer=/tmp/tok/tokenizer.json \\
      --fdl_set=data.partition=field --fdl_set=data.fields.client_field=author"""
  MODEL_FIELDS = {'vocab_size': None}
  DATA = dict(clients_per_round=4, local_steps=4)

  def datasets(self):
    return fdl.Config(TextData, files=str(data_root() / 'tinyshakespeare' / 'input.txt'),
                      fields=fdl.Config(Fields, txt_document='paragraph'), seq_len=128,
                      batch_size=8, **self.data_fields())


@register
class TextDpFedAvg(TextFedAvg):
  """DP-FedAvg on your own corpus: each author (`data.fields.client_field`, a JSONL field) is a
  client, the unit of privacy; each round every author joins with probability
  clients_per_round / authors (Poisson sampling, which the accountant's amplification assumes);
  updates are clipped adaptively from C = 0.5 and noised at z = 1, at δ = authors^-1.1
  (`dp_epsilon` in metrics.jsonl; `--mode=print_config` prints the run's). A small ε needs
  thousands of authors; `algorithm.aggregator.max_epsilon` refuses a run that would spend more.

  python -m paxlike.main --exp=federated.TextDpFedAvg --job_log_dir=/tmp/textdp \\
      --fdl_set=data.files='corpus/*.jsonl' --fdl_set=data.tokenizer=/tmp/tok/tokenizer.json \\
      --fdl_set=data.fields.client_field=author"""
  REQUIRED = ('data.files', 'data.fields.client_field')
  DATA = dict(clients_per_round=16, local_steps=4, partition='field', sampling='poisson')
  DP = dict(clip_norm=0.5, noise_multiplier=1.0)

  def datasets(self):
    return fdl.Config(TextData, seq_len=128, batch_size=8, **self.data_fields())


@register
class TextLoraFedAvg(TextFedAvg):
  """Federated LoRA: TextFedAvg's rounds over rank-8 adapters on the attention projections, the
  base frozen (broadcast once, never updated or uploaded; paxlike/federated/lora.py). The base
  comes from a pretrained job or HF checkpoint (`train.init_from`); the clients upload only the
  adapters (`python -m paxlike.export` says how many bytes in plan.json).

  python -m paxlike.main --exp=federated.TextLoraFedAvg --job_log_dir=/tmp/lorafed \\
      --fdl_set=train.init_from=job:/tmp/textfedavg"""
  MODEL_FIELDS = {'vocab_size': None, 'lora_rank': 8,
                  'lora_targets': ('query', 'key', 'value', 'out')}


def source_shaped_lm() -> fdl.Config:
  """A TransformerLM config that sets no field: with `train.init_from` every shape field and the
  data's tokenizer come from the source (main.fill_from_init_source fills only fields a config
  leaves unset), as lm.DpoLlama's; without one, TransformerLM's defaults (a 2-layer byte LM)."""
  return fdl.Config(TransformerLM)


@register
class DpoLoraFedAvg(TextLoraFedAvg):
  """Federated preference tuning: FedAvg of DPO clients over TextLoraFedAvg's adapters (rank 8,
  attention), the base frozen and never uploaded; each client's reference is the base, its
  adapters off, so no client holds a second copy of the model. Each client is a preference
  file (`data.partition=file`) or a value of a row field (`data.partition=field
  data.client_field=NAME`); by default the stdlib pairs of lm.DpoTiny, a client per module.
  The model's shape and the tokenizer are the source's (`train.init_from=hf:DIR` or
  `job:DIR`, as lm.DpoLlama); without a source, a 2-layer byte LM.

  python -m paxlike.main --exp=federated.DpoLoraFedAvg --job_log_dir=/tmp/dpofed \\
      --fdl_set=train.init_from=hf:/path/to/llama --fdl_set=data.files='pairs/*.jsonl' \\
      --fdl_set=data.partition=field --fdl_set=data.client_field=user
  """
  MODEL = staticmethod(source_shaped_lm)
  MODEL_FIELDS = {'lora_rank': 8, 'lora_targets': ('query', 'key', 'value', 'out')}

  def task(self):
    cfg = super().task()
    cfg.loss = fdl.Config(PreferenceLoss, kind='dpo', beta=0.1)
    return cfg

  def datasets(self):  # The tokenizer unset: bytes, or the source's.
    fields = {'partition': 'field', 'client_field': 'module', **self.data_fields()}
    return fdl.Config(PreferenceData, files=preference_synth.STDLIB_PAIRS, seq_len=128,
                      batch_size=8, **fields)
