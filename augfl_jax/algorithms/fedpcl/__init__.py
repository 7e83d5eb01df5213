"""FedPCL: the method, its state and round (:mod:`.method`), and its
prototype-contrastive loss (:mod:`.contrastive`)."""

from augfl_jax.algorithms.fedpcl import contrastive, method
from augfl_jax.algorithms.fedpcl.method import (
    EVAL_SALT, PREDICTIONS, SPECS, EncoderApply, FedPCLConfig, FedPCLState,
    encode, fedpcl, init_state, local_update, make_evaluate, make_round)

__all__ = [
    "EVAL_SALT", "EncoderApply", "FedPCLConfig", "FedPCLState",
    "PREDICTIONS", "SPECS", "contrastive", "encode", "fedpcl", "init_state",
    "local_update", "make_evaluate", "make_round", "method",
]
