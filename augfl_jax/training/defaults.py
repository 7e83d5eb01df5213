"""The defaults of a run: a :class:`RunConfig` with every default filled
in, and what follows from the resolved fields (a model's keyword
arguments, how CRD's minibatches run, where a PM is kept, the seed of the
server split).

:func:`resolve` fills the fields left ``None`` or ``"auto"``, in this order:
the dataset's preset (``DatasetSpec.preset``), the paper's values
(:data:`PAPER_DEFAULTS`, §VI-A and the reference's PM recipe), the dataset's
protocol sizes (``DatasetSpec``) and the backend's measured choices
(``client_axis.default_strategy``, ``models.default_conv_impl``).
The checks of a resolved configuration and the plan of its run are
:mod:`.plan`'s.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jax

from augfl_jax import algorithms, data, models
from augfl_jax.core import client_axis, fields
from augfl_jax.pm import store
from augfl_jax.training.config import (AUTO, RunConfig, algorithm_config,
                                       pm_role)

__all__ = [
    "crd_loop", "default_pm_dir", "model_kwargs", "PAPER_ALPHA",
    "PAPER_DEFAULTS", "PM_ROOT", "resolve", "SERVER_SPLIT_SEED",
    "server_split_seed"
]

# The paper's values where the paper or the reference code gives one.
PAPER_DEFAULTS = {"norm": "batch", "pm.model": "resnet32x4",
                  "pm.epochs": 240, "crd.nce_k": 16384}
# Where pretrained models are kept by default: PM_ROOT/pm/<dataset>_<model>...
PM_ROOT = "runs"
# The server split is the first server_size examples whatever the run's seed,
# so every run of a dataset shares it (and its PM): its seed is a constant.
SERVER_SPLIT_SEED = 0
# The fast-adaptation step of the paper (alpha), for methods without one
# (``AlgorithmSpec.eval_alpha``).
PAPER_ALPHA = 0.03


def server_split_seed(config: RunConfig) -> int:
  """The seed the run's server split (and its PM) belongs to: the run's
  for a dataset generated from it (``DatasetSpec.seeded``)."""
  return (config.seed if data.DATASETS[config.dataset].seeded
          else SERVER_SPLIT_SEED)


def resolve(config: RunConfig) -> RunConfig:
  """``config`` with every preset, paper and backend default filled in
  (idempotent)."""
  dataset = data.canonical_name(config.dataset)
  spec = data.DATASETS[dataset]
  config = fields.replace(config, dataset=dataset)
  filled = {**PAPER_DEFAULTS, **spec.preset,
            "data.num_clients": spec.num_clients,
            "data.server_size": spec.server_size}
  if pm_role(config) != "none" and spec.natural_clients:
    # no server split: a run with a PM draws one from the clients
    filled["data.server_size"] = spec.natural_server_size
  config = fields.replace(config, **{
      name: value for name, value in filled.items()
      if fields.get(config, name) is None})
  if (algorithms.spec(config.algorithm).pm_role in
      algorithms.CLIENT_SIZE_ROLES):
    config = fields.replace(config, **{"pm.model": config.model})
  changes: dict[str, Any] = {}
  if config.strategy == AUTO:
    changes["strategy"] = client_axis.default_strategy().name
  if config.conv_impl == AUTO:
    changes["conv_impl"] = models.default_conv_impl()
  if config.crd.loop == AUTO:
    changes["crd.loop"] = crd_loop(changes.get("conv_impl", config.conv_impl))
  if config.crd.kt_steps is None and config.data.server_size:
    changes["crd.kt_steps"] = -(-config.data.server_size //
                                config.crd.batch_size)
  if config.eval.alpha is None:
    own = algorithms.spec(config.algorithm).eval_alpha
    changes["eval.alpha"] = (PAPER_ALPHA if own is None
                             else own(algorithm_config(config)))
  if config.pm.dir is None:
    changes["pm.dir"] = default_pm_dir(config)
  return fields.replace(config, **changes)


def default_pm_dir(config: RunConfig) -> str:
  """``runs/pm/<dataset>_<model>[-<kwargs>][-<norm>][-seed<s>]
  [-authors_pool]_e<epochs>_srv<n>``: PMs of one architecture with another
  norm, kwargs, pool (the authors' division's) or number of
  epochs live side by side."""
  name = config.pm.model + (
      "-" + re.sub(r"[^A-Za-z0-9]+", "-", config.pm.kwargs).strip("-")
      if config.pm.kwargs else "")
  if config.norm != "batch" and config.pm.model != "logreg":
    name += f"-{config.norm}"
  if data.DATASETS[config.dataset].seeded:
    name += f"-seed{config.seed}"
  if config.data.partition == "authors":  # its pool: train + test, per pixel
    name += "-authors_pool"
  return store.default_pm_dir(PM_ROOT, config.dataset,
                           f"{name}_e{config.pm.epochs}",
                           config.data.server_size)


def crd_loop(conv_impl: str) -> str:
  """How the CRD minibatches of a client model with ``conv_impl`` (resolved)
  run: ``"python"`` on CPU with XLA's convolutions, which XLA:CPU runs
  slowly inside ``lax.scan`` (``transfer.CRDConfig.loop``), else ``"scan"``
  ("patches" convolutions are matmuls and scan well: the cnn's step 1.35x
  faster than in the Python loop, benchmarks/RESULTS.md §14)."""
  return ("python" if jax.default_backend() == "cpu" and conv_impl == "xla"
          else "scan")


def model_kwargs(name: str, norm: str, json_kwargs: str = "",
                 conv_impl: str = AUTO) -> dict[str, Any]:
  """Keyword arguments of ``models.create_model(name, ...)``: the norm (not
  for logreg), ``conv_impl`` (models with convolutions) and the JSON object
  ``json_kwargs``, e.g. ``'{"hidden": [512, 256]}'``."""
  takes = models.model_fields(name)
  kwargs = {"norm": norm} if "norm" in takes else {}
  if "conv_impl" in takes:
    kwargs["conv_impl"] = conv_impl
  if json_kwargs:
    try:
      extra = json.loads(json_kwargs)
    except json.JSONDecodeError as e:
      raise ValueError(f"--pm.kwargs is not valid JSON ({e}); write e.g. "
                       "'{\"hidden\": [512, 256]}'") from None
    if not isinstance(extra, dict):
      raise ValueError("--pm.kwargs must be a JSON object, e.g. "
                       "'{\"hidden\": [512, 256]}'")
    kwargs.update({k: tuple(v) if isinstance(v, list) else v
                   for k, v in extra.items()})
  return kwargs
