"""Federated algorithms behind one interface, for runners and comparisons.

Each algorithm module exports a config dataclass, pure functions
(``init_state``, ``make_round``, ...), its PM role (``PM_ROLE``, see
``base.PM_ROLES``) and a constructor returning a ``FederatedAlgorithm``;
``REGISTRY`` maps every name to its ``AlgorithmSpec``::

  spec = REGISTRY["fedavg"]          # name, config_class, pm_role, build
  algo = spec.build(model, FedAvgConfig(), strategy="vmap",
                    eval_alpha=0.03, eval_steps=1)
  state = algo.init(params, num_clients, key)
  state, metrics = algo.round(state, clients)          # all clients
  state, metrics = algo.round(state, clients, ids)     # only clients ``ids``
  metrics = algo.evaluate(state, test_clients)         # held-out clients

``build(name, ...)`` does the same with the runner's keyword arguments.

Evaluation rule (one for every method): a held-out client personalises the
trained state with its support set by the method's own procedure and is
scored on its query set. For methods that produce one global model, that
procedure is fast adaptation (``augfl_jax.core.evaluation``: ``eval_steps`` SGD
steps of size ``eval_alpha``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax

from augfl_jax.core import client_axis as clients_lib
from augfl_jax.algorithms.augfl import pm_aided as augfl_pm
from augfl_jax.algorithms import fedavg, fedit, fedproto, per_fedavg
from augfl_jax.algorithms.fedbc import round as fedbc
from augfl_jax.algorithms.fedcp import round as fedcp
from augfl_jax.algorithms.fedoa import round as fedoa
from augfl_jax.algorithms.fedpcl import round as fedpcl
from augfl_jax.algorithms.base import (PM_ROLES, AlgorithmSpec,
                                       FederatedAlgorithm, Regularizer)

MODULES = (augfl_pm, fedavg, per_fedavg, fedbc, fedproto, fedpcl, fedcp,
           fedit, fedoa)
REGISTRY: Mapping[str, AlgorithmSpec] = {
    spec.name: spec for module in MODULES for spec in module.SPECS}
ALGORITHMS = tuple(REGISTRY)


def names_with_role(role: str) -> tuple[str, ...]:
  """The registered algorithms whose PM role is ``role`` (``PM_ROLES``)."""
  if role not in PM_ROLES:
    raise ValueError(f"unknown PM role {role!r}; choose one of {PM_ROLES}")
  return tuple(name for name, spec in REGISTRY.items()
               if spec.pm_role == role)


# Derived views of REGISTRY, for users who ask by role.
CONFIGS = {name: spec.config_class for name, spec in REGISTRY.items()}
USES_REGULARIZER = names_with_role("regularizer")
STARTS_PRETRAINED = names_with_role("initialization")
NEEDS_ENCODER = names_with_role("encoder")
PM_BACKBONE = names_with_role("backbone")


def build(name: str, model: nn.Module, config: Any, *,
          strategy: str | clients_lib.ClientStrategy | None = None,
          eval_alpha: float = 0.03, eval_steps: int = 1,
          regularizer: Regularizer | None = None,
          encoder_apply: Callable[..., jax.Array] | None = None
         ) -> FederatedAlgorithm:
  """The ``FederatedAlgorithm`` called ``name`` for ``model`` with ``config``.

  Args:
    name: one of ``ALGORITHMS``.
    model: the client model (FedPCL: the projector on the encoder's
      features; FedIT, FedOA: the PM).
    config: the algorithm's config (``REGISTRY[name].config_class``).
    strategy: how the client axis runs (None: the backend's
      ``clients.default_strategy()``), for the round and the evaluation.
    eval_alpha, eval_steps: fast adaptation of held-out clients (methods
      with a global model).
    regularizer: PM role ``"regularizer"`` (AugFL, KT-only): the server's
      ``(init_fn, grad_fn)`` from ``augfl_jax.transfer.make_regularizer``.
    encoder_apply: PM role ``"encoder"`` (FedPCL): the frozen pretrained
      encoder, ``(x, mask) -> features``.
  """
  strategy = clients_lib.as_strategy(strategy)
  if name not in REGISTRY:
    raise ValueError(f"unknown algorithm {name!r}; choose one of {ALGORITHMS}")
  spec = REGISTRY[name]
  if not isinstance(config, spec.config_class):
    raise TypeError(f"{name} needs a {spec.config_class.__name__}, got "
                    f"{type(config).__name__}")
  if regularizer is not None and spec.pm_role != "regularizer":
    raise ValueError(f"{name} takes no server regulariser")
  if (encoder_apply is None) == (spec.pm_role == "encoder"):
    need = "needs" if encoder_apply is None else "takes no"
    raise ValueError(f"{name} {need} encoder_apply (a frozen pretrained "
                     "encoder)")
  pm = {"regularizer": regularizer, "encoder": encoder_apply}.get(
      spec.pm_role)
  return spec.build(model, config, strategy=strategy, eval_alpha=eval_alpha,
                    eval_steps=eval_steps, pm=pm)
