"""Federated learning for paxlike: FAX-style primitives (see primitives.py) and the algorithms
built on them (FedAvg/FedOpt/DiLoCo in algorithms.py, PAPA in papa.py, BTM in btm.py), each an
`Algorithm` (paxlike/core/algorithm.py)."""

from paxlike.core.algorithm import Algorithm, AlgorithmConfigError
from paxlike.federated.algorithms import (PseudoGradientState, diloco, fed_adagrad, fed_adam,
                                          fed_avg, fed_yogi, pseudo_gradient)
from paxlike.federated.btm import BtmState, btm
from paxlike.federated.papa import PapaState, papa
from paxlike.federated.primitives import (federated_broadcast, federated_map, federated_mean,
                                          federated_program, federated_sum,
                                          federated_weighted_mean)

__all__ = [
    'federated_broadcast', 'federated_map', 'federated_mean', 'federated_program',
    'federated_sum', 'federated_weighted_mean',
    'Algorithm', 'AlgorithmConfigError', 'BtmState', 'PapaState', 'PseudoGradientState',
    'btm', 'diloco', 'fed_adagrad', 'fed_adam', 'fed_avg', 'fed_yogi',
    'papa', 'pseudo_gradient',
]
