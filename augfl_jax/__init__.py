"""augfl_jax: pretrained-model-aided personalised federated learning in JAX.

The public API (``__all__``), imported on first use so that ``import
augfl_jax`` is cheap and loads neither orbax nor TensorFlow:

* AugFL's round (Eqs. (7), (10)-(13)): ``make_round``, ``client_update``,
  ``server_update``, ``init_state``, ``AugFLConfig``, ``AugFLState``; the
  package ``augfl`` (``augfl.pm_aided``: AugFL with the server's PM);
* every method under one interface: ``algorithms`` (``REGISTRY``,
  ``register``, ``build``, ``AlgorithmSpec``, ``FederatedAlgorithm``);
* the experiment loop: ``run(config, output_dir)``, ``RunConfig``,
  ``prepare`` (``training``);
* the floors of the library, each a package: ``core`` (pure helpers: the
  client axis, HVPs, local SGD, evaluation, intervals, ...), ``models``,
  ``data``, ``transfer`` (R_h), ``algorithms``, ``pm`` (pretraining and
  the PM's checkpoint), ``storage`` (checkpoints, locks), ``processes`` (a
  run across processes: their start and end, placement), ``training``;
* the core modules a user calls directly, by name: ``client_axis``,
  ``distributed``, ``evaluation``, ``fields``, ``hvp``, ``intervals``,
  ``local``, ``progress``, ``tree``, ``types``, and ``pretrain``;
* the types: ``Batch``, ``ClientData``, ``LossFn``, ``Params``, ``PRNGKey``.

Any other module is internal to its package (its package's docstring says
which are public).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_MODULES = {
    "algorithms": "augfl_jax.algorithms",
    "augfl": "augfl_jax.algorithms.augfl",
    "client_axis": "augfl_jax.core.client_axis",
    "core": "augfl_jax.core",
    "data": "augfl_jax.data",
    "distributed": "augfl_jax.core.distributed",
    "evaluation": "augfl_jax.core.evaluation",
    "fields": "augfl_jax.core.fields",
    "hvp": "augfl_jax.core.hvp",
    "intervals": "augfl_jax.core.intervals",
    "local": "augfl_jax.core.local",
    "models": "augfl_jax.models",
    "pm": "augfl_jax.pm",
    "pretrain": "augfl_jax.pm.pretrain",
    "processes": "augfl_jax.processes",
    "progress": "augfl_jax.core.progress",
    "storage": "augfl_jax.storage",
    "training": "augfl_jax.training",
    "transfer": "augfl_jax.transfer",
    "tree": "augfl_jax.core.tree",
    "types": "augfl_jax.core.types",
}
_NAMES = {  # name -> the module that defines it
    **dict.fromkeys(("make_round", "client_update", "server_update",
                     "init_state", "AugFLConfig", "AugFLState"),
                    "augfl_jax.algorithms.augfl"),
    **dict.fromkeys(("REGISTRY", "register", "build", "AlgorithmSpec",
                     "FederatedAlgorithm"), "augfl_jax.algorithms"),
    **dict.fromkeys(("run", "RunConfig", "prepare"), "augfl_jax.training"),
    **dict.fromkeys(("Batch", "ClientData", "LossFn", "Params", "PRNGKey"),
                    "augfl_jax.core.types"),
}
__all__ = sorted(_MODULES) + sorted(_NAMES) + ["__version__"]


def __getattr__(name: str) -> Any:
  if name in _MODULES:
    value = importlib.import_module(_MODULES[name])
  elif name in _NAMES:
    value = getattr(importlib.import_module(_NAMES[name]), name)
  else:
    raise AttributeError(f"module 'augfl_jax' has no attribute {name!r}")
  globals()[name] = value  # imported once
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what the names above are, for readers and checkers
  from augfl_jax import (algorithms, core, data, models, pm, processes,
                         storage, training, transfer)
  from augfl_jax.algorithms import (REGISTRY, AlgorithmSpec,
                                    FederatedAlgorithm, augfl, build,
                                    register)
  from augfl_jax.algorithms.augfl import (AugFLConfig, AugFLState,
                                          client_update, init_state,
                                          make_round, server_update)
  from augfl_jax.core import (client_axis, distributed, evaluation, fields,
                              hvp, intervals, local, progress, tree, types)
  from augfl_jax.core.types import Batch, ClientData, LossFn, Params, PRNGKey
  from augfl_jax.pm import pretrain
  from augfl_jax.training import RunConfig, prepare, run
