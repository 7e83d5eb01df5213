"""What every algorithm module exports: a ``FederatedAlgorithm`` constructor
and its ``AlgorithmSpec`` (name, config class, PM role).

PM roles (``PM_ROLES``), how an algorithm uses the server's pretrained model:

* ``"none"``: no pretrained model.
* ``"regularizer"``: the server applies ``lam grad R_h(theta^t)`` computed
  from the PM (``augfl_jax.transfer``); ``pm`` is the regulariser's
  ``(init_fn, grad_fn)``.
* ``"initialization"``: training starts from a client-size model pretrained
  on the server split (the caller passes it as the initial params).
* ``"encoder"``: every client runs a frozen pretrained encoder; ``pm`` is
  ``encoder_apply(x, mask) -> [n, d]`` features.
* ``"backbone"``: LoRA adapters on the frozen PM; ``model`` is the PM module
  and the initial params are its weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax

from augfl_jax.core import client_axis as clients_lib
from augfl_jax.core import evaluation
from augfl_jax import models
from augfl_jax.core.types import ClientData, Params, PRNGKey

PM_ROLES = ("none", "regularizer", "initialization", "encoder", "backbone")

# (init_fn, grad_fn) of a server regulariser, see augfl_jax.transfer.
Regularizer = tuple[Callable[..., Any], Callable[..., Any]]
Strategy = str | clients_lib.ClientStrategy | None


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
  """A federated algorithm as pure functions of its state.

  Attributes:
    name: the registry name.
    init: ``init(params, num_clients, key) -> state``.
    round: ``round(state, clients, participants=None) -> (state, metrics)``;
      ``metrics["loss"]`` is the round's training loss.
    evaluate: ``evaluate(state, clients) -> metrics`` on held-out clients
      (jitted): ``accuracy`` (sample-weighted mean), ``accuracy_std`` (across
      clients), ``loss``, ``client_accuracy`` (``[C]``); see
      ``evaluation.summarise``.
    global_params: ``global_params(state) -> params`` of the global model.
  """

  name: str
  init: Callable[[Params, int, PRNGKey], Any]
  round: Callable[..., tuple[Any, dict[str, jax.Array]]]
  evaluate: Callable[[Any, ClientData], dict[str, jax.Array]]
  global_params: Callable[[Any], Params]


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """A registry entry.

  Attributes:
    name: the registry name.
    config_class: the algorithm's frozen config dataclass.
    pm_role: one of ``PM_ROLES``.
    build: ``build(model, config, *, strategy, eval_alpha, eval_steps,
      pm=None) -> FederatedAlgorithm``; ``pm`` as the role says (module
      docstring), None for the roles without one.
  """

  name: str
  config_class: type
  pm_role: str
  build: Callable[..., FederatedAlgorithm]

  def __post_init__(self):
    if self.pm_role not in PM_ROLES:
      raise ValueError(f"{self.name}: pm_role must be one of {PM_ROLES}, "
                       f"got {self.pm_role!r}")


def no_pm(name: str, pm: Any) -> None:
  """Raises ``ValueError`` when an algorithm without a ``pm`` gets one."""
  if pm is not None:
    raise ValueError(f"{name} takes no pm argument (its pretrained model, if "
                     "any, comes as the initial params)")


def fast_adapt_evaluate(model: nn.Module, strategy: Strategy, *,
                        eval_alpha: float, eval_steps: int,
                        params_of: Callable[[Any], Params] = (
                            lambda state: state.params)):
  """``evaluate(state, clients)``: the global model ``params_of(state)``
  fast-adapted on each held-out client (``evaluation.make_evaluator``)."""
  evaluator = evaluation.make_evaluator(
      models.make_loss_fn(model), models.make_eval_fn(model),
      alpha=eval_alpha, steps=eval_steps, strategy=strategy)
  return lambda state, clients: evaluator(params_of(state), clients)
