"""FedPCL (Tan et al., NeurIPS 2022): prototype-wise contrastive learning on a
frozen pretrained encoder.

Every client holds the same FROZEN encoder (``encoder_apply(x, mask) ->
[n, d_enc]``, its parameters closed over: the PM or a pretrained client-size
backbone) and a personal projector ``g_i`` (``model``, a small library model
applied to the encoder's output; its penultimate features, L2-normalised, are
the embedding ``z = g_i(h(x)) / ||g_i(h(x))||``; the code's projector is
``Linear(d_enc, 256) -> ReLU -> normalize``, i.e. ``models.MLP(num_classes,
hidden=(256,))`` whose classifier FedPCL never uses). Projectors never leave
the clients: only prototypes are communicated, as in the paper. The encoder
is frozen and there is no augmentation, so a client encodes its local set
once per round, as one batch (the code re-encodes every minibatch; the same
up to batch-statistics normalisation inside the encoder).

Client i, each round, with the global prototypes ``Cbar`` and the local
prototype sets ``{C_m}`` of all M training clients from the server:

  ``L_g = CE(z Cbar^T / tau, y)``                                   (global)
  ``L_p = (1/M) sum_m CE(z C_m^T / tau, y)``                         (local)
  ``L = L_g + L_p``  (masked batch means; tau = 0.07; ``fedpcl_contrastive``)

the formulation of the paper (also PFLlib's ``clientPCL``); a client's set
``C_m`` lacks the classes m does not hold, which are filled with the global
prototype (the public code's padding; a client that never reported is all
global). Classes without a global prototype are left out of every softmax and
their examples out of the loss, so the first round (no prototypes yet) trains
nothing, as in both public codes. The public FedPCL code trains with
``sum_m ConLoss(features, labels, C_m)`` only, ``ConLoss`` being a SupCon
variant whose anchors are prototypes and whose contrasts are the other batch
examples (two augmented views); we follow the paper and PFLlib instead. ``E`` epochs of SGD with momentum (lr 0.01, momentum 0.5,
the code's optimiser), then the client sends its local prototypes: per-class
means of the embeddings of its real examples under the trained projector.

Server: ``Cbar`` = ``prototypes.aggregate_prototypes`` over the latest local
prototypes of every client (default per-class weights n_ik; the code: plain
mean), and the set of all clients' local prototypes is broadcast.

Prediction (``predict``): by default the nearest GLOBAL prototype (squared
Euclidean), over all classes, as every other method of this library predicts
over all classes; ``predict="local"`` is the public code's
``test_inference_twoway``, the nearest of the client's own prototypes, among
the classes it holds (a two-way decision on two-class clients). The other
rule's accuracy is reported too (``accuracy_local`` / ``accuracy_global``).

A held-out client starts from the INITIAL projector (all clients start from
the same one), trains ``eval_epochs`` epochs of ``L`` on its support set with
the current ``Cbar`` and ``{C_m}``, computes its local prototypes on the
support set, and predicts its query set with them.

Partial participation (not in the paper): sampled clients train; the server
keeps the latest prototypes of every client (stale for those not sampled).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from augfl_jax.core import client_axis
from augfl_jax.core import evaluation, local, tree
from augfl_jax.algorithms import averaging, base, prototypes
from augfl_jax.algorithms.fedpcl import contrastive as fedpcl_contrastive
from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.core.types import Batch, ClientData, Params, PRNGKey

__all__ = [
    "encode", "EncoderApply", "EVAL_SALT", "fedpcl", "FedPCLConfig",
    "FedPCLState", "init_state", "local_update", "make_evaluate", "make_round",
    "PREDICTIONS", "PROJECTOR", "SPECS"
]

PREDICTIONS = ("global", "local")
EncoderApply = Callable[[jax.Array, jax.Array], jax.Array]
EVAL_SALT = 0x7FFFFFF1


@dataclasses.dataclass(frozen=True)
class FedPCLConfig(fields.Config):
  """Hyper-parameters of FedPCL."""

  temperature: float = field(0.07, "tau of the contrastive losses (the code: "
      "0.07)", gt=0)
  lr: float = field(0.01, "client SGD step size on the projector", gt=0,
                    resume="named")
  momentum: float = field(0.5, "client SGD momentum", ge=0, lt=1)
  local_epochs: int = field(1, "local epochs E", ge=1)
  batch_size: int = field(10, "local minibatch size B", ge=1)
  proto_weighting: str = field("count", "count or uniform (the code)",
      choices=prototypes.WEIGHTINGS)
  eval_epochs: int | None = field(None, "a held-out client's epochs on its "
      "support set (default: local_epochs)", ge=0)
  predict: str = field("global", "global: the nearest global prototype, "
      "over all classes (as every method here); local: the nearest of the "
      "client's own prototypes, among its classes (the public code)",
      choices=PREDICTIONS)


# The state and its initialisation are the shared prototype ones.
FedPCLState = prototypes.PrototypeState
init_state = prototypes.init_state


def encode(encoder_apply: EncoderApply, batch: Batch) -> Batch:
  """``batch`` with ``x`` replaced by the frozen encoder's features (no
  gradient reaches the encoder)."""
  h = jax.lax.stop_gradient(encoder_apply(batch["x"], batch["mask"]))
  return {**batch, "x": h}


def local_update(project, config: FedPCLConfig, params: Params,
                 data: Batch, state: FedPCLState, key: PRNGKey, *,
                 epochs: int | None = None):
  """One client: train its projector on ``data``, then its prototypes.

  ``data["x"]`` holds the ENCODED examples (``encode``): the encoder is
  frozen, so its features are computed once per round, on the client's whole
  local set as one batch (not per minibatch).

  Returns:
    ``(params, protos [K, d], counts [K], mean training loss)``.
  """
  client_protos, client_valid = fedpcl_contrastive.padded_client_prototypes(
      state.local_protos, state.local_counts, state.global_protos,
      state.global_counts)

  def loss_fn(p, batch, step_key):
    del step_key
    z = project(p, batch["x"], batch["mask"])
    return fedpcl_contrastive.contrastive_loss(
        z, batch["y"], batch["mask"], state.global_protos,
        state.global_counts, client_protos, client_valid,
        temperature=config.temperature)[0]

  params, loss = local.train(
      loss_fn, local.sgd(config.lr, config.momentum), params, data, key,
      epochs=config.local_epochs if epochs is None else epochs,
      batch_size=config.batch_size, keyed=True)
  z = project(params, data["x"], data["mask"])
  protos, counts = prototypes.class_prototypes(
      z, data["y"], data["mask"], state.global_protos.shape[0])
  return params, protos, counts, loss


def make_round(model: nn.Module, config: FedPCLConfig,
               strategy: str | client_axis.ClientStrategy | None = None, *,
               encoder_apply: EncoderApply):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  ``model``: the projector (a library model taking the encoder's features).
  ``encoder_apply(x, mask) -> [n, d_enc]``: the frozen encoder.
  Metrics: ``loss`` (participants' training loss, sample-weighted) and
  ``client_loss`` (one per participant).
  """
  strategy = client_axis.as_strategy(strategy)
  project = fedpcl_contrastive.make_project_fn(model)

  def round_fn(state: FedPCLState, clients: ClientData,
               participants: jax.Array | None = None):
    def one_client(c):
      data = encode(encoder_apply,
                    local.concat_batches(c["data"].support, c["data"].query))
      return local_update(project, config, c["params"], data, state,
                          c["key"])

    (params, protos, counts, losses), weights, merge = (
        averaging.run_participants(one_client, state, clients, participants,
                                   strategy, params=state.client_params))
    return prototypes.server_step(state, merge, params, protos, counts,
                                  losses, weights, config.proto_weighting)

  return tree.checked_round(jax.jit(round_fn), position=2)


def make_evaluate(model: nn.Module, config: FedPCLConfig, *,
                  strategy: str | client_axis.ClientStrategy | None = None,
                  encoder_apply: EncoderApply):
  """Jitted ``evaluate(state, clients) -> metrics`` on held-out clients.

  Metrics: ``accuracy`` / ``accuracy_std`` / ``client_accuracy`` by
  ``config.predict`` (``"global"``: the nearest global prototype, over all
  classes; ``"local"``: the nearest of the prototypes the client computes on
  its support set, i.e. among its own classes), the other rule's with the
  suffix ``_local`` or ``_global``, and ``loss`` (``L_g + L_p`` on the query
  set, sample-weighted).
  """
  strategy = client_axis.as_strategy(strategy)
  project = fedpcl_contrastive.make_project_fn(model)
  epochs = (config.local_epochs if config.eval_epochs is None
            else config.eval_epochs)

  def one_client(state: FedPCLState, client: ClientData, key: PRNGKey):
    params = state.init_params
    support = encode(encoder_apply, client.support)
    query = encode(encoder_apply, client.query)
    if epochs > 0:
      params, protos, counts, _ = local_update(
          project, config, params, support, state, key, epochs=epochs)
    else:
      protos, counts = prototypes.class_prototypes(
          project(params, support["x"], support["mask"]), support["y"],
          support["mask"], state.global_protos.shape[0])
    z = project(params, query["x"], query["mask"])
    y = jnp.where(query["mask"] > 0, query["y"], 0)
    pred = prototypes.nearest_prototype(z, protos, counts > 0)
    pred_global = prototypes.nearest_prototype(
        z, state.global_protos, state.global_counts > 0)
    client_protos, client_valid = fedpcl_contrastive.padded_client_prototypes(
        state.local_protos, state.local_counts, state.global_protos,
        state.global_counts)
    loss, _ = fedpcl_contrastive.contrastive_loss(
        z, query["y"], query["mask"], state.global_protos,
        state.global_counts, client_protos, client_valid,
        temperature=config.temperature)
    return (evaluation.masked_correct(pred, y, query["mask"]),
            evaluation.masked_correct(pred_global, y, query["mask"]),
            loss, jnp.sum(query["mask"]))

  def evaluate(state: FedPCLState, clients: ClientData):
    keys = averaging.heldout_keys(state, clients.num_clients, EVAL_SALT)
    correct_local, correct_global, loss, count = client_axis.map_clients(
        lambda c: one_client(state, c[0], c[1]), (clients, keys), strategy)
    scored, other = ((correct_global, correct_local)
                     if config.predict == "global"
                     else (correct_local, correct_global))
    other_name = "local" if config.predict == "global" else "global"
    return {**evaluation.summarise(loss, scored, count),
            **evaluation.summarise(None, other, count,
                                   suffix=f"_{other_name}")}

  return jax.jit(evaluate)


def fedpcl(model: nn.Module, config: FedPCLConfig, *,
           strategy: base.Strategy = None, eval_alpha: float = 0.03,
           eval_steps: int = 1, pm: EncoderApply | None = None
          ) -> base.FederatedAlgorithm:
  """FedPCL as a ``FederatedAlgorithm``: ``model`` is the projector, ``pm``
  the frozen encoder ``(x, mask) -> [n, d_enc]``; held-out clients follow
  ``make_evaluate`` (``eval_alpha`` / ``eval_steps`` unused). The projectors
  stay personal: ``global_params`` is the initial projector."""
  del eval_alpha, eval_steps
  if pm is None:
    raise ValueError("fedpcl needs pm: the frozen pretrained encoder "
                     "(x, mask) -> features")
  strategy = client_axis.as_strategy(strategy)
  return base.FederatedAlgorithm(
      "fedpcl", init_state,
      make_round(model, config, strategy, encoder_apply=pm),
      make_evaluate(model, config, strategy=strategy, encoder_apply=pm),
      lambda state: state.init_params)


# The clients' projector on the encoder's features: one hidden layer of 256.
PROJECTOR = ("mlp", {"hidden": (256,), "norm": "none"})
SPECS = (base.AlgorithmSpec("fedpcl", FedPCLConfig, "encoder", fedpcl,
                            label="FedPCL", head=PROJECTOR),)
