"""FedOA: the round (:mod:`.round`) and the personal adapters' training
(:mod:`.personal`)."""

from augfl_jax.algorithms.fedoa import personal, round  # pylint: disable=redefined-builtin
from augfl_jax.algorithms.fedoa.round import (
    ANCHORS, DISTANCES, REDUCTIONS, SPECS, FedOAConfig, FedOAState,
    client_update, fedoa, global_params, init_state, make_evaluate,
    make_evaluate_personal, make_round)

__all__ = [
    "ANCHORS", "DISTANCES", "FedOAConfig", "FedOAState", "REDUCTIONS",
    "SPECS", "client_update", "fedoa", "global_params", "init_state",
    "make_evaluate", "make_evaluate_personal", "make_round", "personal",
    "round",
]
