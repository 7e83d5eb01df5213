"""FedOA (Yang et al., "Federated Adapter on Foundation Models: An
Out-Of-Distribution Approach"): FedIT plus a personal adapter per client.

Every client holds two LoRA adapters on the frozen backbone (``models.lora``):

* a copy of the GLOBAL adapter, trained exactly as FedIT (``fedit.
  local_update``, with the very same client key, so FedOA's global adapter
  follows FedIT's trajectory for the same seed) and averaged by the server
  with sample weights;
* a PERSONAL adapter phi_e that never leaves the client. Its local update
  (Algorithm 1, line 7) minimises, on minibatches xi of the client's data,

    R_e(phi_e; xi) + lam * D(h(phi_e; xi), stop_grad(h(phi_g^{t-1}; xi)))

  where R_e is the masked mean cross-entropy, h the model's final-layer
  feature (``features``, the penultimate representation), D the per-example
  L2 distance ``||h_p - h_g||_2`` (``distance="l2"``, the paper's "we
  choose L2-distance", Section 5.1; or ``"squared_l2"``, ``||h_p -
  h_g||^2``, whose gradient ``2 lam grad Phi (Phi_e - Phi_g)`` is the one
  its appendix writes, and which diverges at lam 0.5 and the step 0.05 on
  digits: ``python -m experiments.run --algorithm=fedoa --dataset=digits
  --fedoa.distance=squared_l2`` stops non-finite at round 3) reduced over
  the real examples of the minibatch by a mean (default) or a sum, lam = 0.5
  (Section 5.1); ``fedoa_personal``.

Order (Algorithm 1): the regulariser's anchor is the global adapter
phi_g^{t-1} the client RECEIVED this round, not its own updated copy (line 7
uses phi_g^{t-1}; the copy is updated in line 10, independently), so the two
local trainings do not depend on each other (``anchor="updated"`` anchors on
the client's updated copy instead). The personal adapter continues from the
previous round (``phi_{e,0}^t = phi_e^{t-1}``); before a client's first
round it equals the initial global adapter (``B = 0``: the backbone itself).
Local work per adapter: ``local_epochs`` epochs of minibatch SGD over
``D_i^s ∪ D_i^q`` (paper: 2 epochs, batch 32); the personal step size is
``personal_lr`` (default ``lr``). Gradients reach only the personal adapter:
the backbone and the anchor are ``stop_gradient``-ed.

Partial participation: only ``participants`` update; the others keep their
personal adapters.

Evaluation. Held-out clients (``make_evaluate``, the library's rule): a client
receives the global adapter, trains a personal adapter FROM it with the FedOA
objective (anchored at the global adapter) on its support set, same epochs /
batch size / step, and is scored on its query set. Out-of-distribution
protocol (``make_evaluate_personal``): each TRAINING client's personal adapter
is scored as it is on given data, e.g. a held-out domain
(``data.rotated.leave_one_out`` + ``pool_clients``).
"""

from __future__ import annotations


import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from augfl_jax.core import client_axis
from augfl_jax.core import evaluation, local, tree
from augfl_jax import models
from augfl_jax.algorithms import averaging, base, fedit
from augfl_jax.algorithms.fedoa import personal as fedoa_personal
from augfl_jax.algorithms.fedoa.config import FedOAConfig
from augfl_jax.models import lora
from augfl_jax.core.types import Batch, ClientData, Params, PRNGKey

__all__ = [
    "client_update", "fedoa", "FedOAState", "global_params", "init_state",
    "make_evaluate", "make_evaluate_personal", "make_round", "SPECS"
]


# Folded into the root key for the held-out clients' personal training.
_EVAL_TAG = 0x7EA1


@flax.struct.dataclass
class FedOAState:
  """Attributes: ``backbone`` (frozen params), ``global_adapter``,
  ``personal_adapters`` (leaves ``[C, ...]``), ``key``, ``round`` (int32)."""

  backbone: Params
  global_adapter: lora.Adapters
  personal_adapters: lora.Adapters
  key: PRNGKey
  round: jax.Array


def init_state(backbone_params: Params, num_clients: int, key: PRNGKey,
               config: FedOAConfig) -> FedOAState:
  """The global adapter as ``fedit.init_state`` makes it (same key, same
  values); every personal adapter starts as a copy of it."""
  base = fedit.init_state(backbone_params, num_clients, key, config)
  return FedOAState(
      backbone=base.backbone, global_adapter=base.global_adapter,
      personal_adapters=tree.broadcast_to_clients(base.global_adapter,
                                                  num_clients),
      key=key, round=base.round)


def client_update(model: nn.Module, config: FedOAConfig, backbone: Params,
                  global_adapter: lora.Adapters, personal: lora.Adapters,
                  client: ClientData, key: PRNGKey):
  """One client's round (Algorithm 1, lines 4-11).

  Returns:
    ``(global copy, personal, global loss, personal loss)``; the global copy
    is FedIT's local update with ``key``, the personal training uses
    ``fold_in(key, 1)``.
  """
  new_global, global_loss = fedit.local_update(
      model, config, backbone, global_adapter, client, key)
  anchor = global_adapter if config.anchor == "received" else new_global
  data = local.concat_batches(client.support, client.query)
  new_personal, personal_loss = fedoa_personal.train_personal(
      model, config, backbone, anchor, personal, data,
      jax.random.fold_in(key, 1))
  return new_global, new_personal, global_loss, personal_loss


def make_round(model: nn.Module, config: FedOAConfig,
               strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  Metrics: ``loss`` (the global copies' sample-weighted local loss, as
  FedIT's), ``personal_loss`` (the personal objective, sample-weighted),
  ``client_loss`` and ``client_personal_loss`` (``[K]``).
  """
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: FedOAState, clients: ClientData,
               participants: jax.Array | None = None):
    (globals_, personals, g_loss, p_loss), w, merge_rows = (
        averaging.run_participants(
            lambda c: client_update(model, config, state.backbone,
                                    state.global_adapter, c["personal"],
                                    c["data"], c["key"]),
            state, clients, participants, strategy,
            personal=state.personal_adapters))
    metrics = {**averaging.loss_metrics(g_loss, w),
               "personal_loss": jnp.sum(w * p_loss) / jnp.sum(w),
               "client_personal_loss": p_loss}
    return state.replace(
        global_adapter=tree.weighted_mean(globals_, w),
        personal_adapters=merge_rows(state.personal_adapters, personals),
        round=state.round + 1), metrics

  return tree.checked_round(jax.jit(round_fn), position=2)


global_params = fedit.global_params


def make_evaluate(model: nn.Module, config: FedOAConfig, *,
                  strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``evaluate(state, clients)`` on held-out clients.

  Client i trains a personal adapter from the global adapter with the FedOA
  objective (anchor: the global adapter) on its support set
  (``train_personal``; key ``fold_in(fold_in(state.key, tag), round)``
  folded with i) and is scored on its query set. Metrics as
  ``fedit.make_evaluate``.
  """
  strategy = client_axis.as_strategy(strategy)
  eval_fn = models.make_eval_fn(model)

  def evaluate(state, clients: ClientData):
    scored = lora.frozen_backbone(eval_fn, state.backbone, config.lora)
    keys = averaging.heldout_keys(state, clients.num_clients, _EVAL_TAG)

    def one_client(c):
      personal, _ = fedoa_personal.train_personal(model, config, state.backbone,
                                   state.global_adapter, state.global_adapter,
                                   c["data"].support, c["key"])
      loss, correct = scored(personal, c["data"].query)
      return loss, correct, jnp.sum(c["data"].query["mask"])

    return evaluation.summarise(*client_axis.map_clients(
        one_client, dict(data=clients, key=keys), strategy))

  return jax.jit(evaluate)


def make_evaluate_personal(
    model: nn.Module, config: FedOAConfig, *,
    strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``evaluate_personal(state, batch)``: every training client's
  personal adapter scored as it is (no adaptation).

  Args of the returned function:
    state: a ``FedOAState`` with ``C`` personal adapters.
    batch: the data to score on, shared by all clients (leaves ``[n, ...]``,
      e.g. a held-out domain pooled by ``data.rotated.pool_clients``) or one
      batch per client (leaves ``[C, n, ...]``), told apart by
      ``batch["mask"].ndim``.

  Returns:
    Metrics as ``fedit.make_evaluate``: ``accuracy`` (correct over scored
    examples, all clients), ``accuracy_std``, ``loss``, ``client_accuracy``
    ``[C]``.
  """
  strategy = client_axis.as_strategy(strategy)
  eval_fn = models.make_eval_fn(model)

  def evaluate_personal(state: FedOAState, batch: Batch):
    scored = lora.frozen_backbone(eval_fn, state.backbone, config.lora)
    shared = batch["mask"].ndim == 1

    def one_client(c):
      b = batch if shared else c["batch"]
      loss, correct = scored(c["personal"], b)
      return loss, correct, jnp.sum(b["mask"])

    per_client = {"personal": state.personal_adapters}
    if not shared:
      per_client["batch"] = batch
    return evaluation.summarise(*client_axis.map_clients(
        one_client, per_client, strategy))

  return jax.jit(evaluate_personal)


def fedoa(model: nn.Module, config: FedOAConfig, *,
          strategy: base.Strategy = None, eval_alpha: float = 0.03,
          eval_steps: int = 1, pm: None = None) -> base.FederatedAlgorithm:
  """FedOA as a ``FederatedAlgorithm``: ``model`` is the PM module and
  ``init``'s params its weights, the frozen backbone; held-out clients
  follow ``make_evaluate`` (``eval_alpha`` / ``eval_steps`` unused)."""
  del eval_alpha, eval_steps
  base.no_pm("fedoa", pm)
  strategy = client_axis.as_strategy(strategy)
  return base.FederatedAlgorithm(
      "fedoa", lambda params, num_clients, key: init_state(
          params, num_clients, key, config),
      make_round(model, config, strategy),
      make_evaluate(model, config, strategy=strategy),
      lambda state: global_params(state, config))


SPECS = (base.AlgorithmSpec("fedoa", FedOAConfig, "backbone", fedoa,
                            label="FedOA"),)
