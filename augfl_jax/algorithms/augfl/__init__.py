"""AugFL: the inexact-ADMM round (:mod:`.admm`, Eqs. (7), (10)-(13)), the
same round with the dense kernels' per-client quantities as low-rank
factors (:mod:`.factored`), and the method around them with the server's
pretrained model (:mod:`.pm_aided`: AugFL and its KT-only ablation)."""

from augfl_jax.algorithms.augfl import admm, factored, pm_aided
from augfl_jax.algorithms.augfl.pm_aided import (
    SPECS, PMAidedState, augfl_pm, kt_only, kt_only_step)
from augfl_jax.algorithms.augfl.admm import (
    AugFLConfig, AugFLState, RoundFn, client_update, client_weights,
    delta_schedule, init_state, make_round, server_update)

__all__ = [
    "AugFLConfig", "AugFLState", "PMAidedState", "RoundFn", "SPECS", "admm",
    "augfl_pm", "client_update", "client_weights", "delta_schedule",
    "factored",
    "init_state", "kt_only", "kt_only_step", "make_round", "pm_aided",
    "server_update",
]
