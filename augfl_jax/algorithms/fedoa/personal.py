"""FedOA's personal adapter: its objective ``R_e(phi_e; xi) + lam *
D(h(phi_e; xi), stop_grad(h(phi_g; xi)))`` and its local training
(``fedoa``'s module docstring).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from augfl_jax.algorithms.fedoa.config import FedOAConfig
from augfl_jax.core import local
from augfl_jax import models
from augfl_jax.models import lora
from augfl_jax.core.types import Batch, Params, PRNGKey

__all__ = ["feature_distance", "personal_objective", "train_personal"]


def feature_distance(h_personal: jax.Array, h_global: jax.Array,
                     mask: jax.Array, config: FedOAConfig) -> jax.Array:
  """``D`` over a minibatch: reduce_j d(h_p[j], h_g[j]) over real rows j.

  Args:
    h_personal, h_global: ``[n, d]`` features.
    mask: ``[n]``, 1 = real example.
    config: ``distance`` and ``reduction``.

  Returns:
    Scalar. ``d = ||h_p - h_g||_2`` (its gradient at ``h_p = h_g`` is taken
    as 0, the minimal-norm subgradient) or ``||h_p - h_g||_2^2``.
  """
  sq = jnp.sum(jnp.square(h_personal - h_global), axis=-1)
  if config.distance == "l2":
    positive = sq > 0
    d = jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)
  else:
    d = sq
  d = jnp.where(mask > 0, d, 0.0)
  if config.reduction == "sum":
    return jnp.sum(d)
  return jnp.sum(d) / jnp.maximum(jnp.sum(mask), 1.0)


def personal_objective(model: nn.Module, config: FedOAConfig,
                       backbone: Params, anchor: lora.Adapters):
  """``objective(personal, batch) -> scalar``: CE + lam * D (module doc).

  The backbone and the anchor adapter are ``stop_gradient``-ed: a gradient
  of the objective reaches only ``personal``.
  """
  features_fn = models.make_features_fn(model)
  frozen = jax.lax.stop_gradient(backbone)
  anchor = jax.lax.stop_gradient(anchor)

  def objective(personal: lora.Adapters, batch: Batch) -> jax.Array:
    mask = batch["mask"]
    y = jnp.where(mask > 0, batch["y"].astype(jnp.int32), 0)
    # Both models in ONE vmapped call: identical adapters then give bitwise
    # identical features under every client strategy, so the L2 distance is
    # exactly 0 there (its gradient 0) instead of float noise whose gradient
    # ``diff / ||diff||`` is a unit vector.
    both = jax.tree.map(lambda p, a: jnp.stack([p, a]), personal, anchor)
    h, logits = jax.vmap(lambda adapter: features_fn(
        lora.merge(frozen, adapter, config.lora), batch["x"], mask))(both)
    h_p, h_g, logits = h[0], h[1], logits[0]
    ce = models.masked_mean(optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), y), mask)
    reg = feature_distance(h_p.astype(jnp.float32),
                           jax.lax.stop_gradient(h_g).astype(jnp.float32),
                           mask, config)
    return ce + config.lam * reg

  return objective


def train_personal(model: nn.Module, config: FedOAConfig, backbone: Params,
                   anchor: lora.Adapters, personal: lora.Adapters,
                   data: Batch, key: PRNGKey):
  """``local_epochs`` epochs of SGD (step ``personal_step``) on the FedOA
  objective from ``personal``; returns ``(personal, mean objective)``."""
  return local.train(
      personal_objective(model, config, backbone, anchor),
      local.sgd(config.personal_step), personal, data, key,
      epochs=config.local_epochs, batch_size=config.batch_size)
