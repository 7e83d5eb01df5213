"""The server's pretrained model (PM): pretraining on the server split
(:mod:`.pretrain`, its reference recipe :mod:`.recipe`), the checkpoint that
records what it was trained for (:mod:`.metadata`), the checkpoints an
interrupted pretraining continues from (:mod:`.checkpoints`) and the store
that reuses a matching one or pretrains it, one process at a time
(:mod:`.store`)."""

from augfl_jax.pm import checkpoints, metadata, pretrain, recipe, store
from augfl_jax.pm.metadata import (
    FORMAT, IMPLEMENTATION_FIELDS, MATCH_FIELDS, PMCheckpointMismatch,
    model_kwargs, pm_metadata)
from augfl_jax.pm.pretrain import Stopped
from augfl_jax.pm.recipe import PretrainConfig
from augfl_jax.pm.store import (
    default_pm_dir, get_or_pretrain_pm, load_pm, pretrain_and_save, save_pm)

__all__ = [
    "FORMAT", "IMPLEMENTATION_FIELDS", "MATCH_FIELDS", "PMCheckpointMismatch",
    "PretrainConfig", "Stopped", "checkpoints", "default_pm_dir",
    "get_or_pretrain_pm", "load_pm", "metadata", "model_kwargs",
    "pm_metadata", "pretrain", "pretrain_and_save", "recipe", "save_pm",
    "store",
]
