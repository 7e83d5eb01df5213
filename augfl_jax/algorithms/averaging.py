"""The round shared by model-averaging methods (FedAvg, Per-FedAvg, ...).

Each participating client runs ``local_update(params, client, key)`` from the
server model; the server takes the sample-weighted mean of the returned models
over the participants (``|D_i|`` weights, McMahan et al. 2017).
"""

from __future__ import annotations

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from augfl_jax import clients as clients_lib
from augfl_jax import tree
from augfl_jax.types import ClientData, Params, PRNGKey

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


def participant_keys(key: PRNGKey, round_: jax.Array, num_clients: int,
                     participants: jax.Array | None) -> PRNGKey:
  """:func:`client_keys` of a round's participants: ``[K]`` for the ids
  ``participants`` (``[K]``), ``[num_clients]`` for all when None."""
  ids = jnp.arange(num_clients) if participants is None else participants
  return client_keys(key, round_, ids)


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
    select, _ = tree.client_subset(participants)
    per_client = dict(data=select(clients),
                      key=participant_keys(
                          state.key, state.round, clients.num_clients,
                          participants))
    new_params, losses = clients_lib.map_clients(
        lambda c: local_update(state.params, c["data"], c["key"]),
        per_client, strategy)
    weights = per_client["data"].num_examples
    params = tree.weighted_mean(new_params, weights)
    metrics = {"loss": jnp.sum(weights * losses) / jnp.sum(weights),
               "client_loss": losses}
    return state.replace(params=params, round=state.round + 1), metrics

  return jax.jit(round_fn)
