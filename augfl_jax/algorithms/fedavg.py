"""FedAvg (McMahan et al., 2017): local SGD epochs, sample-weighted averaging.

A client trains on all of its local data (support and query together) for
``local_epochs`` epochs of minibatch SGD from the server model. The AugFL
authors' code trains its FedAvg on the support set only, full batch, at
lr alpha: ``train_on="support"``, ``batch_size`` at least a client's size and
``lr=0.03`` reproduce it. Held-out clients: fast adaptation of the global
model (``augfl_jax.core.evaluation``).

FedLP is FedAvg started from a client-size model pretrained on the server
split (the caller passes it as the initial params).

The server's new model is the participants' sample-weighted mean: SGD of
step 1.0 on the mean update, computed as the mean itself. ``make_round``
takes any optax server optimizer instead (``server_optimizer``); FedAvgM,
FedAdam and FedYogi are those configurations
(:mod:`augfl_jax.algorithms.fedopt`).
"""

from __future__ import annotations

import dataclasses

import optax

from augfl_jax.core import client_axis
from augfl_jax.core import local
from augfl_jax.algorithms import averaging, base
from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.core.types import ClientData, LossFn, Params, PRNGKey

__all__ = [
    "fedavg", "FedAvgConfig", "fedlp", "init_state", "local_update",
    "LocalSGDConfig", "make_round", "SPECS", "TRAIN_ON"
]

TRAIN_ON = ("all", "support")


@dataclasses.dataclass(frozen=True)
class LocalSGDConfig(fields.Config):
  """FedAvg's clients: E epochs of minibatch SGD on a client's data (the
  config of every method that runs them, FedAvg's and those of
  :mod:`augfl_jax.algorithms.fedopt`)."""

  lr: float = field(0.05, "client SGD step size", gt=0, resume="named")
  local_epochs: int = field(1, "local epochs E per round", ge=1)
  batch_size: int = field(10, "local minibatch size B (at least a client's "
      "size: full batch)", ge=1)
  train_on: str = field("all", "a client's training data: all (support and "
      "query, FedAvg's) or support (the AugFL authors' code)",
      choices=TRAIN_ON)


@dataclasses.dataclass(frozen=True)
class FedAvgConfig(LocalSGDConfig):
  """Hyper-parameters of FedAvg (and FedLP): its clients' (the server
  averages)."""


def local_update(loss_fn: LossFn, config: LocalSGDConfig, params: Params,
                 client: ClientData, key: PRNGKey):
  """One client's E epochs of SGD on D_i = D_i^s ∪ D_i^q; returns (params, loss)."""
  data = (client.support if config.train_on == "support" else
          local.concat_batches(client.support, client.query))
  return local.train(loss_fn, local.sgd(config.lr), params, data, key,
                     epochs=config.local_epochs, batch_size=config.batch_size)


init_state = averaging.init_state


def make_round(loss_fn: LossFn, config: LocalSGDConfig,
               strategy: str | client_axis.ClientStrategy | None = None,
               server_optimizer: optax.GradientTransformation | None = None):
  """Jitted FedAvg ``round_fn(state, clients, participants=None)``; with a
  ``server_optimizer``, the server steps with it on the mean update
  (``averaging.make_averaging_round``; its state from
  ``init_state(params, key, server_optimizer)``)."""
  strategy = client_axis.as_strategy(strategy)
  return averaging.make_averaging_round(
      lambda p, c, k: local_update(loss_fn, config, p, c, k), strategy,
      server_optimizer)


# The constructors (``base.AlgorithmSpec.build``): FedLP is FedAvg whose
# initial params (the caller's) are pretrained.
fedavg = averaging.constructor("fedavg", make_round)
fedlp = averaging.constructor("fedlp", make_round)


SPECS = (base.AlgorithmSpec("fedavg", FedAvgConfig, "none", fedavg,
                            label="FedAvg"),
         base.AlgorithmSpec("fedlp", FedAvgConfig, "initialization", fedlp,
                            label="FedLP"))
