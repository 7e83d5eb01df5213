"""FedOA: the method, its state and round (:mod:`.method`), the personal
adapters' training (:mod:`.personal`) and their hyper-parameters
(:mod:`.config`)."""

from augfl_jax.algorithms.fedoa import config, method, personal
from augfl_jax.algorithms.fedoa.config import (
    ANCHORS, DISTANCES, REDUCTIONS, FedOAConfig)
from augfl_jax.algorithms.fedoa.method import (
    SPECS, FedOAState,
    client_update, fedoa, global_params, init_state, make_evaluate,
    make_evaluate_personal, make_round)

__all__ = [
    "ANCHORS", "DISTANCES", "FedOAConfig", "FedOAState", "REDUCTIONS",
    "SPECS", "client_update", "config", "fedoa", "global_params", "init_state",
    "make_evaluate", "make_evaluate_personal", "make_round", "method",
    "personal",
]
