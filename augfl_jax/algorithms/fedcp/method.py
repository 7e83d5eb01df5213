"""FedCP (Zhang et al., KDD 2023): separating feature information by a
conditional policy.

Each client's model is an ensemble of (public code, ``clientcp.py``):
  * the feature extractor W^fe (the library model up to its features;
    GLOBAL: aggregated, trained locally);
  * the conditional policy network (CPN; GLOBAL: aggregated, trained locally):
    ``Dense(2d) -> LayerNorm -> ReLU`` reshaped to ``[n, 2, d]``, then a
    Gumbel-softmax over the pair (tau = 1, soft) giving the personal and
    global policies ``p, g in [0, 1]^d`` with ``p + g = 1``;
  * the global head W^hg (the library model's classifier; GLOBAL, frozen
    during local training);
  * the personal head W^hp (same shape; PERSONAL, never leaves the client).

Forward pass of client i on x (``fedcp_model``), with ``r = f(x; W^fe)``::

  v_i = normalize(sum_k W^hp[:, k])   (the conditional input from the
                                      personal head, PFLlib's set_head_g)
  (p, g) = CPN(r * v_i);  r_p = r * p,  r_g = r * g  (r_p + r_g = r)
  logits = W^hp(r_p) + W^hg(r_g)

Local objective: ``CE(logits, y) + lam * MMD(r, f(x; W^fe_global))``, the
RBF-kernel MMD (bandwidths 10, 15, 20, 50) between the features of the
trained extractor and of the frozen received global one. ``E`` epochs of plain
SGD (the code: lr 0.005, batch 10, 1 epoch; ``run_me.sh``: lam 5).

After training the client uploads W^fe, the CPN and
``0.5 W^hp + 0.5 W^hg`` (``generate_upload_head``; ``head_mix``); the server
takes their sample-weighted means (``|D_i|`` weights over the participants)
as the new W^fe, CPN and W^hg. ``v_i`` is frozen during local training (it
is recomputed from the trained W^hp, for the next round and for prediction).

Choices where the code is silent or particular:
  * the code's initial ``v_i`` is uniform noise; here it is computed from the
    initial personal head, as in every later round;
  * every participant starts from the CURRENT global CPN and head (the code
    refreshes them only for the clients sampled in the previous round);
  * the Gumbel noise is drawn at prediction too (``F.gumbel_softmax`` in the
    code always samples); ``eval_noise=False`` uses the plain softmax.

A held-out client takes the global W^fe, CPN and W^hg, starts its personal
head as a copy of W^hg (at initialisation the code's personal and global
heads are the same copy), trains ``eval_epochs`` epochs of the local
objective on its support set, and predicts its query set with its ensemble.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from augfl_jax.core import client_axis
from augfl_jax.core import evaluation, local, tree
from augfl_jax import models
from augfl_jax.algorithms import averaging, base, prototypes
from augfl_jax.algorithms.fedcp import model as fedcp_model
from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.core.types import Batch, ClientData, Params, PRNGKey

__all__ = [
    "CPN_SALT", "EVAL_SALT", "fedcp", "FedCPConfig", "FedCPState", "init_state",
    "local_update", "make_evaluate", "make_round", "SPECS"
]

EVAL_SALT = 0x7FFFFFF2
CPN_SALT = 0x7FFFFFF3


@dataclasses.dataclass(frozen=True)
class FedCPConfig(fields.Config):
  """Hyper-parameters of FedCP (defaults: its public code)."""

  lam: float = field(5.0, "weight lambda of the MMD term", ge=0)
  lr: float = field(0.005, "client SGD step size", gt=0, resume="named")
  momentum: float = field(0.0, "client SGD momentum (the code: plain SGD)",
                           ge=0, lt=1)
  local_epochs: int = field(1, "local epochs E", ge=1)
  batch_size: int = field(10, "local minibatch size B", ge=1)
  gumbel_temperature: float = field(1.0, "tau of the Gumbel-softmax", gt=0)
  head_mix: float = field(0.5, "the uploaded head is head_mix W^hp + (1 - "
      "head_mix) W^hg", ge=0, le=1)
  eval_epochs: int | None = field(None, "a held-out client's epochs on its "
      "support set (default: local_epochs)", ge=0)
  eval_lr: float | None = field(None, "a held-out client's step size on its "
      "support set (default: lr; the code scores only the clients it "
      "trained, and PFLlib's generic new-client fine-tuning uses the "
      "training step size)", gt=0, resume="named")
  eval_noise: bool = field(True, "Gumbel noise at prediction too (the code's "
      "behaviour)")


@flax.struct.dataclass
class FedCPState:
  """
  Attributes:
    params: the global model: feature extractor W^fe and, as its classifier
      (``params["head"]`` / ``params["fc"]``), the global head W^hg.
    cpn: the global CPN's parameters.
    personal_heads: W^hp of every client (``{"kernel": [C, d, K], "bias":
      [C, K]}``).
    key: root PRNG key; round: scalar int32.
  """

  params: Params
  cpn: Params
  personal_heads: Params
  key: PRNGKey
  round: jax.Array


def init_state(params: Params, num_clients: int,
               key: PRNGKey) -> FedCPState:
  """W^fe and W^hg from ``params``; W^hp = W^hg for every client (as the
  code's deep copies); the CPN initialised from ``fold_in(key, CPN_SALT)``."""
  head = params[prototypes.head_name(params)]
  d, _ = prototypes.head_shape(params)
  cpn = fedcp_model.ConditionalPolicy(d).init(
      jax.random.fold_in(key, CPN_SALT), jnp.zeros((1, d)))["params"]
  return FedCPState(params=params, cpn=cpn,
                    personal_heads=tree.broadcast_to_clients(head,
                                                             num_clients),
                    key=key, round=jnp.zeros((), jnp.int32))


def local_update(model: nn.Module, config: FedCPConfig, params: Params,
                 cpn: Params, personal_head: Params, data: Batch,
                 key: PRNGKey, *, epochs: int | None = None):
  """One client's local training from the received global modules.

  Returns:
    ``(extractor, cpn, personal_head, upload_head, mean loss)``; the
    extractor without the classifier entry.
  """
  name, extractor, global_head = fedcp_model.split_head(params)
  context = fedcp_model.context_vector(personal_head)
  d = global_head["kernel"].shape[0]

  def loss_fn(trainable, batch, step_key):
    x, mask = batch["x"], batch["mask"]
    noise = fedcp_model.gumbel_noise(step_key, (x.shape[0], 2, d))
    logits, rep = fedcp_model.ensemble_logits(
        model, trainable["extractor"], trainable["cpn"], trainable["head"],
        global_head, context, x, mask, noise, name,
        config.gumbel_temperature)
    y = jnp.where(mask > 0, batch["y"], 0).astype(jnp.int32)
    ce = models.masked_mean(optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), y), mask)
    if config.lam == 0:
      return ce
    base, _ = model.apply({"params": params}, x, mask=mask)
    return ce + config.lam * fedcp_model.mmd(
        rep, jax.lax.stop_gradient(base), mask)

  trainable = {"extractor": extractor, "cpn": cpn, "head": personal_head}
  trainable, loss = local.train(
      loss_fn, local.sgd(config.lr, config.momentum), trainable, data, key,
      epochs=config.local_epochs if epochs is None else epochs,
      batch_size=config.batch_size, keyed=True)
  upload = jax.tree.map(
      lambda p, g: config.head_mix * p + (1.0 - config.head_mix) * g,
      trainable["head"], global_head)
  return (trainable["extractor"], trainable["cpn"], trainable["head"],
          upload, loss)


def make_round(model: nn.Module, config: FedCPConfig,
               strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  Local data is support ∪ query. Metrics: ``loss`` (participants' training
  loss, sample-weighted), ``client_loss`` (one per participant).
  """
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: FedCPState, clients: ClientData,
               participants: jax.Array | None = None):
    def one_client(c):
      data = local.concat_batches(c["data"].support, c["data"].query)
      return local_update(model, config, state.params, state.cpn, c["head"],
                          data, c["key"])

    (extractors, cpns, heads, uploads, losses), weights, merge = (
        averaging.run_participants(one_client, state, clients, participants,
                                   strategy, head=state.personal_heads))
    name = prototypes.head_name(state.params)
    params = dict(tree.weighted_mean(extractors, weights))
    params[name] = tree.weighted_mean(uploads, weights)
    new_state = state.replace(
        params=params, cpn=tree.weighted_mean(cpns, weights),
        personal_heads=merge(state.personal_heads, heads),
        round=state.round + 1)
    return new_state, averaging.loss_metrics(losses, weights)

  return tree.checked_round(jax.jit(round_fn), position=2)


def make_evaluate(model: nn.Module, config: FedCPConfig, *,
                  strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``evaluate(state, clients) -> metrics`` on held-out clients.

  Each client personalises on its support set (module docstring) and is
  scored on its query set: ``accuracy``, ``accuracy_std``,
  ``client_accuracy``, ``loss`` (query cross-entropy, sample-weighted).
  """
  strategy = client_axis.as_strategy(strategy)
  epochs = (config.local_epochs if config.eval_epochs is None
            else config.eval_epochs)
  if config.eval_lr is not None:  # the held-out clients' own step size
    config = dataclasses.replace(config, lr=config.eval_lr)

  def one_client(state: FedCPState, client: ClientData, key: PRNGKey):
    name, extractor, global_head = fedcp_model.split_head(state.params)
    train_key, noise_key = jax.random.split(key)
    cpn, head = state.cpn, global_head
    if epochs > 0:
      extractor, cpn, head, _, _ = local_update(
          model, config, state.params, state.cpn, global_head,
          client.support, train_key, epochs=epochs)
    query = client.query
    n, d = query["mask"].shape[0], global_head["kernel"].shape[0]
    noise = (fedcp_model.gumbel_noise(noise_key, (n, 2, d))
             if config.eval_noise else None)
    logits, _ = fedcp_model.ensemble_logits(
        model, extractor, cpn, head, global_head,
        fedcp_model.context_vector(head), query["x"], query["mask"], noise,
        name, config.gumbel_temperature)
    y = jnp.where(query["mask"] > 0, query["y"], 0).astype(jnp.int32)
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), y)
    return (models.masked_mean(ce, query["mask"]),
            evaluation.masked_correct(jnp.argmax(logits, -1), y,
                                      query["mask"]),
            jnp.sum(query["mask"]))

  def evaluate(state: FedCPState, clients: ClientData):
    keys = averaging.heldout_keys(state, clients.num_clients, EVAL_SALT)
    return evaluation.summarise(*client_axis.map_clients(
        lambda c: one_client(state, c[0], c[1]), (clients, keys), strategy))

  return jax.jit(evaluate)


def fedcp(model: nn.Module, config: FedCPConfig, *,
          strategy: base.Strategy = None, eval_alpha: float = 0.03,
          eval_steps: int = 1, pm: None = None) -> base.FederatedAlgorithm:
  """FedCP as a ``FederatedAlgorithm``; held-out clients follow
  ``make_evaluate`` (``eval_alpha`` / ``eval_steps`` unused)."""
  del eval_alpha, eval_steps
  base.no_pm("fedcp", pm)
  strategy = client_axis.as_strategy(strategy)
  return base.FederatedAlgorithm(
      "fedcp", init_state, make_round(model, config, strategy),
      make_evaluate(model, config, strategy=strategy),
      lambda state: state.params)


SPECS = (base.AlgorithmSpec("fedcp", FedCPConfig, "none", fedcp,
                            label="FedCP"),)
