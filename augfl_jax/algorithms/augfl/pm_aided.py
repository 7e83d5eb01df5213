"""AugFL with the server's pretrained model (PM), and its KT-only ablation.

The PM enters only the server: it computes ``reg_grad = grad R_h(theta^t)``
with the regulariser of ``augfl_jax.transfer`` (``pm = (init_fn,
grad_fn)``), whose state (e.g. the CRD heads and memory banks) never leaves
the server, and Eq. (13) subtracts ``lam reg_grad``. ``lam = 0`` (or the
run's regulariser ``"none"``) is "AugFL w/o PM": no regulariser is needed
(:func:`uses_pm`, which the spec declares, so that a runner loads no PM).

``kt_only`` is Eq. (13) without the federated term (no client takes part):
``theta^{t+1} = theta^t - lam grad R_h(theta^t) / sum_i rho_i``.

The clients' round is ``admm.make_round`` on an ``AugFLState``, or
``factored.make_round`` on the ``FactoredState`` that ``start`` (the
method's ``init_from_clients``) makes when ``config.dense_updates`` resolves
to ``factored`` (``factored.configured_state``; ``init``, which has no
client data, makes a materialised state).

Two options outside the paper shrink the server's R_h step in the first
rounds or bound it (``lam_warmup``, ``reg_max_norm``: :func:`reg_scale`);
both off, the round is the paper's to the last bit.

Held-out clients: fast adaptation of the meta-model (``augfl_jax.
evaluation``).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from augfl_jax.algorithms.augfl import factored
from augfl_jax.algorithms.augfl import admm
from augfl_jax.core import client_axis
from augfl_jax import models
from augfl_jax.algorithms import base
from augfl_jax.core.types import ClientData, Params

__all__ = [
    "adaptation_losses", "augfl_pm", "describe_start", "kt_only",
    "kt_only_step", "label", "PMAidedState", "reg_scale",
    "server_step_norms", "SPECS", "uses_pm"
]


def uses_pm(config: admm.AugFLConfig, regularizer: str = "crd") -> bool:
  """Whether the PM takes part: R_h has a weight and a kind (``lam > 0``
  and ``regularizer`` is not ``"none"``)."""
  return config.lam > 0 and regularizer != "none"


def label(config: admm.AugFLConfig) -> str:
  """"AugFL w/ PM", or "AugFL w/o PM" at ``lam = 0``."""
  return "AugFL w/ PM" if config.lam > 0 else "AugFL w/o PM"


@flax.struct.dataclass
class PMAidedState:
  """AugFL's state next to the server regulariser's (e.g. the CRD heads and
  memory banks); the regulariser's state never leaves the server."""

  augfl: admm.AugFLState
  transfer: Any


@jax.jit
def _kt_only_params(params, reg_grad, scale):
  return jax.tree.map(lambda p, g: p - scale * g, params, reg_grad)


def kt_only_step(state: admm.AugFLState, reg_grad, config: admm.AugFLConfig,
                 clients: ClientData) -> admm.AugFLState:
  """Eq. (13) with ``y_i = 0`` and ``theta_i = theta^t`` for every client:
  ``theta - lam reg_grad / (rho C)``."""
  scale = config.lam / (config.rho * clients.num_examples.shape[0])
  return state.replace(params=_kt_only_params(state.params, reg_grad, scale),
                       round=state.round + 1)


def reg_scale(t: jax.Array, reg_grad: Params, config: admm.AugFLConfig,
              rho_sum: float) -> jax.Array:
  """The factor on ``grad R_h`` in round ``t`` (1-based) of the two
  options outside the paper: ``min(1, t / K)`` for ``lam_warmup = K``,
  times ``min(1, B / (lam_t ||grad R_h|| / rho_sum))`` for ``reg_max_norm
  = B`` (``lam_t`` the warmed-up weight). 1 with both off."""
  warm = (jnp.minimum(1.0, t / config.lam_warmup) if config.lam_warmup
          else jnp.ones(()))
  step = warm * config.lam / rho_sum * optax.tree.norm(reg_grad)
  bound = jnp.where(step > config.reg_max_norm,
                    config.reg_max_norm / jnp.maximum(step, 1e-30), 1.0)
  return (warm * bound).astype(jnp.result_type(*jax.tree.leaves(reg_grad)))


def server_step_norms(params: Params, new_params: Params,
                      regularizer: tuple[Params, float] | None
                     ) -> dict[str, jax.Array]:
  """The norms of Eq. (13)'s parts, for one round.

  Eq. (13) moves theta^t by two parts, ``theta^{t+1} - theta^t = (c -
  theta^t) - s grad R_h`` with ``c = sum_i (y_i + rho_i theta_i) / sum_i
  rho_i`` (the clients' consensus) and ``s = lam / sum_i rho_i``.

  Args:
    params: theta^t.
    new_params: theta^{t+1}.
    regularizer: ``(grad R_h(theta^t), s)``, or None without R_h.

  Returns:
    Scalars: ``server_update_norm`` ``||theta^{t+1} - theta^t||``,
    ``server_consensus_norm`` ``||c - theta^t||`` and
    ``server_reg_norm`` ``||s grad R_h||`` (0 without R_h), all global
    L2 norms over every leaf.
  """
  update = optax.tree.sub(new_params, params)
  reg_step = (optax.tree.zeros_like(update) if regularizer is None else
              optax.tree.scale(regularizer[1], regularizer[0]))
  return {"server_update_norm": optax.tree.norm(update),
          "server_consensus_norm": optax.tree.norm(
              optax.tree.add(update, reg_step)),
          "server_reg_norm": optax.tree.norm(reg_step)}


def adaptation_losses(loss_fn, params: Params, clients: ClientData,
                      config: admm.AugFLConfig,
                      strategy: client_axis.ClientStrategy
                     ) -> dict[str, jax.Array]:
  """Every training client's losses around its adaptation step (7), ``phi_i
  = theta - alpha grad L(theta, D_i^s)``, weighted by ``w_i`` as the
  round's ``loss`` is (``admm.client_weights``).

  Returns:
    Scalars ``adapt_support_before`` ``L(theta, D^s)``,
    ``adapt_support_after`` ``L(phi, D^s)``, ``adapt_query_before``
    ``L(theta, D^q)`` and ``adapt_query_after`` ``L(phi, D^q)`` (the last
    equals the round's ``loss`` under full participation).
  """
  def one_client(c):
    support_before, g_s = jax.value_and_grad(loss_fn)(params, c.support)
    phi = optax.tree.add_scale(params, -config.alpha, g_s)
    return jnp.stack([support_before, loss_fn(phi, c.support),
                      loss_fn(params, c.query), loss_fn(phi, c.query)])

  losses = client_axis.map_clients(one_client, clients, strategy)  # [C, 4]
  w = admm.client_weights(clients.num_examples, config.uniform_weights)
  means = w @ losses / jnp.sum(w)
  names = ("adapt_support_before", "adapt_support_after",
           "adapt_query_before", "adapt_query_after")
  return dict(zip(names, means))


def augfl_pm(model: nn.Module, config: admm.AugFLConfig, *,
             strategy: base.Strategy = None, eval_alpha: float = 0.03,
             eval_steps: int = 1, pm: base.Regularizer | None = None,
             kt_only: bool = False) -> base.FederatedAlgorithm:
  """AugFL (or KT-only, ``kt_only``) with ``reg_grad = grad R_h(theta^t)``
  from the server regulariser ``pm = (init_fn, grad_fn)`` (``augfl_jax.
  transfer.make_regularizer``; None allowed when ``config.lam == 0``). The
  round is traceable unless the regulariser says it is not (a
  ``transfer.Regularizer`` whose ``traceable`` is False: its gradient runs
  a Python loop).

  Metrics of a round: AugFL's (``admm.make_round``; KT-only: ``loss`` is
  ``R_h``), the regulariser's, prefixed ``kt_``, the norms of the server
  step's parts (:func:`server_step_norms`) and, with
  ``config.diagnostics``, the clients' losses around their adaptation step
  (:func:`adaptation_losses`).
  """
  name = "kt_only" if kt_only else "augfl"
  if config.lam > 0 and pm is None:
    raise ValueError(f"{name} with lam > 0 needs a server regulariser")
  strategy = client_axis.as_strategy(strategy)
  reg_init, reg_grad_fn = pm or (lambda key, params: None, None)
  loss_fn = models.make_loss_fn(model)
  round_fn = factored.make_configured_round(loss_fn, config, strategy)

  def init(params, num_clients, key):
    factored.choose(config, loss_fn, params, None)  # factored: needs clients
    return PMAidedState(augfl=admm.init_state(params, num_clients),
                        transfer=reg_init(key, params))

  def init_from_clients(params, clients, key, partial):
    return PMAidedState(
        augfl=factored.configured_state(config, loss_fn, params, clients,
                                        partial),
        transfer=reg_init(key, params))

  def round_(state: PMAidedState, clients: ClientData, participants=None):
    reg_grad, transfer, metrics = None, state.transfer, {}
    rho_sum = config.rho * clients.num_examples.shape[0]
    if reg_grad_fn is not None and config.lam > 0:
      reg_grad, transfer, kt = reg_grad_fn(state.augfl.params, transfer)
      metrics = {f"kt_{k}": v for k, v in kt.items()}
      if config.lam_warmup or config.reg_max_norm < math.inf:
        scale = reg_scale(state.augfl.round + 1, reg_grad, config,
                          rho_sum)
        reg_grad = optax.tree.scale(scale, reg_grad)
        metrics["server_reg_scale"] = scale
    if config.diagnostics:
      metrics.update(adaptation_losses(loss_fn, state.augfl.params, clients,
                                       config, strategy))
    if kt_only:
      new = kt_only_step(state.augfl, reg_grad, config, clients)
      metrics["loss"] = metrics.get("kt_r_h", jnp.zeros(()))
    else:
      new, round_metrics = round_fn(state.augfl, clients, reg_grad,
                                    participants)
      metrics.update(round_metrics)
    metrics.update(server_step_norms(
        state.augfl.params, new.params,
        None if reg_grad is None else (reg_grad, config.lam / rho_sum)))
    return PMAidedState(augfl=new, transfer=transfer), metrics

  params_of = lambda state: state.augfl.params
  return base.FederatedAlgorithm(
      name, init, round_,
      base.fast_adapt_evaluate(model, strategy, eval_alpha=eval_alpha,
                               eval_steps=eval_steps, params_of=params_of),
      params_of, traceable=not (config.lam > 0 and reg_grad_fn is not None)
      or getattr(pm, "traceable", True), init_from_clients=init_from_clients)


def kt_only(model: nn.Module, config: admm.AugFLConfig, *,
            strategy: base.Strategy = None, eval_alpha: float = 0.03,
            eval_steps: int = 1, pm: base.Regularizer | None = None
           ) -> base.FederatedAlgorithm:
  """KT-only: :func:`augfl_pm` with ``kt_only=True``."""
  return augfl_pm(model, config, strategy=strategy, eval_alpha=eval_alpha,
                  eval_steps=eval_steps, pm=pm, kt_only=True)


def describe_start(config: admm.AugFLConfig, loss_fn, params: Params,
                   clients: ClientData) -> str | None:
  """The dense updates ``auto`` chose for these clients
  (``factored.choose``), as a run's log shows them; None for a mode given
  outright."""
  if config.dense_updates != "auto":
    return None
  return (f"dense updates: "
          f"{factored.choose(config, loss_fn, params, clients)} (auto)")


_facts = dict(
    uses_pm=uses_pm, describe_start=describe_start,
    eval_alpha=lambda config: config.alpha,  # held-out clients adapt with it
    pm_weight=lambda config: ("lam", config.lam))  # R_h's weight
SPECS = (base.AlgorithmSpec("augfl", admm.AugFLConfig, "regularizer",
                            augfl_pm, label=label, **_facts),
         base.AlgorithmSpec("kt_only", admm.AugFLConfig, "regularizer",
                            kt_only, label="KT-only", **_facts))
