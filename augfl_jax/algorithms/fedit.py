"""FedIT (Zhang et al., 2023): FedAvg on LoRA adapters over a frozen backbone.

The backbone (the server's pretrained model, or any model's parameters) is
frozen and held by every client; only the LoRA adapters (``models.lora``) are
trained and communicated. A round: each participating client starts from the
global adapter, runs ``local_epochs`` epochs of minibatch SGD (``augfl_jax.
local``) on all its local data ``D_i = D_i^s ∪ D_i^q`` on the loss of the
merged model ``W + scaling (B A)^T``; the server sets the global adapter to the
sample-weighted mean of the returned adapters (``|D_i|`` weights) over the
participants, exactly FedAvg's rule applied to ``(A, B)`` leaf by leaf.

Evaluation of held-out clients (the library's rule): fast adaptation of the
global ADAPTER (``eval_steps`` full-batch SGD steps of size ``eval_alpha`` on
the support set, backbone frozen), scored on the query set.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from augfl_jax.core import client_axis
from augfl_jax.core import evaluation, local, tree
from augfl_jax import models
from augfl_jax.algorithms import averaging, base
from augfl_jax.models import lora
from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.core.types import ClientData, Params, PRNGKey

__all__ = [
    "adapter_loss_fn", "fedit", "FedITConfig", "FedITState", "global_params",
    "init_state", "local_update", "make_evaluate", "make_round", "SPECS"
]


@dataclasses.dataclass(frozen=True)
class FedITConfig(fields.Config):
  """Hyper-parameters of FedIT (LoRA adapters of the frozen PM)."""

  rank: int = field(8, "LoRA rank (the FedOA paper's 8)", ge=1)
  lora_alpha: float = field(16.0, "LoRA alpha (the FedOA paper's 16)", gt=0)
  targets: tuple[str, ...] = field(("*",), "the kernels that get adapters "
      "(fnmatch patterns of their paths; * is every Dense and Conv kernel)")
  lr: float = field(0.05, "client SGD step size", gt=0, resume="named")
  local_epochs: int = field(2, "local epochs E (the paper's 2)", ge=1)
  batch_size: int = field(32, "local minibatch size B (the paper's 32)", ge=1)

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "targets", self.lora.targets)  # validates LoRA

  @property
  def lora(self) -> lora.LoRAConfig:
    return lora.LoRAConfig(rank=self.rank, alpha=self.lora_alpha,
                           targets=self.targets)


@flax.struct.dataclass
class FedITState:
  """Attributes: ``backbone`` (frozen params), ``global_adapter``
  (``{path: {"A", "B"}}``), ``key`` (root PRNG key), ``round`` (int32)."""

  backbone: Params
  global_adapter: lora.Adapters
  key: PRNGKey
  round: jax.Array


def init_state(backbone_params: Params, num_clients: int, key: PRNGKey,
               config: FedITConfig) -> FedITState:
  """Fresh adapters (``B = 0``: the merged model IS the backbone) on the
  frozen ``backbone_params``. ``num_clients`` is unused (FedIT keeps no
  per-client state); it is there for the common ``init`` signature.

  The adapters' ``A`` come from ``fold_in(key, 0)``; the rounds use ``key``.
  """
  del num_clients
  return FedITState(
      backbone=backbone_params,
      global_adapter=lora.init_adapters(jax.random.fold_in(key, 0),
                                        backbone_params, config.lora),
      key=key, round=jnp.zeros((), jnp.int32))


def adapter_loss_fn(model: nn.Module, backbone: Params, config: FedITConfig):
  """``loss(adapter, batch)``: masked mean CE of the merged model; the
  backbone is frozen (``lora.frozen_backbone``)."""
  return lora.frozen_backbone(models.make_loss_fn(model), backbone,
                              config.lora)


def local_update(model: nn.Module, config: FedITConfig, backbone: Params,
                 adapter: lora.Adapters, client: ClientData, key: PRNGKey):
  """One client's E epochs of SGD on its adapter over ``D_i^s ∪ D_i^q``.

  Returns:
    ``(adapter, mean loss)``.
  """
  data = local.concat_batches(client.support, client.query)
  return local.train(adapter_loss_fn(model, backbone, config),
                     local.sgd(config.lr), adapter, data, key,
                     epochs=config.local_epochs, batch_size=config.batch_size)


def make_round(model: nn.Module, config: FedITConfig,
               strategy: str | client_axis.ClientStrategy | None = None):
  """Jitted ``round_fn(state, clients, participants=None) -> (state, metrics)``.

  ``clients`` holds all ``C`` training clients; ``participants`` (``[K]``
  int32, default all) picks who trains. Client randomness is
  ``averaging.participant_keys(state.key, state.round, C, participants)``.
  Metrics: ``loss`` (sample-weighted local training loss) and ``client_loss``
  (``[K]``).
  """
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: FedITState, clients: ClientData,
               participants: jax.Array | None = None):
    (adapters, losses), weights, _ = averaging.run_participants(
        lambda c: local_update(model, config, state.backbone,
                               state.global_adapter, c["data"], c["key"]),
        state, clients, participants, strategy)
    return (state.replace(global_adapter=tree.weighted_mean(adapters, weights),
                          round=state.round + 1),
            averaging.loss_metrics(losses, weights))

  return tree.checked_round(jax.jit(round_fn), position=2)


def global_params(state, config: FedITConfig) -> Params:
  """The merged global model ``backbone + global adapter`` (FedIT or FedOA
  state)."""
  return lora.merge(state.backbone, state.global_adapter, config.lora)


def make_evaluate(model: nn.Module, config: FedITConfig, *,
                  strategy: str | client_axis.ClientStrategy | None = None,
                  eval_alpha: float = 0.03, eval_steps: int = 1):
  """Jitted ``evaluate(state, clients)`` on held-out clients.

  Each client adapts the global adapter with ``eval_steps`` full-batch SGD
  steps of size ``eval_alpha`` on its support set (backbone frozen) and is
  scored on its query set. Metrics: ``accuracy`` (sample-weighted),
  ``accuracy_std`` (across clients), ``loss``, ``client_accuracy`` ``[C]``.
  """
  strategy = client_axis.as_strategy(strategy)
  if eval_steps < 0:
    raise ValueError(f"eval_steps must be >= 0, got {eval_steps}")
  eval_fn = models.make_eval_fn(model)

  def evaluate(state, clients: ClientData):
    loss_fn = adapter_loss_fn(model, state.backbone, config)
    adapter_eval = lora.frozen_backbone(eval_fn, state.backbone, config.lora)

    def one_client(client):
      adapted = evaluation.fast_adapt(loss_fn, state.global_adapter,
                                      client.support, alpha=eval_alpha,
                                      steps=eval_steps)
      loss, correct = adapter_eval(adapted, client.query)
      return loss, correct, jnp.sum(client.query["mask"])

    return evaluation.summarise(*client_axis.map_clients(one_client, clients,
                                                         strategy))

  return jax.jit(evaluate)


def fedit(model: nn.Module, config: FedITConfig, *,
          strategy: base.Strategy = None, eval_alpha: float = 0.03,
          eval_steps: int = 1, pm: None = None) -> base.FederatedAlgorithm:
  """FedIT as a ``FederatedAlgorithm``: ``model`` is the PM module and
  ``init``'s params its weights, the frozen backbone."""
  base.no_pm("fedit", pm)
  strategy = client_axis.as_strategy(strategy)
  return base.FederatedAlgorithm(
      "fedit", lambda params, num_clients, key: init_state(
          params, num_clients, key, config),
      make_round(model, config, strategy),
      make_evaluate(model, config, strategy=strategy, eval_alpha=eval_alpha,
                    eval_steps=eval_steps),
      lambda state: global_params(state, config))


SPECS = (base.AlgorithmSpec("fedit", FedITConfig, "backbone", fedit,
                            label="FedIT"),)
