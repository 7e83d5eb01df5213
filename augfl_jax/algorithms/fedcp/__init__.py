"""FedCP: the method, its state and round (:mod:`.method`), and its
conditional policy network (:mod:`.model`)."""

from augfl_jax.algorithms.fedcp import method, model
from augfl_jax.algorithms.fedcp.method import (
    CPN_SALT, EVAL_SALT, SPECS, FedCPConfig, FedCPState, fedcp, init_state,
    local_update, make_evaluate, make_round)

__all__ = [
    "CPN_SALT", "EVAL_SALT", "FedCPConfig", "FedCPState", "SPECS", "fedcp",
    "init_state", "local_update", "make_evaluate", "make_round", "method",
    "model",
]
