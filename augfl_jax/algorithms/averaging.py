"""The round skeleton of the baselines and the model-averaging round.

``run_participants`` is the client half every baseline round shares: pick the
participants' rows, give each its key (seed, round, client id) and run the
client function over the client axis. ``make_averaging_round`` (FedAvg,
FedLP, Per-FedAvg, FedAvgM, FedAdam, FedYogi): each participating client runs
``local_update(params, client, key)`` from the server model; the server takes
the sample-weighted mean of the returned models over the participants
(``|D_i|`` weights, McMahan et al. 2017).

Server optimizer (FedOpt, Reddi et al. 2021; FedJAX's
``federated_averaging(..., server_optimizer)``): given an optax
``GradientTransformation``, the server treats the mean update as a gradient,
``Delta = params - mean``, and steps with it: ``updates, opt_state =
opt.update(Delta, opt_state, params)``, ``params = optax.apply_updates(params,
updates)``; its state is ``opt_state`` of :class:`ServerOptState`. Without
one (FedAvg's SGD at step 1.0) the new server model IS the mean, computed
directly (``p - 1.0 * (p - m)`` is not ``m`` to the last bit) in the
unchanged :class:`AveragingState`, so FedAvg's rounds and checkpoints are
what they were.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from augfl_jax.core import client_axis
from augfl_jax import models
from augfl_jax.core import tree
from augfl_jax.algorithms import base
from augfl_jax.core.types import ClientData, Params, PRNGKey

__all__ = [
    "AveragingState", "client_keys", "constructor", "heldout_keys",
    "init_state", "LocalUpdate", "loss_metrics", "make_averaging_round",
    "participant_keys", "run_participants", "server_step", "ServerOptState"
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


@flax.struct.dataclass
class ServerOptState(AveragingState):
  """:class:`AveragingState` of a round with a server optimizer; adds
  ``opt_state``, the optimizer's state (``server_optimizer.init(params)``)."""

  opt_state: optax.OptState


def init_state(params: Params, key: PRNGKey,
               server_optimizer: optax.GradientTransformation | None = None
              ) -> AveragingState:
  """The state at round 0: an :class:`AveragingState`, or a
  :class:`ServerOptState` with ``server_optimizer.init(params)`` when there
  is a server optimizer."""
  state = AveragingState(params=params, key=key,
                         round=jnp.zeros((), jnp.int32))
  if server_optimizer is None:
    return state
  return ServerOptState(params=state.params, key=state.key,
                        round=state.round,
                        opt_state=server_optimizer.init(params))


def server_step(state: AveragingState, mean: Params,
                server_optimizer: optax.GradientTransformation | None
               ) -> AveragingState:
  """``state`` with the server model after a round whose clients' mean
  model is ``mean``: the mean itself without a server optimizer, else one
  step of it on the pseudo-gradient ``Delta = params - mean`` (rounds left
  to the caller)."""
  if server_optimizer is None:
    return state.replace(params=mean)
  delta = optax.tree.sub(state.params, mean)
  updates, opt_state = server_optimizer.update(delta, state.opt_state,
                                               state.params)
  return state.replace(params=optax.apply_updates(state.params, updates),
                       opt_state=opt_state)


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
                     strategy: client_axis.ClientStrategy, **stacked: Any):
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
  outputs = client_axis.map_clients(client_fn, per_client, strategy)
  return outputs, per_client["data"].num_examples, merge


def loss_metrics(losses: jax.Array, weights: jax.Array
                ) -> dict[str, jax.Array]:
  """``loss = sum_k w_k loss_k / sum_k w_k`` and ``client_loss`` (``[K]``)."""
  return {"loss": jnp.sum(weights * losses) / jnp.sum(weights),
          "client_loss": losses}


def make_averaging_round(
    local_update: LocalUpdate,
    strategy: str | client_axis.ClientStrategy | None = None,
    server_optimizer: optax.GradientTransformation | None = None):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  ``clients`` holds all ``C`` training clients; ``participants`` (``[K]``
  int32, default all) picks who trains this round. The server model becomes
  the participants' sample-weighted mean model, or, with a
  ``server_optimizer`` (any optax ``GradientTransformation``), takes its
  step on the mean update (:func:`server_step`; the state is then
  ``init_state(params, key, server_optimizer)``). Metrics: ``loss`` (the
  participants' local training loss, sample-weighted) and ``client_loss``
  (``[K]``).
  """
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: AveragingState, clients: ClientData,
               participants: jax.Array | None = None):
    (new_params, losses), weights, _ = run_participants(
        lambda c: local_update(state.params, c["data"], c["key"]), state,
        clients, participants, strategy)
    state = server_step(state, tree.weighted_mean(new_params, weights),
                        server_optimizer)
    return (state.replace(round=state.round + 1),
            loss_metrics(losses, weights))

  return tree.checked_round(jax.jit(round_fn), position=2)


def constructor(name: str, make_round: Callable,
                server_optimizer: (optax.GradientTransformation |
                                   Callable[[Any], optax.GradientTransformation]
                                   | None) = None
               ) -> Callable[..., base.FederatedAlgorithm]:
  """The ``AlgorithmSpec.build`` of the model-averaging method ``name``.

  ``build(model, config, *, strategy=None, eval_alpha=0.03, eval_steps=1,
  pm=None)``: rounds ``make_round(loss_fn, config, strategy)`` on
  ``AveragingState``; held-out clients fast-adapt the global model.

  ``server_optimizer``: an optax ``GradientTransformation``, or a function
  of the config returning one (FedAdam's, from its section), applied to the
  mean update: rounds ``make_round(loss_fn, config, strategy,
  server_optimizer=opt)`` on ``init_state(params, key, opt)``. None: the
  mean, as FedAvg.
  """

  def build(model: nn.Module, config: Any, *, strategy: base.Strategy = None,
            eval_alpha: float = 0.03, eval_steps: int = 1,
            pm: None = None) -> base.FederatedAlgorithm:
    base.no_pm(name, pm)
    strategy = client_axis.as_strategy(strategy)
    opt = (server_optimizer(config) if callable(server_optimizer)
           else server_optimizer)
    extra = {} if opt is None else {"server_optimizer": opt}
    return base.FederatedAlgorithm(
        name, lambda params, num_clients, key: init_state(params, key, opt),
        make_round(models.make_loss_fn(model), config, strategy, **extra),
        base.fast_adapt_evaluate(model, strategy, eval_alpha=eval_alpha,
                                 eval_steps=eval_steps),
        lambda state: state.params)

  build.__name__ = build.__qualname__ = name
  return build
