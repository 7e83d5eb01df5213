"""FedBC and Per-FedBC: the method, its round and server (:mod:`.method`), one
client's local training on the Lagrangian and its dual step
(:mod:`.local`), and their hyper-parameters (:mod:`.config`)."""

from augfl_jax.algorithms.fedbc import config, local, method
from augfl_jax.algorithms.fedbc.config import START_FROM, FedBCConfig
from augfl_jax.algorithms.fedbc.method import (
    SPECS, FedBCState, client_update, dual_update,
    fedbc, init_state, make_evaluate, make_evaluate_local, make_round,
    per_fedbc, server_update)

__all__ = [
    "FedBCConfig", "FedBCState", "SPECS", "START_FROM", "client_update",
    "config", "dual_update", "fedbc", "init_state", "local", "make_evaluate",
    "make_evaluate_local", "make_round", "method", "per_fedbc",
    "server_update",
]
