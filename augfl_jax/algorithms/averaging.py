"""The round skeleton of the baselines and the model-averaging round.

``run_participants`` is the client half every baseline round shares: pick the
participants' rows, give each its key (seed, round, client id) and run the
client function over the client axis. ``make_averaging_round`` (FedAvg,
Per-FedAvg): each participating client runs ``local_update(params, client,
key)`` from the server model; the server takes the sample-weighted mean of the
returned models over the participants (``|D_i|`` weights, McMahan et al. 2017).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from augfl_jax.core import client_axis as clients_lib
from augfl_jax import models
from augfl_jax.core import tree
from augfl_jax.algorithms import base
from augfl_jax.core.types import ClientData, Params, PRNGKey

__all__ = [
    "AveragingState", "client_keys", "constructor", "heldout_keys",
    "init_state", "LocalUpdate", "loss_metrics", "make_averaging_round",
    "participant_keys", "run_participants"
]

# local_update(server_params, one_client_data, key) -> (client_params, loss)
LocalUpdate = Callable[[Params, ClientData, PRNGKey], tuple[Params, jax.Array]]


@flax.struct.dataclass
class AveragingState:
  """Attributes: ``params`` (the global model), ``key`` (the root PRNG key of
  the run) and ``round`` (scalar int32, rounds completed)."""

  params: Params
  key: PRNGKey
  round: jax.Array


def init_state(params: Params, key: PRNGKey) -> AveragingState:
  return AveragingState(params=params, key=key,
                        round=jnp.zeros((), jnp.int32))


def client_keys(key: PRNGKey, round_: jax.Array,
                client_ids: jax.Array) -> PRNGKey:
  """``[K]`` keys, ``fold_in(fold_in(key, round), client_id)``.

  A client's randomness depends only on (seed, round, client id), never on
  the execution strategy or on which other clients take part.
  """
  round_key = jax.random.fold_in(key, round_)
  return jax.vmap(lambda i: jax.random.fold_in(round_key, i))(client_ids)


def heldout_keys(state: Any, num_clients: int, salt: int) -> PRNGKey:
  """``[C]`` keys of the ``C`` held-out clients evaluated at ``state.round``:
  :func:`client_keys` of ``fold_in(state.key, salt)`` (the salt keeps them
  apart from the training clients' keys)."""
  return client_keys(jax.random.fold_in(state.key, salt), state.round,
                     jnp.arange(num_clients))


def participant_keys(key: PRNGKey, round_: jax.Array, num_clients: int,
                     participants: jax.Array | None) -> PRNGKey:
  """:func:`client_keys` of a round's participants: ``[K]`` for the ids
  ``participants`` (``[K]``), ``[num_clients]`` for all when None."""
  ids = jnp.arange(num_clients) if participants is None else participants
  return client_keys(key, round_, ids)


def run_participants(client_fn: Callable[[dict], Any], state: Any,
                     clients: ClientData, participants: jax.Array | None,
                     strategy: clients_lib.ClientStrategy, **stacked: Any):
  """The client half of a round: ``client_fn`` on every participant.

  Args:
    client_fn: ``client_fn(c) -> outputs`` for ONE client, with ``c =
      {"data": its ClientData, "key": its key (participant_keys of
      state.key and state.round), name: its row of stacked[name], ...}``.
    state: the algorithm's state (``key``, ``round``).
    clients: all ``C`` training clients (leaves ``[C, ...]``).
    participants: ``[K]`` int32 ids, or None for all.
    strategy: how the client axis runs.
    **stacked: per-client state, leaves ``[C, ...]``.

  Returns:
    ``(outputs, weights, merge)``: ``client_fn``'s outputs stacked over the
    participants (``[K, ...]``), their ``|D_i|`` (``[K]``) and
    ``merge(stacked, rows)`` writing participants' rows back
    (``tree.client_subset``).
  """
  select, merge = tree.client_subset(participants)
  per_client = dict(data=select(clients),
                    key=participant_keys(state.key, state.round,
                                         clients.num_clients, participants),
                    **{name: select(v) for name, v in stacked.items()})
  outputs = clients_lib.map_clients(client_fn, per_client, strategy)
  return outputs, per_client["data"].num_examples, merge


def loss_metrics(losses: jax.Array, weights: jax.Array
                ) -> dict[str, jax.Array]:
  """``loss = sum_k w_k loss_k / sum_k w_k`` and ``client_loss`` (``[K]``)."""
  return {"loss": jnp.sum(weights * losses) / jnp.sum(weights),
          "client_loss": losses}


def make_averaging_round(
    local_update: LocalUpdate,
    strategy: str | clients_lib.ClientStrategy | None = None):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  ``clients`` holds all ``C`` training clients; ``participants`` (``[K]``
  int32, default all) picks who trains this round. Metrics: ``loss`` (the
  participants' local training loss, sample-weighted) and ``client_loss``
  (``[K]``).
  """
  strategy = clients_lib.as_strategy(strategy)

  def round_fn(state: AveragingState, clients: ClientData,
               participants: jax.Array | None = None):
    (new_params, losses), weights, _ = run_participants(
        lambda c: local_update(state.params, c["data"], c["key"]), state,
        clients, participants, strategy)
    params = tree.weighted_mean(new_params, weights)
    return (state.replace(params=params, round=state.round + 1),
            loss_metrics(losses, weights))

  return tree.checked_round(jax.jit(round_fn), position=2)


def constructor(name: str, make_round: Callable
               ) -> Callable[..., base.FederatedAlgorithm]:
  """The ``AlgorithmSpec.build`` of the model-averaging method ``name``.

  ``build(model, config, *, strategy=None, eval_alpha=0.03, eval_steps=1,
  pm=None)``: rounds ``make_round(loss_fn, config, strategy)`` on
  ``AveragingState``; held-out clients fast-adapt the global model.
  """

  def build(model: nn.Module, config: Any, *, strategy: base.Strategy = None,
            eval_alpha: float = 0.03, eval_steps: int = 1,
            pm: None = None) -> base.FederatedAlgorithm:
    base.no_pm(name, pm)
    strategy = clients_lib.as_strategy(strategy)
    return base.FederatedAlgorithm(
        name, lambda params, num_clients, key: init_state(params, key),
        make_round(models.make_loss_fn(model), config, strategy),
        base.fast_adapt_evaluate(model, strategy, eval_alpha=eval_alpha,
                                 eval_steps=eval_steps),
        lambda state: state.params)

  build.__name__ = build.__qualname__ = name
  return build
