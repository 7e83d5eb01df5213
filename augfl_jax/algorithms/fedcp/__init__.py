"""FedCP: the round (:mod:`.round`) and its conditional policy network
(:mod:`.model`)."""

from augfl_jax.algorithms.fedcp import model, round  # pylint: disable=redefined-builtin
from augfl_jax.algorithms.fedcp.round import (
    CPN_SALT, EVAL_SALT, SPECS, FedCPConfig, FedCPState, fedcp, init_state,
    local_update, make_evaluate, make_round)

__all__ = [
    "CPN_SALT", "EVAL_SALT", "FedCPConfig", "FedCPState", "SPECS", "fedcp",
    "init_state", "local_update", "make_evaluate", "make_round", "model",
    "round",
]
