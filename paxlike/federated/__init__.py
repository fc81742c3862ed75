"""Federated learning for paxlike: FAX-style primitives (see primitives.py) and the algorithms
built on them (FedAvg/FedOpt/DiLoCo in algorithms.py, PAPA in papa.py, BTM in btm.py)."""

from paxlike.federated.primitives import (
    federated_broadcast,
    federated_map,
    federated_mean,
    federated_program,
    federated_sum,
    federated_weighted_mean,
)
from paxlike.federated.algorithms import (
    AlgorithmConfigError,
    PseudoGradientState,
    diloco,
    fed_adagrad,
    fed_adam,
    fed_avg,
    fed_opt,
    fed_yogi,
    pseudo_gradient,
)
from paxlike.federated.btm import BtmState, btm, ensemble_log_probs
from paxlike.federated.papa import PapaState, papa

__all__ = [
    "federated_broadcast",
    "federated_map",
    "federated_mean",
    "federated_program",
    "federated_sum",
    "federated_weighted_mean",
    "AlgorithmConfigError",
    "BtmState",
    "PapaState",
    "PseudoGradientState",
    "btm",
    "diloco",
    "ensemble_log_probs",
    "fed_adagrad",
    "fed_adam",
    "fed_avg",
    "fed_opt",
    "fed_yogi",
    "papa",
    "pseudo_gradient",
]
