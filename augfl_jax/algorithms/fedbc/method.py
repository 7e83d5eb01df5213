"""FedBC and Per-FedBC (Federated Learning Beyond Consensus).

Consensus ``x_i = z`` is relaxed to proximity, problem (7) of the paper:
``min sum_i f_i(x_i)  s.t.  ||x_i - z||^2 <= gamma_i``, solved by a
primal-dual method on the Lagrangian (8),
``L_i(z, x_i, lambda_i) = f_i(x_i) + lambda_i (||x_i - z||^2 - gamma_i)``.

One round t (Algorithm 1; the order of the updates is the paper's and the
public code's, both agree):

1. every sampled client j runs local SGD on ``L_j(w, z^t, lambda_j^t)`` from
   ``z^t`` (``start_from="z"``, the public code) or from its last ``x_j^t``
   (``"x"``, Algorithm 2 line 2) and keeps ``x_j^{t+1}``;
2. dual ascent (11), projected: ``lambda_j^{t+1} = clip(lambda_j^t +
   lr_lambda (||x_j^{t+1} - z^t||^2 - gamma_j^t), 0, lambda_max)``;
3. tolerance (public code; the paper, App. D.2, only says "a gradient-descent
   type update"): ``gamma_j^{t+1} = gamma_j^t + lr_gamma lambda_j^t`` -- a
   descent step on L in gamma, so it uses the OLD lambda (the public code
   takes both steps from one backward pass);
4. server (13), with the NEW lambdas (paper and public code):
   ``z^{t+1} = sum_{j in S_t} lambda_j^{t+1} x_j^{t+1} / sum_{j in S_t}
   lambda_j^{t+1}``; when those lambdas sum to 0 (e.g. the first round of a
   run whose duals have not moved) the server falls back to the
   sample-weighted mean of the ``x_j^{t+1}`` (the public code divides by zero).

Clients outside ``S_t`` keep ``x_k, lambda_k, gamma_k`` (Algorithm 1 line 10).

Local training on the Lagrangian (FedBC: minibatch SGD, Algorithm 2;
Per-FedBC, ``personalized=True``: first-order MAML, Algorithm 3):
``fedbc_local``. The dual step is plain projected SGD (the public code's dual
momentum is left out: with it a non-sampled client's lambda keeps moving).
``lambda_max = inf`` reproduces the public code, which only clamps at 0.

Evaluation. Held-out clients (``make_evaluate``): a new client has
``lambda = gamma = 0``, so its personal model is ``z`` adapted on its support
set by plain SGD: ``eval_steps`` full-batch steps of size ``eval_alpha``
(FedBC-FineTune, one step of the public code's ``inner_lr``; default here
``config.lr`` and 1 step) or, for Per-FedBC, the inner loop of Algorithm 3
(default ``config.alpha`` and ``config.inner_steps``); scored on its query set.
Training clients (``make_evaluate_local``): the paper's "local accuracy"
(``x_i`` on its own query set) and "global accuracy" (``z`` on every client's
query set), neither adapted.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from augfl_jax.core import client_axis
from augfl_jax.core import evaluation, tree
from augfl_jax import models
from augfl_jax.algorithms import averaging, base
from augfl_jax.algorithms.fedbc import local as fedbc_local
from augfl_jax.algorithms.fedbc.config import FedBCConfig
from augfl_jax.core.types import ClientData, LossFn, Params, PRNGKey

__all__ = [
    "client_update", "dual_update", "fedbc", "FedBCState", "init_state",
    "make_evaluate", "make_evaluate_local", "make_round", "per_fedbc",
    "server_update", "SPECS"
]

# One client's update (local training, then the dual step): fedbc_local.
client_update = fedbc_local.client_update
dual_update = fedbc_local.dual_update


@flax.struct.dataclass
class FedBCState:
  """The state of a FedBC run.

  Attributes:
    params: the global model z.
    client_params: the local models x_i, leaves ``[C, ...]``.
    lambdas: the duals lambda_i, ``[C]``.
    gammas: the tolerances gamma_i, ``[C]``.
    key: the root PRNG key of the run.
    round: rounds completed, int32 scalar.
  """

  params: Params
  client_params: Params
  lambdas: jax.Array
  gammas: jax.Array
  key: PRNGKey
  round: jax.Array


def init_state(params: Params, num_clients: int, key: PRNGKey) -> FedBCState:
  """``z = params``, ``x_i = z``, ``lambda_i = gamma_i = 0``."""
  return FedBCState(
      params=params,
      client_params=tree.broadcast_to_clients(params, num_clients),
      lambdas=jnp.zeros((num_clients,), jnp.float32),
      gammas=jnp.zeros((num_clients,), jnp.float32),
      key=key, round=jnp.zeros((), jnp.int32))


def server_update(client_params: Params, lambdas: jax.Array,
                  num_examples: jax.Array) -> Params:
  """Eq. (13): ``sum_j lam_j x_j / sum_j lam_j`` over the stacked clients.

  Falls back to ``sum_j n_j x_j / sum_j n_j`` when ``sum_j lam_j = 0``.
  """
  weights = jnp.where(jnp.sum(lambdas) > 0, lambdas,
                      num_examples.astype(lambdas.dtype))
  return tree.weighted_mean(client_params, weights)


def make_round(loss_fn: LossFn, config: FedBCConfig,
               strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  ``clients`` holds all ``C`` training clients; ``participants`` (``[K]``
  int32, default all) is S_t. Metrics: ``loss`` (participants' local task
  loss, sample-weighted), ``client_loss`` (``[K]``), ``lambda_mean`` and
  ``gamma_mean`` (over participants, after the update), ``sq_distance``
  (mean ``||x_j - z^t||^2``) and ``fallback`` (1.0 when the lambdas summed to
  0 and the server took the sample-weighted mean).
  """
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: FedBCState, clients: ClientData,
               participants: jax.Array | None = None):
    stacked = dict(lam=state.lambdas, gamma=state.gammas)
    if config.start_from == "x":
      stacked["x"] = state.client_params

    def one_client(c):
      return client_update(loss_fn, config, state.params,
                           c.get("x", state.params), c["lam"], c["gamma"],
                           c["data"], c["key"])

    (xs, lams, gammas, losses, sq_dists), weights, merge = (
        averaging.run_participants(one_client, state, clients, participants,
                                   strategy, **stacked))
    params = server_update(xs, lams, weights)
    metrics = {**averaging.loss_metrics(losses, weights),
               "lambda_mean": jnp.mean(lams), "gamma_mean": jnp.mean(gammas),
               "sq_distance": jnp.mean(sq_dists),
               "fallback": (jnp.sum(lams) <= 0).astype(jnp.float32)}
    return state.replace(
        params=params, client_params=merge(state.client_params, xs),
        lambdas=merge(state.lambdas, lams), gammas=merge(state.gammas, gammas),
        round=state.round + 1), metrics

  return tree.checked_round(jax.jit(round_fn), position=2)


def make_evaluate(loss_fn: LossFn, eval_fn: evaluation.EvalFn,
                  config: FedBCConfig, *,
                  strategy: str | client_axis.ClientStrategy | None = None,
                  eval_alpha: float | None = None,
                  eval_steps: int | None = None
                 ) -> Callable[[FedBCState, ClientData], dict]:
  """Held-out clients: personalise z on the support set, score on the query.

  A new client has ``lambda = gamma = 0``, so Algorithm 2 (and Algorithm 3's
  inner loop) reduce to plain SGD from z. ``eval_alpha`` / ``eval_steps``
  default to the method's own: FedBC ``(config.lr, 1)`` (FedBC-FineTune),
  Per-FedBC ``(config.alpha, config.inner_steps)``; given values override.

  Returns:
    jitted ``evaluate(state, clients)`` with ``accuracy`` (sample-weighted),
    ``accuracy_std``, ``loss`` and ``client_accuracy`` (``[C]``).
  """
  strategy = client_axis.as_strategy(strategy)
  own_alpha, own_steps = ((config.alpha, config.inner_steps)
                          if config.personalized else (config.lr, 1))
  evaluator = evaluation.make_evaluator(
      loss_fn, eval_fn,
      alpha=own_alpha if eval_alpha is None else eval_alpha,
      steps=own_steps if eval_steps is None else eval_steps,
      strategy=strategy)
  return lambda state, clients: evaluator(state.params, clients)


def make_evaluate_local(loss_fn: LossFn, eval_fn: evaluation.EvalFn, *,
                        strategy: str | client_axis.ClientStrategy | None = None
                       ) -> Callable[[FedBCState, ClientData], dict]:
  """The paper's training-client metrics, no adaptation.

  ``clients`` must be the ``C`` TRAINING clients, in the state's order.

  Returns:
    jitted ``evaluate_local(state, clients)`` with ``local_*`` (x_i on its own
    query set: ``local_accuracy``, ``local_accuracy_std``, ``local_loss``,
    ``local_client_accuracy``) and ``global_*`` (z on every client's query
    set; ``global_accuracy`` is the pooled accuracy).
  """
  strategy = client_axis.as_strategy(strategy)
  local_eval = evaluation.make_evaluator(loss_fn, eval_fn, alpha=0.0,
                                         steps=0, strategy=strategy,
                                         per_client_params=True)
  global_eval = evaluation.make_evaluator(loss_fn, eval_fn, alpha=0.0,
                                          steps=0, strategy=strategy)

  def evaluate_local(state: FedBCState, clients: ClientData):
    out = {f"local_{k}": v
           for k, v in local_eval(state.client_params, clients).items()}
    out.update({f"global_{k}": v
                for k, v in global_eval(state.params, clients).items()})
    return out

  return evaluate_local


def fedbc(model: nn.Module, config: FedBCConfig, *,
          strategy: base.Strategy = None, eval_alpha: float | None = 0.03,
          eval_steps: int | None = 1, pm: None = None,
          personalized: bool = False) -> base.FederatedAlgorithm:
  """FedBC (or Per-FedBC, ``personalized``) as a ``FederatedAlgorithm``.

  ``eval_alpha`` / ``eval_steps``: as ``make_evaluate`` (None: the method's
  own).
  """
  name = "per_fedbc" if personalized else "fedbc"
  base.no_pm(name, pm)
  strategy = client_axis.as_strategy(strategy)
  config = dataclasses.replace(config, personalized=personalized)
  loss_fn = models.make_loss_fn(model)
  return base.FederatedAlgorithm(
      name, init_state, make_round(loss_fn, config, strategy),
      make_evaluate(loss_fn, models.make_eval_fn(model), config,
                    strategy=strategy, eval_alpha=eval_alpha,
                    eval_steps=eval_steps),
      lambda state: state.params)


def per_fedbc(model: nn.Module, config: FedBCConfig, *,
              strategy: base.Strategy = None, eval_alpha: float | None = 0.03,
              eval_steps: int | None = 1, pm: None = None
             ) -> base.FederatedAlgorithm:
  """Per-FedBC: :func:`fedbc` with ``personalized=True``."""
  return fedbc(model, config, strategy=strategy, eval_alpha=eval_alpha,
               eval_steps=eval_steps, pm=pm, personalized=True)


SPECS = (base.AlgorithmSpec("fedbc", FedBCConfig, "none", fedbc,
                            label="FedBC"),
         base.AlgorithmSpec("per_fedbc", FedBCConfig, "none", per_fedbc,
                            label="Per-FedBC",
                            eval_alpha=lambda config: config.alpha))
