"""FedProto (Tan et al., AAAI 2022): federated prototype learning.

Only class prototypes travel; every client keeps its own model (``[C, ...]``).

Client i, each round (its personal model, the global prototypes Cbar):

  ``L_i = CE(F_i(x), y) + lam * R(f_i(x), Cbar^(y))``          (paper Eq. 6)

with ``R`` per example, as the public code does (``nn.MSELoss`` between the
batch features and the global prototypes of their labels):
``distance="mse"``: ``mean_d (f - Cbar^(y))^2`` (the code), or
``"squared_l2"``: ``||f - Cbar^(y)||^2``. Examples of a class without a
global prototype (e.g. all of round 1) contribute 0 to ``R`` but still count
in the batch mean (as in the code). ``E`` epochs of minibatch SGD with momentum
(the code: lr 0.01, momentum 0.5, batch 4, 1 epoch, lam 1), then the client
sends its local prototypes (paper Eq. 3): per-class means of the features of
its real examples under the TRAINED model (the code averages the features
seen during training instead; the paper's definition is used here).

Server: ``Cbar`` from the latest local prototypes of every client
(``prototypes.aggregate_prototypes``; default per-class weights ``n_ik``).

Prediction (paper §"Prototype-based model inference"): nearest global
prototype, ``argmin_k ||f(x) - Cbar^(k)||`` over the classes that have one;
the local head's argmax is reported as well (``accuracy_head``). The main
``accuracy`` is the prototype one, the paper's FedProto accuracy. The public
code additionally restricts the candidates to the classes of the client's own
task; ``restrict_to_local_classes=True`` does the same (with the classes of
the held-out client's support set).

A held-out client (paper §"Model inference": a new client initialises its
model, downloads the global prototypes and fine-tunes with the local
objective): starts from the INITIAL model ``theta^0`` (the common starting
point of every client; ``new_client_init="mean"`` starts from the uniform mean
of the personal models instead, which FedProto's protocol never sends to the
server), trains ``eval_epochs`` epochs of the same objective on its support
set with the global prototypes, and is scored on its query set.

Partial participation (not in the paper): sampled clients train; the server
aggregates the latest prototypes of every client that ever reported (stale
for those not sampled this round).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from augfl_jax.core import client_axis
from augfl_jax.core import evaluation, local, tree
from augfl_jax import models
from augfl_jax.algorithms import averaging, base, prototypes
from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.core.types import Batch, ClientData, Params, PRNGKey

__all__ = [
    "DISTANCES", "EVAL_SALT", "fedproto", "FedProtoConfig", "FedProtoState",
    "init_state", "local_update", "make_evaluate", "make_round",
    "NEW_CLIENT_INITS", "objective", "SPECS"
]

DISTANCES = ("mse", "squared_l2")
NEW_CLIENT_INITS = ("initial", "mean")
EVAL_SALT = 0x7FFFFFF0  # folded into the root key for held-out clients


@dataclasses.dataclass(frozen=True)
class FedProtoConfig(fields.Config):
  """Hyper-parameters of FedProto (defaults: its public code)."""

  lam: float = field(1.0, "weight of the prototype regulariser (the paper: 1 "
      "for images)", ge=0)
  lr: float = field(0.01, "client SGD step size", gt=0, resume="named")
  momentum: float = field(0.5, "client SGD momentum (0: plain SGD)", ge=0, lt=1)
  local_epochs: int = field(1, "local epochs E", ge=1)
  batch_size: int = field(4, "local minibatch size B", ge=1)
  distance: str = field("mse", "the prototype distance: mse (mean over "
      "feature dimensions, the code) or squared_l2", choices=DISTANCES)
  proto_weighting: str = field("count", "count (per-class example counts) or "
      "uniform (the code's plain mean over the clients holding the class)",
      choices=prototypes.WEIGHTINGS)
  new_client_init: str = field("initial", "where a held-out client starts: "
      "initial (theta^0) or mean (the mean of the clients' models)",
      choices=NEW_CLIENT_INITS)
  eval_epochs: int | None = field(None, "a held-out client's epochs on its "
      "support set (default: local_epochs)", ge=0)
  restrict_to_local_classes: bool = field(False, "predict the nearest "
      "prototype among the classes of the client's own support set only")


# The state and its initialisation are the shared prototype ones.
FedProtoState = prototypes.PrototypeState
init_state = prototypes.init_state


def _labels(batch: Batch) -> jax.Array:
  return jnp.where(batch["mask"] > 0, batch["y"], 0).astype(jnp.int32)


def objective(features: jax.Array, logits: jax.Array, labels: jax.Array,
              mask: jax.Array, global_protos: jax.Array,
              global_counts: jax.Array, *, lam: float,
              distance: str = "mse") -> tuple[jax.Array, dict]:
  """FedProto's local loss on one batch (module docstring).

  ``masked_mean_j CE(logits_j, y_j) + lam * masked_mean_j r_j`` with
  ``r_j = dist(f_j, Cbar^(y_j))`` if class y_j has a global prototype, else 0.

  Args:
    features: ``[n, d]``; logits ``[n, K]``; labels ``[n]``; mask ``[n]``.
    global_protos: ``[K, d]``; global_counts ``[K]``.
    lam: the regulariser's weight.
    distance: ``"mse"`` (mean over d) or ``"squared_l2"`` (sum over d).

  Returns:
    ``(loss, {"ce": ..., "proto": ...})``.
  """
  labels = jnp.where(mask > 0, labels, 0).astype(jnp.int32)
  ce = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels)
  sq = (features - jax.lax.stop_gradient(global_protos[labels])) ** 2
  reg = jnp.mean(sq, axis=-1) if distance == "mse" else jnp.sum(sq, axis=-1)
  reg = jnp.where(global_counts[labels] > 0, reg, 0.0)
  ce, reg = models.masked_mean(ce, mask), models.masked_mean(reg, mask)
  return ce + lam * reg, {"ce": ce, "proto": reg}


def _keyed_loss(features_fn, config: FedProtoConfig, global_protos,
                global_counts):
  def loss_fn(params, batch, key):
    del key
    feats, logits = features_fn(params, batch["x"], batch["mask"])
    return objective(feats, logits, batch["y"], batch["mask"], global_protos,
                     global_counts, lam=config.lam,
                     distance=config.distance)[0]
  return loss_fn


def local_update(model: nn.Module, config: FedProtoConfig, params: Params,
                 data: Batch, global_protos: jax.Array,
                 global_counts: jax.Array, key: PRNGKey, *,
                 epochs: int | None = None):
  """One client: train on ``data``, then its prototypes under the new model.

  Returns:
    ``(params, protos [K, d], counts [K], mean training loss)``.
  """
  features_fn = models.make_features_fn(model)
  params, loss = local.train(
      _keyed_loss(features_fn, config, global_protos, global_counts),
      local.sgd(config.lr, config.momentum), params, data, key,
      epochs=config.local_epochs if epochs is None else epochs,
      batch_size=config.batch_size, keyed=True)
  feats, _ = features_fn(params, data["x"], data["mask"])
  protos, counts = prototypes.class_prototypes(
      feats, _labels(data), data["mask"], global_protos.shape[0])
  return params, protos, counts, loss


def make_round(model: nn.Module, config: FedProtoConfig,
               strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  ``clients``: all C training clients; their local data is support ∪ query.
  Metrics: ``loss`` (participants' training loss, sample-weighted),
  ``client_loss`` (one per participant).
  """
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: FedProtoState, clients: ClientData,
               participants: jax.Array | None = None):
    def one_client(c):
      data = local.concat_batches(c["data"].support, c["data"].query)
      return local_update(model, config, c["params"], data,
                          state.global_protos, state.global_counts, c["key"])

    (params, protos, counts, losses), weights, merge = (
        averaging.run_participants(one_client, state, clients, participants,
                                   strategy, params=state.client_params))
    return prototypes.server_step(state, merge, params, protos, counts,
                                  losses, weights, config.proto_weighting)

  return tree.checked_round(jax.jit(round_fn), position=2)


def make_evaluate(model: nn.Module, config: FedProtoConfig, *,
                  strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``evaluate(state, clients) -> metrics`` on held-out clients.

  Each client personalises on its support set (module docstring) and is
  scored on its query set. Metrics: ``accuracy`` / ``accuracy_std`` /
  ``client_accuracy`` (nearest global prototype), the same with suffix
  ``_head`` (the local head's argmax), and ``loss`` (query cross-entropy of
  the head, sample-weighted).
  """
  strategy = client_axis.as_strategy(strategy)
  features_fn = models.make_features_fn(model)
  epochs = (config.local_epochs if config.eval_epochs is None
            else config.eval_epochs)

  def one_client(state: FedProtoState, start: Params, client: ClientData,
                 key: PRNGKey):
    k = state.global_protos.shape[0]
    params = start
    if epochs > 0:
      params, _, _, _ = local_update(
          model, config, start, client.support, state.global_protos,
          state.global_counts, key, epochs=epochs)
    query = client.query
    feats, logits = features_fn(params, query["x"], query["mask"])
    y = _labels(query)
    valid = state.global_counts > 0
    if config.restrict_to_local_classes:
      valid = valid & (prototypes.class_counts(
          client.support["y"], client.support["mask"], k) > 0)
    pred = prototypes.nearest_prototype(feats, state.global_protos, valid)
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), y)
    return (evaluation.masked_correct(pred, y, query["mask"]),
            evaluation.masked_correct(jnp.argmax(logits, -1), y,
                                      query["mask"]),
            models.masked_mean(ce, query["mask"]),
            jnp.sum(query["mask"]))

  def evaluate(state: FedProtoState, clients: ClientData):
    if config.new_client_init == "initial":
      start = state.init_params
    else:
      start = jax.tree.map(lambda p: jnp.mean(p, axis=0), state.client_params)
    keys = averaging.heldout_keys(state, clients.num_clients, EVAL_SALT)
    correct, correct_head, loss, count = client_axis.map_clients(
        lambda c: one_client(state, start, c[0], c[1]), (clients, keys),
        strategy)
    return {**evaluation.summarise(loss, correct, count),
            **evaluation.summarise(None, correct_head, count,
                                   suffix="_head")}

  return jax.jit(evaluate)


def fedproto(model: nn.Module, config: FedProtoConfig, *,
             strategy: base.Strategy = None, eval_alpha: float = 0.03,
             eval_steps: int = 1, pm: None = None) -> base.FederatedAlgorithm:
  """FedProto as a ``FederatedAlgorithm``; held-out clients follow
  ``make_evaluate`` (``eval_alpha`` / ``eval_steps`` unused). FedProto has
  no global model: ``global_params`` is the initial one, where every client
  starts."""
  del eval_alpha, eval_steps
  base.no_pm("fedproto", pm)
  strategy = client_axis.as_strategy(strategy)
  return base.FederatedAlgorithm(
      "fedproto", init_state, make_round(model, config, strategy),
      make_evaluate(model, config, strategy=strategy),
      lambda state: state.init_params)


SPECS = (base.AlgorithmSpec("fedproto", FedProtoConfig, "none", fedproto,
                            label="FedProto"),)
