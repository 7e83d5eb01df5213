"""What every algorithm module exports: a ``FederatedAlgorithm`` constructor
and its ``AlgorithmSpec``, which states once every fact a runner needs of
the method (its name and label, config class, PM role, the configurations
that leave the PM out, the held-out clients' adaptation step).

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
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax

from augfl_jax.core import client_axis
from augfl_jax.core import evaluation
from augfl_jax import models
from augfl_jax.core.types import ClientData, Params, PRNGKey

__all__ = [
    "AlgorithmSpec", "CLIENT_SIZE_ROLES", "fast_adapt_evaluate",
    "FederatedAlgorithm", "no_pm", "PM_ROLES", "Regularizer", "Strategy"
]

PM_ROLES = ("none", "regularizer", "initialization", "encoder", "backbone")
# The roles whose PM is a model of the client's architecture, pretrained on
# the server split: FedLP starts from it; FedPCL's frozen encoder is it (the
# paper: "a pretrained ResNet8x4 as the initial client model for FedLP and
# FedPCL, while AugFL uses the same PM only on the server").
CLIENT_SIZE_ROLES = ("initialization", "encoder")

# (init_fn, grad_fn) of a server regulariser, see augfl_jax.transfer.
Regularizer = tuple[Callable[..., Any], Callable[..., Any]]
Strategy = str | client_axis.ClientStrategy | None


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
    traceable: ``round`` can be traced into a larger jitted program (a
      runner fuses it with its checks); False for a round that runs a
      Python loop of its own (the CRD server step with ``loop="python"``).
    init_from_clients: ``init_from_clients(params, clients, key, partial)
      -> state`` for a method whose state depends on the clients' data
      shapes (AugFL's factored duals, ``augfl.factored``); ``partial``:
      rounds will take a subset of the clients. None: ``init`` with their
      number. Runners call :meth:`start`.
  """

  name: str
  init: Callable[[Params, int, PRNGKey], Any]
  round: Callable[..., tuple[Any, dict[str, jax.Array]]]
  evaluate: Callable[[Any, ClientData], dict[str, jax.Array]]
  global_params: Callable[[Any], Params]
  traceable: bool = True
  init_from_clients: (Callable[[Params, ClientData, PRNGKey, bool], Any]
                      | None) = None

  def start(self, params: Params, clients: ClientData, key: PRNGKey,
            partial: bool = False) -> Any:
    """The state a run over ``clients`` (the training ``ClientData``)
    starts from; ``partial``: its rounds take a subset of the clients."""
    if self.init_from_clients is not None:
      return self.init_from_clients(params, clients, key, partial)
    return self.init(params, clients.num_clients, key)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """A registry entry: everything a runner knows of a method.

  Attributes:
    name: the registry name (``--algorithm``).
    config_class: the algorithm's frozen config dataclass; a run reads it
      from the ``RunConfig`` section of that type (``training.config``).
    pm_role: one of ``PM_ROLES``.
    build: ``build(model, config, *, strategy, eval_alpha, eval_steps,
      pm=None) -> FederatedAlgorithm``; ``pm`` as the role says (module
      docstring), None for the roles without one.
    label: the method's name in tables and plots, or ``label(config) ->
      str`` where it depends on the configuration ("AugFL w/ PM", "AugFL
      w/o PM").
    uses_pm: ``uses_pm(config, regularizer) -> bool``, for a method whose
      configuration may leave its PM out (AugFL at ``lam = 0``);
      ``regularizer`` is the run's R_h (``RunConfig.regularizer``). None:
      the PM takes the role ``pm_role`` says whenever it has one.
    eval_alpha: ``eval_alpha(config) -> float``, the step of the held-out
      clients' fast adaptation for a method that trains for it with an
      inner step of its own (AugFL's alpha); None: the paper's alpha.
    head: PM role ``"encoder"`` (required there): ``(model name, keyword
      arguments)`` of the model every client trains on the frozen
      encoder's features (``models.create_model(name, num_classes,
      **kwargs)``; FedPCL's projector, an mlp with one hidden layer of
      256).
    pm_weight: ``pm_weight(config) -> (field name, value)``, the field that
      weighs the PM's part (AugFL's ``lam``), for a runner's log; None:
      none.
    describe_start: ``describe_start(config, loss_fn, params, clients) ->
      str | None``, a line for a runner's log on how the method starts on
      these training clients (AugFL: the dense updates ``auto`` chose);
      None: nothing to say.
  """

  name: str
  config_class: type
  pm_role: str
  build: Callable[..., FederatedAlgorithm]
  label: str | Callable[[Any], str]
  uses_pm: Callable[[Any, str], bool] | None = None
  eval_alpha: Callable[[Any], float] | None = None
  head: tuple[str, Mapping[str, Any]] | None = None
  pm_weight: Callable[[Any], tuple[str, float]] | None = None
  describe_start: (Callable[[Any, Callable[..., Any], Params, ClientData],
                            str | None] | None) = None

  def __post_init__(self):
    if self.pm_role not in PM_ROLES:
      raise ValueError(f"{self.name}: pm_role must be one of {PM_ROLES}, "
                       f"got {self.pm_role!r}")
    if (self.head is None) == (self.pm_role == "encoder"):
      raise ValueError(
          f"{self.name}: " + ("an encoder method names the model its clients"
                              " train on the encoder's features: head=(model"
                              " name, kwargs)" if self.head is None else
                              "head is the encoder role's alone"))
    if not (callable(self.label) or (isinstance(self.label, str) and
                                     self.label)):
      raise ValueError(f"{self.name}: label must be a name or a function of "
                       f"the config, got {self.label!r}")

  def active_role(self, config: Any, regularizer: str = "crd") -> str:
    """The PM role of a run with ``config`` (``"none"`` where
    :attr:`uses_pm` says that configuration leaves the PM out)."""
    if self.uses_pm is not None and not self.uses_pm(config, regularizer):
      return "none"
    return self.pm_role

  def label_of(self, config: Any) -> str:
    """The method's name for a run with ``config``."""
    return self.label(config) if callable(self.label) else self.label


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
