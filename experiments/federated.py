"""Federated and distributed training: FedAvg(M), FedAdam/Yogi/Adagrad, DiLoCo, PAPA, BTM; one
step = one round.

Every Shakespeare experiment trains the same 2-layer byte transformer (`configs.models.lm_tiny`)
on Tiny Shakespeare split by speaking role, evaluated on the pooled held-out speeches. Each
runs 100 rounds by default, a few minutes on 2 CPU cores. The data sets a round's shape, e.g.
`--fdl_set=data.local_steps=8 --fdl_set=data.clients_per_round=16`; a fixed-cohort algorithm
names its count too, and a mismatch is refused (DiLoCo on 8 fixed domains:
`algorithm.num_replicas=8`, `data.clients_per_round=8`, `data.num_clients=8`). Also
`--fdl_set=optimizer.learning_rate=1e-3` (client),
`--fdl_set=algorithm.server_optimizer.learning_rate=0.5`. A `clients` mesh axis on 8 devices:
`--fdl_set=mesh.ici=(2,4) --fdl_set="mesh.axes=('clients','data')"`.
"""

import fiddle as fdl

from configs import federated as fed
from configs import models, optimizers, tasks
from paxlike.data import ImageData, LmData
from paxlike.experiment import Experiment
from paxlike.federated.dp import DpAggregator
from paxlike.registry import register

ROUNDS = 100
EVERY = dict(log_every=10, eval_every=25, checkpoint_every=25)


def shakespeare(**kwargs) -> fdl.Config[LmData]:
  """Shakespeare by role, 64-byte windows, 8 per client batch; `kwargs` set the rest."""
  return fdl.Config(LmData, **{'dataset': 'shakespeare', 'partition': 'natural',
                               'seq_len': 64, 'batch_size': 8, **kwargs})


@register
class ShakespeareFedAvg(Experiment):
  """FedAvg, 8 of 147 roles per round, 4 local AdamW steps (constant lr 3e-3), server lr 1.

  python -m paxlike.main --exp=federated.ShakespeareFedAvg --job_log_dir=/tmp/fedavg
  With --fdl_set=train.num_steps=30: eval_loss 2.28 (untrained 5.55), docs/federated_results.md.
  """

  def task(self):
    return tasks.task(models.lm_tiny(), fed.fed_avg(),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(clients_per_round=8, local_steps=4)


@register
class ShakespeareFedAdam(Experiment):
  """FedAdam: FedAvg's clients with a server Adam (lr 1e-2, τ 1e-3), exactly as Reddi et al.'s
  Algorithm 2 (`--fdl_set=algorithm.flavour=optax` for optax's bias-corrected Adam).

  python -m paxlike.main --exp=federated.ShakespeareFedAdam --job_log_dir=/tmp/fedadam
  With --fdl_set=train.num_steps=30: see docs/federated_results.md (untrained 5.55).
  """

  def task(self):
    return tasks.task(models.lm_tiny(), fed.fed_adam(),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(clients_per_round=8, local_steps=4)


@register
class ShakespeareFedYogi(Experiment):
  """FedYogi: FedAdam's setup with Yogi's additive second moment (Algorithm 2, lr 1e-2, τ 1e-3).

  python -m paxlike.main --exp=federated.ShakespeareFedYogi --job_log_dir=/tmp/fedyogi
  With --fdl_set=train.num_steps=30: see docs/federated_results.md (untrained 5.55).
  """

  def task(self):
    return tasks.task(models.lm_tiny(), fed.fed_yogi(),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(clients_per_round=8, local_steps=4)


@register
class ShakespeareFedAdagrad(Experiment):
  """FedAdagrad: FedAdam's setup with Adagrad's growing second moment and server momentum 0.9
  (Algorithm 2, lr 1e-2, τ 1e-3).

  python -m paxlike.main --exp=federated.ShakespeareFedAdagrad --job_log_dir=/tmp/fedadagrad
  With --fdl_set=train.num_steps=30: see docs/federated_results.md (untrained 5.55).
  """

  def task(self):
    return tasks.task(models.lm_tiny(), fed.fed_adagrad(),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(clients_per_round=8, local_steps=4)


@register
class ShakespeareFedAvgM(Experiment):
  """FedAvgM: FedAvg with server momentum (SGD lr 1, β 0.9, Hsu et al. 2019).

  python -m paxlike.main --exp=federated.ShakespeareFedAvgM --job_log_dir=/tmp/fedavgm
  With --fdl_set=train.num_steps=30: see docs/federated_results.md (untrained 5.55).
  """

  def task(self):
    return tasks.task(models.lm_tiny(), fed.fed_avgm(),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(clients_per_round=8, local_steps=4)


@register
class ShakespeareDiLoCo(Experiment):
  """DiLoCo: 4 replicas, each on a fixed quarter of the roles (non-IID domains), 8 inner AdamW
  steps per round, outer Nesterov SGD (lr 0.7, momentum 0.9).

  python -m paxlike.main --exp=federated.ShakespeareDiLoCo --job_log_dir=/tmp/diloco
  With --fdl_set=train.num_steps=30: eval_loss 2.26 (untrained 5.55), docs/federated_results.md.
  """
  REPLICAS = 4

  def task(self):
    return tasks.task(models.lm_tiny(), fed.diloco(num_replicas=self.REPLICAS),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(partition='domains', num_clients=self.REPLICAS, sampling='fixed',
                       clients_per_round=self.REPLICAS, local_steps=8)


@register
class ShakespearePapa(Experiment):
  """PAPA: a population of 4 on the pooled speeches, each from its own random init with its own
  windows and AdamW state; every 2 rounds of 5 local steps, i.e. every 10 SGD steps (the
  paper's PAPA period, counted in SGD steps), each member moves 1% to the mean (α 0.99). For
  PAPA-all or PAPA-2 (`algorithm.variant='all'` or `'pairs'`) the paper's period is a few
  epochs instead: `algorithm.every` = epochs × steps per epoch / 5.

  python -m paxlike.main --exp=federated.ShakespearePapa --job_log_dir=/tmp/papa
  With --fdl_set=train.num_steps=30: eval_loss 3.94 (a poor soup of 4 unrelated inits this early;
  2.38 with --fdl_set=algorithm.same_init=True), docs/federated_results.md.
  """
  POPULATION = 4

  def task(self):
    algorithm = fed.papa(population=self.POPULATION, alpha=0.99, every=2)
    return tasks.task(models.lm_tiny(), algorithm, optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(partition='pooled', clients_per_round=self.POPULATION, local_steps=5)


@register
class ShakespeareBtm(Experiment):
  """Branch-train-merge: a seed model trained on all domains for the first 10 rounds, then 4
  experts branched from it, each on one domain of roles (runs of the text, roughly groups
  of plays). Evaluated as their size-weighted parameter average (eval_loss) and as the ensemble
  weighted by the domain posterior (eval_ensemble_loss).

  python -m paxlike.main --exp=federated.ShakespeareBtm --job_log_dir=/tmp/btm
  With --fdl_set=train.num_steps=30: see docs/federated_results.md (untrained 5.55).
  """
  EXPERTS = 4

  def task(self):
    return tasks.task(models.lm_tiny(), fed.btm(num_experts=self.EXPERTS, seed_steps=10),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(partition='domains', num_clients=self.EXPERTS, sampling='fixed',
                       clients_per_round=self.EXPERTS, local_steps=4)


@register
class ShakespeareCentralized(Experiment):
  """The baseline: the same model trained centrally on the pooled speeches with the clients'
  optimizer (AdamW, constant lr 3e-3), one step of batch 32 per round.

  python -m paxlike.main --exp=federated.ShakespeareCentralized --job_log_dir=/tmp/central
  With --fdl_set=train.num_steps=30: eval_loss 2.52 (untrained 5.55), docs/federated_results.md.
  """

  def task(self):
    cfg = tasks.centralized_task(models.lm_tiny(), num_steps=ROUNDS, **EVERY)
    cfg.optimizer = optimizers.constant_adamw(3e-3)
    return cfg

  def datasets(self):
    return fdl.Config(LmData, dataset='shakespeare', seq_len=64, batch_size=32)


@register
class StdlibDiLoCo(Experiment):
  """DiLoCo on the standard library: 4 replicas sampling the pooled source independently (the
  data-parallel setting of the paper), 8 inner AdamW steps, outer Nesterov SGD.

  python -m paxlike.main --exp=federated.StdlibDiLoCo --job_log_dir=/tmp/stdlib_diloco
  With --fdl_set=train.num_steps=30: eval_loss 2.09 (untrained 5.55), docs/federated_results.md.
  """
  REPLICAS = 4

  def task(self):
    return tasks.task(models.lm_tiny(), fed.diloco(num_replicas=self.REPLICAS),
                      optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return fdl.Config(LmData, dataset='stdlib', partition='pooled', seq_len=64, batch_size=8,
                      clients_per_round=self.REPLICAS, local_steps=8)


@register
class DigitsFedAvg(Experiment):
  """FedAvg of an MLP on scikit-learn's digits: 20 clients with Dirichlet(α=0.3) label skew,
  5 per round, 5 local SGD steps (lr 0.1) of batch 16.

  python -m paxlike.main --exp=federated.DigitsFedAvg --job_log_dir=/tmp/digits
  With --fdl_set=train.num_steps=30: eval_loss 0.72 (untrained 2.30), docs/federated_results.md.
  """

  def task(self):
    return tasks.task(models.mlp(), fed.fed_avg(), optimizers.sgd(0.1), ROUNDS, **EVERY)

  def datasets(self):
    return fdl.Config(ImageData, dataset='digits', partition='dirichlet', alpha=0.3,
                      num_clients=20, clients_per_round=5, local_steps=5, batch_size=16)


@register
class FashionMnistFedAvg(Experiment):
  """FedAvg of a narrowed McMahan et al. CNN (16/32 channels, 128 units; the paper's 32/64/512
  takes ~35 s a round on 2 CPU cores, its convolutions vmapped over clients) on Fashion-MNIST:
  100 clients of 2 label-sorted shards (pathological non-IID), 10 per round, 2 local SGD steps
  (lr 0.05) of batch 16; eval on the first 2,048 test images.

  python -m paxlike.main --exp=federated.FashionMnistFedAvg --job_log_dir=/tmp/fmnist
  With --fdl_set=train.num_steps=30: eval_loss 1.03 (untrained 2.30), docs/federated_results.md.
  """

  def task(self):
    model = models.cnn()
    model.features, model.dense = (16, 32), 128
    return tasks.task(model, fed.fed_avg(), optimizers.sgd(0.05), ROUNDS, **EVERY)

  def datasets(self):
    return fdl.Config(ImageData, dataset='fashion_mnist', partition='shards', num_clients=100,
                      shards_per_client=2, clients_per_round=10, local_steps=2, batch_size=16,
                      eval_batch_size=256, num_eval_batches=8)


def dp(clip_norm: float, noise_multiplier: float, **kwargs) -> fdl.Config[DpAggregator]:
  """DP aggregation with adaptive clipping to the median update norm (Andrew et al. 2021). The
  count noise σ_b = z (the paper's cohort/20 is too little for cohorts of 20): the update sum
  then gets noise 1.15·z·C, so that both releases together cost exactly z."""
  return fdl.Config(DpAggregator, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                    target_quantile=0.5, count_stddev=noise_multiplier, **kwargs)


@register
class ShakespeareDpFedAvg(Experiment):
  """DP-FedAvg on Shakespeare: all 147 roles every round (no sampling, so no amplification),
  each role's update clipped (adaptively, to the median norm, from C = 0.5), summed, noised at
  z = 8 and divided by 147: client-level (ε, δ)-DP at δ = 1e-5, accounted by RDP (ε = 6.1 after
  100 rounds; the ε spent so far is `dp_epsilon` in metrics.jsonl, `--mode=print_config` prints
  the whole run's). The noise's share grows with the square root of the parameter count over
  the cohort, so this is a 1-layer, 32-wide byte LM (~20k parameters): ShakespeareFedAvg's
  459k-parameter model with 16 roles a round at ε ≈ 9 diverged (noise ≫ signal).

  python -m paxlike.main --exp=federated.ShakespeareDpFedAvg --job_log_dir=/tmp/dp_fedavg
  With --fdl_set=train.num_steps=30: eval_loss 3.89 (untrained 5.55) at ε 3.08.
  """

  def task(self):
    model = models.lm_tiny()
    model.num_layers, model.d_model, model.num_heads, model.d_ff = 1, 32, 2, 64
    algorithm = fed.fed_avg()
    algorithm.aggregator = dp(clip_norm=0.5, noise_multiplier=8.0, delta=1e-5)
    return tasks.task(model, algorithm, optimizers.constant_adamw(3e-3), ROUNDS, **EVERY)

  def datasets(self):
    return shakespeare(clients_per_round=147, sampling='fixed', local_steps=4)


@register
class DigitsDpFedAvg(Experiment):
  """DP-FedAvg on digits: 400 clients of 3–4 images (Dirichlet α = 0.3 label skew), 100 per
  round drawn without replacement, a narrow MLP (32 hidden units: fewer coordinates to noise),
  5 local SGD steps; updates clipped adaptively (from C = 0.5) and noised at z = 6. Client-level
  DP is cheap only with large cohorts: 20 of 100 clients at the same ε reached 18–25% accuracy.
  Refused at start if the run would spend more than ε = 10 at δ = 1e-5 (100 rounds: 9.2).

  python -m paxlike.main --exp=federated.DigitsDpFedAvg --job_log_dir=/tmp/digits_dp
  With --fdl_set=train.num_steps=30: eval_accuracy 0.44 (eval_loss 1.43) at ε 4.48; the same
  run with z = 0 and no clipping 0.85 (1.10); DigitsFedAvg 0.81 (0.72).
  """

  def task(self):
    algorithm = fed.fed_avg()
    algorithm.aggregator = dp(clip_norm=0.5, noise_multiplier=6.0, delta=1e-5, max_epsilon=10.0)
    return tasks.task(models.mlp(hidden=(32,)), algorithm, optimizers.sgd(0.1),
                      ROUNDS, **EVERY)

  def datasets(self):
    return fdl.Config(ImageData, dataset='digits', partition='dirichlet', alpha=0.3,
                      num_clients=400, clients_per_round=100, local_steps=5, batch_size=16)


@register
class ShakespeareFedProx(Experiment):
  """FedProx (Li et al. 2020): ShakespeareFedAvg with the proximal term μ/2‖w − w_global‖²
  (μ = 0.01) in every client's objective, which holds heterogeneous clients near the global
  model over their local steps.

  python -m paxlike.main --exp=federated.ShakespeareFedProx --job_log_dir=/tmp/fedprox
  With --fdl_set=train.num_steps=30: eval_loss 2.29 (ShakespeareFedAvg 2.28, untrained 5.55).
  """

  def task(self):
    algorithm = fed.fed_avg()
    algorithm.prox_mu = 0.01
    return tasks.task(models.lm_tiny(), algorithm, optimizers.constant_adamw(3e-3), ROUNDS,
                      **EVERY)

  def datasets(self):
    return shakespeare(clients_per_round=8, local_steps=4)


@register
class DigitsScaffold(Experiment):
  """SCAFFOLD on DigitsFedAvg's 20 label-skewed clients: all 20 every round (its control
  variates are per client, so the cohort is the fixed population), 5 local SGD steps (lr 0.1)
  along the drift-corrected gradient g − cᵢ + c.

  python -m paxlike.main --exp=federated.DigitsScaffold --job_log_dir=/tmp/digits_scaffold
  With --fdl_set=train.num_steps=30: eval_loss 0.30, accuracy 0.93; FedAvg on the same cohort of
  all 20 clients: 0.61, 0.89.
  """
  CLIENTS = 20

  def task(self):
    return tasks.task(models.mlp(), fed.scaffold(num_clients=self.CLIENTS), optimizers.sgd(0.1),
                      ROUNDS, **EVERY)

  def datasets(self):
    return fdl.Config(ImageData, dataset='digits', partition='dirichlet', alpha=0.3,
                      num_clients=self.CLIENTS, clients_per_round=self.CLIENTS, sampling='fixed',
                      local_steps=5, batch_size=16)
