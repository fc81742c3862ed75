"""The fedopt reproduction's experiments: `federated.DigitsFedAvg`'s clients, data and MLP
with FedOpt's adaptive servers (Reddi et al. 2021, Algorithm 2; paxlike.federated.server_optim).

paxlike registers FedAdam and FedYogi only for the Shakespeare LM; the registry takes any
importable module's experiment (`--exp=scripts.reproductions.fedopt_experiments.DigitsFedYogi`),
so these two subclasses change nothing but the algorithm. Everything else is `--fdl_set`.
"""

from paxlike.experiments import federated
from paxlike.registry import register


@register
class DigitsFedAdam(federated.DigitsFedAvg):
  """DigitsFedAvg with FedAdam's server (lr `algorithm.server_learning_rate`, τ
  `algorithm.tau`; β1 0.9, β2 0.99)."""
  ALGORITHM = 'fed_adam'


@register
class DigitsFedYogi(federated.DigitsFedAvg):
  """DigitsFedAvg with FedYogi's server (as DigitsFedAdam, Yogi's additive second moment)."""
  ALGORITHM = 'fed_yogi'
