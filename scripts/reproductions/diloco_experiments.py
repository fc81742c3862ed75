"""The diloco reproduction's experiment with an outer Adam: `federated.ShakespeareDiLoCo` (4
replicas on 4 non-IID domains of roles, inner AdamW, inner state kept across rounds) with
optax's Adam as the outer optimizer instead of Nesterov SGD, the paper's third outer
optimizer. paxlike's DiLoCo preset builds Nesterov SGD (whose lr, momentum and nesterov flag
`--fdl_set` can change, giving outer SGD = FedAvg), so Adam needs this subclass; the registry
takes it by module (`--exp=scripts.reproductions.diloco_experiments.ShakespeareDiLoCoAdam`).
"""

import fiddle as fdl
import optax

from paxlike.experiments import federated
from paxlike import federated as fed_lib
from paxlike.registry import register


@register
class ShakespeareDiLoCoAdam(federated.ShakespeareDiLoCo):
  """ShakespeareDiLoCo with an outer Adam (`algorithm.outer_optimizer.learning_rate`, β1 0.9,
  β2 0.99, ε 1e-8) on the averaged pseudo-gradient."""

  def algorithm(self) -> fdl.Partial:
    outer = fdl.Config(optax.adam, learning_rate=1e-2, b1=0.9, b2=0.99, eps=1e-8)
    return fdl.Partial(fed_lib.diloco, num_replicas=self.COHORT[1], outer_optimizer=outer)
