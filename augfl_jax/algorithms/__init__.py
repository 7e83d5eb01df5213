"""Federated algorithms behind one interface, for runners and comparisons.

Each algorithm module offers pure functions (``init_state``, ``make_round``,
a config dataclass). ``build`` wraps one of them as a ``FederatedAlgorithm``
so that a runner can treat them alike::

  algo = build("fedavg", model, FedAvgConfig(), strategy="vmap",
               eval_alpha=0.03, eval_steps=1)
  state = algo.init(params, num_clients, key)
  state, metrics = algo.round(state, clients)          # all clients
  state, metrics = algo.round(state, clients, ids)     # only clients ``ids``
  metrics = algo.evaluate(state, test_clients)         # held-out clients

Evaluation rule (one for every method): a held-out client personalises the
trained state with its support set by the method's own procedure and is
scored on its query set. For methods that produce one global model, that
procedure is fast adaptation (``augfl_jax.evaluation``: ``eval_steps`` SGD
steps of size ``eval_alpha``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax

from augfl_jax import augfl
from augfl_jax import clients as clients_lib
from augfl_jax import evaluation, models
from augfl_jax.algorithms import (fedavg, fedbc, fedcp, fedit, fedoa, fedpcl,
                                  fedproto, per_fedavg)
from augfl_jax.types import ClientData, Params, PRNGKey

# (init_fn, grad_fn) of a server regulariser, see augfl_jax.transfer.
Regularizer = tuple[Callable[..., Any], Callable[..., Any]]

CONFIGS = {
    "augfl": augfl.AugFLConfig,
    "kt_only": augfl.AugFLConfig,
    "fedavg": fedavg.FedAvgConfig,
    "per_fedavg": per_fedavg.PerFedAvgConfig,
    "fedbc": fedbc.FedBCConfig,
    "per_fedbc": fedbc.FedBCConfig,
    "fedlp": fedavg.FedAvgConfig,
    "fedproto": fedproto.FedProtoConfig,
    "fedpcl": fedpcl.FedPCLConfig,
    "fedcp": fedcp.FedCPConfig,
    "fedit": fedit.FedITConfig,
    "fedoa": fedoa.FedOAConfig,
}
ALGORITHMS = tuple(CONFIGS)
# Algorithms whose server applies lam * grad R_h (they need a regulariser).
USES_REGULARIZER = ("augfl", "kt_only")
# Algorithms whose clients need pretrained weights: FedLP starts FedAvg from
# a pretrained client-size model; FedPCL runs a frozen pretrained encoder on
# every client (``encoder_apply``).
STARTS_PRETRAINED = ("fedlp",)
NEEDS_ENCODER = ("fedpcl",)
# Algorithms that adapt the PM itself with LoRA (the PM is every client's
# frozen backbone; ``model`` is the PM and ``params`` its weights).
PM_BACKBONE = ("fedit", "fedoa")


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
      clients), ``loss``, ``client_accuracy`` (``[C]``).
    global_params: ``global_params(state) -> params`` of the global model.
  """

  name: str
  init: Callable[[Params, int, PRNGKey], Any]
  round: Callable[..., tuple[Any, dict[str, jax.Array]]]
  evaluate: Callable[[Any, ClientData], dict[str, jax.Array]]
  global_params: Callable[[Any], Params]


@flax.struct.dataclass
class PMAidedState:
  """AugFL's state next to the server regulariser's (e.g. the CRD heads and
  memory banks); the regulariser's state never leaves the server."""

  augfl: augfl.AugFLState
  transfer: Any


def _pm_aided(name: str, loss_fn, config: augfl.AugFLConfig, strategy,
              regularizer: Regularizer | None, evaluate_params):
  """AugFL with ``reg_grad = grad R_h(theta^t)`` from the server regulariser.

  ``kt_only`` is Eq. (13) without the federated term (no client takes part):
  ``theta^{t+1} = theta^t - lam grad R_h(theta^t) / sum_i rho_i``.
  """
  if config.lam > 0 and regularizer is None:
    raise ValueError(f"{name} with lam > 0 needs a server regulariser")
  reg_init, reg_grad_fn = regularizer or (lambda key, params: None, None)
  round_fn = augfl.make_round(loss_fn, config, strategy)

  def init(params, num_clients, key):
    return PMAidedState(augfl=augfl.init_state(params, num_clients),
                        transfer=reg_init(key, params))

  def round_(state: PMAidedState, clients: ClientData, participants=None):
    reg_grad, transfer, metrics = None, state.transfer, {}
    if reg_grad_fn is not None and config.lam > 0:
      reg_grad, transfer, kt = reg_grad_fn(state.augfl.params, transfer)
      metrics = {f"kt_{k}": v for k, v in kt.items()}
    if name == "kt_only":
      new = kt_only_step(state.augfl, reg_grad, config, clients)
      metrics["loss"] = metrics.get("kt_r_h", jax.numpy.zeros(()))
    else:
      new, round_metrics = round_fn(state.augfl, clients, reg_grad,
                                    participants)
      metrics.update(round_metrics)
    return PMAidedState(augfl=new, transfer=transfer), metrics

  return FederatedAlgorithm(
      name, init, round_,
      lambda state, clients: evaluate_params(state.augfl.params, clients),
      lambda state: state.augfl.params)


@jax.jit
def _kt_only_params(params, reg_grad, scale):
  return jax.tree.map(lambda p, g: p - scale * g, params, reg_grad)


def kt_only_step(state: augfl.AugFLState, reg_grad, config: augfl.AugFLConfig,
                 clients: ClientData) -> augfl.AugFLState:
  """Eq. (13) with ``y_i = 0`` and ``theta_i = theta^t`` for every client."""
  scale = config.lam / (config.rho * clients.num_examples.shape[0])
  return state.replace(params=_kt_only_params(state.params, reg_grad, scale),
                       round=state.round + 1)


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
      features).
    config: the algorithm's config (``CONFIGS[name]``).
    strategy: how the client axis runs (None: the backend's
      ``clients.default_strategy()``), for the round and the evaluation.
    eval_alpha, eval_steps: fast adaptation of held-out clients (methods
      with a global model).
    regularizer: AugFL and KT-only: the server's ``(init_fn, grad_fn)`` from
      ``augfl_jax.transfer.make_regularizer``.
    encoder_apply: FedPCL: the frozen pretrained encoder,
      ``(x, mask) -> features``.
  """
  strategy = clients_lib.as_strategy(strategy)
  if name not in CONFIGS:
    raise ValueError(f"unknown algorithm {name!r}; choose one of {ALGORITHMS}")
  if not isinstance(config, CONFIGS[name]):
    raise TypeError(f"{name} needs a {CONFIGS[name].__name__}, got "
                    f"{type(config).__name__}")
  if regularizer is not None and name not in USES_REGULARIZER:
    raise ValueError(f"{name} takes no server regulariser")
  loss_fn = models.make_loss_fn(model)
  eval_fn = models.make_eval_fn(model)
  get_params = lambda state: state.params
  fast_adapt_eval = evaluation.make_evaluator(
      loss_fn, eval_fn, alpha=eval_alpha, steps=eval_steps, strategy=strategy)
  evaluate = lambda state, clients: fast_adapt_eval(state.params, clients)
  if name in USES_REGULARIZER:
    return _pm_aided(name, loss_fn, config, strategy, regularizer,
                     fast_adapt_eval)
  if (encoder_apply is None) == (name in NEEDS_ENCODER):
    raise ValueError(f"{name} {'needs' if encoder_apply is None else 'takes no'}"
                     " encoder_apply (a frozen pretrained encoder)")
  if name == "fedpcl":
    return FederatedAlgorithm(
        name, fedpcl.init_state,
        fedpcl.make_round(model, config, strategy, encoder_apply=encoder_apply),
        fedpcl.make_evaluate(model, config, strategy=strategy,
                             encoder_apply=encoder_apply),
        lambda state: state.init_params)
  if name in ("fedproto", "fedcp"):
    module = {"fedproto": fedproto, "fedcp": fedcp}[name]
    return FederatedAlgorithm(
        name, module.init_state, module.make_round(model, config, strategy),
        module.make_evaluate(model, config, strategy=strategy),
        # FedProto has no global model: its clients start from the initial one.
        (lambda state: state.init_params) if name == "fedproto" else
        get_params)
  if name in PM_BACKBONE:
    module = {"fedit": fedit, "fedoa": fedoa}[name]
    evaluate_adapters = (
        fedit.make_evaluate(model, config, strategy=strategy,
                            eval_alpha=eval_alpha, eval_steps=eval_steps)
        if name == "fedit" else
        fedoa.make_evaluate(model, config, strategy=strategy))
    return FederatedAlgorithm(
        name, lambda params, num_clients, key: module.init_state(
            params, num_clients, key, config),
        module.make_round(model, config, strategy), evaluate_adapters,
        lambda state: fedit.global_params(state, config))
  if name in ("fedbc", "per_fedbc"):
    config = dataclasses.replace(config, personalized=name == "per_fedbc")
    return FederatedAlgorithm(
        name, fedbc.init_state, fedbc.make_round(loss_fn, config, strategy),
        fedbc.make_evaluate(loss_fn, eval_fn, config, strategy=strategy,
                            eval_alpha=eval_alpha, eval_steps=eval_steps),
        get_params)
  module = {"fedavg": fedavg, "fedlp": fedavg, "per_fedavg": per_fedavg}[name]
  return FederatedAlgorithm(
      name, lambda params, num_clients, key: module.init_state(params, key),
      module.make_round(loss_fn, config, strategy), evaluate, get_params)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  name: str
  config_class: type
  pm_role: str


def _role(name):
  if name in USES_REGULARIZER:
    return "regularizer"
  if name in STARTS_PRETRAINED:
    return "initialization"
  if name in NEEDS_ENCODER:
    return "encoder"
  if name in PM_BACKBONE:
    return "backbone"
  return "none"


REGISTRY = {name: AlgorithmSpec(name, cls, _role(name))
            for name, cls in CONFIGS.items()}
