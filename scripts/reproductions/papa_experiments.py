"""The papa reproduction's experiment: PAPA over a population of MLPs on Fashion-MNIST.

paxlike registers PAPA only for the Shakespeare LM (`federated.ShakespearePapa`); this
subclass of `federated.DigitsFedAvg` keeps its MLP, client SGD and image data and swaps in the
PAPA preset (paxlike.configs.federated.papa). The registry takes it by module
(`--exp=scripts.reproductions.papa_experiments.FashionMnistPapa`); everything else is
`--fdl_set`: the population (`algorithm.population` = `data.clients_per_round`), the variant,
α, the period, `same_init`.
"""

from paxlike.experiments import federated
from paxlike.registry import register


@register
class FashionMnistPapa(federated.DigitsFedAvg):
  """PAPA (α 0.99 every round) over 4 MLPs, each drawing a new IID client of Fashion-MNIST
  every round, so that every member sees the whole training set in its own order."""
  ALGORITHM, ALGORITHM_ARGS, COHORT = 'papa', dict(alpha=0.99, every=1), ('population', 4)
  DATA = dict(num_clients=60)
