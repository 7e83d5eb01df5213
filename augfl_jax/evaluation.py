"""Fast adaptation on held-out clients (the paper's test protocol, Algorithm 1).

A test client, never trained on, starts from the global model, takes ``steps``
full-batch SGD steps of size ``alpha`` on its support set, and is scored on
its query set. Reported over test clients: the sample-weighted mean accuracy
(``sum_i correct_i / sum_i |D_i^q|``) and the standard deviation of the
per-client accuracies.

Personalised methods pass one model per client (``per_client_params=True``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from augfl_jax import clients as clients_lib
from augfl_jax.types import Batch, ClientData, LossFn, Params

# eval_fn(params, batch) -> (masked mean loss, number of correct real examples)
EvalFn = Callable[[Params, Batch], tuple[jax.Array, jax.Array]]


def fast_adapt(loss_fn: LossFn, params: Params, support: Batch, *,
               alpha: float, steps: int) -> Params:
  """``steps`` full-batch SGD steps of size ``alpha`` on ``support``."""

  def step(params, _):
    return optax.tree.add_scale(params, -alpha,
                                jax.grad(loss_fn)(params, support)), None

  params, _ = jax.lax.scan(step, params, None, length=steps)
  return params


def make_evaluator(loss_fn: LossFn, eval_fn: EvalFn, *, alpha: float,
                   steps: int = 1,
                   strategy: str | clients_lib.ClientStrategy | None = None,
                   per_client_params: bool = False):
  """Jitted ``evaluate(params, clients) -> metrics`` over the client axis.

  Args:
    loss_fn: the training loss (used for the adaptation steps).
    eval_fn: ``(params, batch) -> (loss, num_correct)``.
    alpha: adaptation step size.
    steps: adaptation steps k (0 scores the model as it is).
    strategy: how to run the client axis (None: the backend's
      ``clients.default_strategy()``).
    per_client_params: ``params`` has a leading client axis (one model per
      client) instead of being shared.

  Returns:
    ``evaluate(params, clients)`` with metrics ``accuracy`` (sample-weighted
    mean over clients), ``accuracy_std`` (std of per-client accuracies),
    ``loss`` (sample-weighted query loss) and ``client_accuracy`` (``[C]``).
  """
  strategy = clients_lib.as_strategy(strategy)
  if steps < 0:
    raise ValueError(f"steps must be >= 0, got {steps}")

  def one_client(params, client):
    adapted = fast_adapt(loss_fn, params, client.support, alpha=alpha,
                         steps=steps)
    loss, correct = eval_fn(adapted, client.query)
    return loss, correct, jnp.sum(client.query["mask"])

  def evaluate(params, clients: ClientData):
    if per_client_params:
      fn, per_client = (lambda c: one_client(c[0], c[1])), (params, clients)
    else:
      fn, per_client = (lambda c: one_client(params, c)), clients
    loss, correct, count = clients_lib.map_clients(fn, per_client, strategy)
    accuracy = correct / jnp.maximum(count, 1.0)
    return {"accuracy": jnp.sum(correct) / jnp.sum(count),
            "accuracy_std": jnp.std(accuracy),
            "loss": jnp.sum(loss * count) / jnp.sum(count),
            "client_accuracy": accuracy}

  return jax.jit(evaluate)
