"""Federated algorithms behind one interface, for runners and comparisons.

Each method's module (a package where it has several) exports a config
dataclass, pure functions (``init_state``, ``make_round``, ...), a
constructor returning a ``FederatedAlgorithm`` and ``SPECS``, its
``AlgorithmSpec`` entries: name, label, config class, PM role, and the
facts a runner needs (``base.AlgorithmSpec``). ``REGISTRY`` maps every name
to its spec; ``register`` adds a method of the user's own::

  spec = REGISTRY["fedavg"]          # name, config_class, pm_role, build, ...
  algo = spec.build(model, FedAvgConfig(), strategy="vmap",
                    eval_alpha=0.03, eval_steps=1)
  state = algo.init(params, num_clients, key)
  state = algo.start(params, clients, key)             # sized by the data
  state, metrics = algo.round(state, clients)          # all clients
  state, metrics = algo.round(state, clients, ids)     # only clients ``ids``
  metrics = algo.evaluate(state, test_clients)         # held-out clients

``build(name, ...)`` does the same with the runner's keyword arguments.
``start`` is ``init`` for most methods; AugFL's state with factored dense
kernels (``augfl.factored``) needs the clients' shapes, so runners start
there.

Evaluation rule (one for every method): a held-out client personalises the
trained state with its support set by the method's own procedure and is
scored on its query set. For methods that produce one global model, that
procedure is fast adaptation (``augfl_jax.core.evaluation``:
``eval_steps`` SGD steps of size ``eval_alpha``).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax

from augfl_jax.algorithms import (augfl, fedavg, fedbc, fedcp, fedit, fedoa,
                                  fedopt, fedpcl, fedproto, per_fedavg)
from augfl_jax.algorithms.base import (CLIENT_SIZE_ROLES, PM_ROLES,
                                       AlgorithmSpec, FederatedAlgorithm,
                                       Regularizer)
from augfl_jax.core import client_axis, fields

__all__ = ["AlgorithmSpec", "CLIENT_SIZE_ROLES", "FederatedAlgorithm",
           "MODULES", "PM_ROLES", "REGISTRY", "Regularizer", "build",
           "register", "spec"]

# The library's methods, in the order of the registry (and of --help).
MODULES = (augfl, fedavg, fedopt, per_fedavg, fedbc, fedproto, fedpcl, fedcp,
           fedit, fedoa)
_REGISTRY: dict[str, AlgorithmSpec] = {}
# The types of a config's fields, each a flag (experiments.cli).
_FLAG_TYPES = (bool, int, float, str, tuple)
# name -> AlgorithmSpec, read-only: ``register`` adds to it.
REGISTRY: Mapping[str, AlgorithmSpec] = types.MappingProxyType(_REGISTRY)


def register(spec_: AlgorithmSpec) -> AlgorithmSpec:
  """Adds a method to :data:`REGISTRY` (a user's, from their own module:
  ``experiments.run --imports=my_module`` imports it first); registering
  the same spec again changes nothing. Returns ``spec_``.

  Raises:
    TypeError: ``spec_`` is not an ``AlgorithmSpec``, or its config class
      is not a dataclass or has a field of a type no flag takes.
    ValueError: its name is taken by another spec, or its config class
      cannot be built from its defaults (a default that breaks its own
      field's rule: every command builds it so, for its flags).
  """
  if not isinstance(spec_, AlgorithmSpec):
    raise TypeError(f"register takes an AlgorithmSpec, got "
                    f"{type(spec_).__name__}")
  if _REGISTRY.get(spec_.name, spec_) is not spec_:
    raise ValueError(f"algorithm {spec_.name!r} is registered already "
                     f"({_REGISTRY[spec_.name].build.__module__}); choose "
                     "another name")
  _check_defaults(spec_)
  _REGISTRY[spec_.name] = spec_
  return spec_


def _check_defaults(spec_: AlgorithmSpec) -> None:
  """Raises, as :func:`register` says, for a config class of ``spec_``
  that is not a dataclass, whose defaults break a rule of its fields, or
  with a field of a type no flag takes; the message names the algorithm,
  the field and its flag (its section is a registered method's name)."""
  cls, where = spec_.config_class, f"algorithm {spec_.name!r}"
  if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
    raise TypeError(f"{where}: its config class {cls!r} is not a dataclass; "
                    "make it a frozen dataclass of fields.Config, with a "
                    "default for every field")
  try:
    config = cls()
  except fields.FieldError as e:
    field = fields.FieldError(f"{spec_.name}.{e.name}", e.rule)
    raise ValueError(f"{where}: the default of {cls.__name__}.{e.name} "
                     f"breaks its own rule ({field}): give the field a "
                     "default its rule allows") from None
  except (TypeError, ValueError) as e:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
    raise ValueError(f"{where}: its config {cls.__name__} cannot be built "
                     f"from its defaults ({type(e).__name__}: {reason}); "
                     "give every field a default") from None
  for name, _, owner, _ in fields.walk(config):
    kind = fields.leaf_type(owner, name.rpartition(".")[2])
    if kind not in _FLAG_TYPES:
      raise TypeError(f"{where}: {cls.__name__}.{name} is of type "
                      f"{getattr(kind, '__name__', kind)}, which no flag "
                      f"--{spec_.name}.{name} can take; make it one of "
                      + ", ".join(t.__name__ for t in _FLAG_TYPES)
                      + " (or None)")


for _module in MODULES:
  for _spec in _module.SPECS:
    register(_spec)


def spec(name: str) -> AlgorithmSpec:
  """The spec called ``name``; ``ValueError`` naming the registered ones."""
  if name not in _REGISTRY:
    raise ValueError(f"unknown algorithm {name!r}; choose one of "
                     f"{', '.join(_REGISTRY)}")
  return _REGISTRY[name]


def build(name: str, model: nn.Module, config: Any, *,
          strategy: str | client_axis.ClientStrategy | None = None,
          eval_alpha: float = 0.03, eval_steps: int = 1,
          regularizer: Regularizer | None = None,
          encoder_apply: Callable[..., jax.Array] | None = None
         ) -> FederatedAlgorithm:
  """The ``FederatedAlgorithm`` called ``name`` for ``model`` with ``config``.

  Args:
    name: a name in ``REGISTRY``.
    model: the client model (FedPCL: the projector on the encoder's
      features; FedIT, FedOA: the PM).
    config: the algorithm's config (``REGISTRY[name].config_class``).
    strategy: how the client axis runs (None: the backend's
      ``client_axis.default_strategy()``), for the round and the evaluation.
    eval_alpha, eval_steps: fast adaptation of held-out clients (methods
      with a global model).
    regularizer: PM role ``"regularizer"`` (AugFL, KT-only): the server's
      ``(init_fn, grad_fn)`` from ``augfl_jax.transfer.make_regularizer``.
    encoder_apply: PM role ``"encoder"`` (FedPCL): the frozen pretrained
      encoder, ``(x, mask) -> features``.
  """
  strategy = client_axis.as_strategy(strategy)
  spec_ = spec(name)
  if not isinstance(config, spec_.config_class):
    raise TypeError(f"{name} needs a {spec_.config_class.__name__}, got "
                    f"{type(config).__name__}")
  if regularizer is not None and spec_.pm_role != "regularizer":
    raise ValueError(f"{name} takes no server regulariser")
  if (encoder_apply is None) == (spec_.pm_role == "encoder"):
    need = "needs" if encoder_apply is None else "takes no"
    raise ValueError(f"{name} {need} encoder_apply (a frozen pretrained "
                     "encoder)")
  pm = {"regularizer": regularizer, "encoder": encoder_apply}.get(
      spec_.pm_role)
  return spec_.build(model, config, strategy=strategy, eval_alpha=eval_alpha,
                     eval_steps=eval_steps, pm=pm)
