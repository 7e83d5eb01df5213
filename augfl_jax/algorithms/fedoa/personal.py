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
  of the objective reaches only ``personal``. The anchor's features are a
  forward pass of the anchor model, outside the differentiated path (no
  backward pass through it); the anchor model's parameters are merged once,
  not at every step.

  A personal adapter equal to the anchor (every leaf, bit for bit: the
  personal adapter's first step from the global one) has ``D = 0`` and no
  regulariser gradient, as ``D(h, h) = 0``: the distance is then taken
  against the personal features themselves, not against the anchor's
  features from another computation, whose float rounding would give a
  nonzero L2 distance whose gradient ``diff / ||diff||`` is a unit
  vector.
  """
  features_fn = models.make_features_fn(model)
  frozen = jax.lax.stop_gradient(backbone)
  anchor = jax.lax.stop_gradient(anchor)
  anchor_params = lora.merge(frozen, anchor, config.lora)

  def objective(personal: lora.Adapters, batch: Batch) -> jax.Array:
    mask = batch["mask"]
    y = jnp.where(mask > 0, batch["y"].astype(jnp.int32), 0)
    h_p, logits = features_fn(lora.merge(frozen, personal, config.lora),
                              batch["x"], mask)
    h_g = jax.lax.stop_gradient(features_fn(anchor_params, batch["x"],
                                            mask)[0])
    same = jnp.all(jnp.stack([jnp.array_equal(p, a) for p, a in zip(
        jax.tree.leaves(personal), jax.tree.leaves(anchor))]))
    h_g = jnp.where(same, jax.lax.stop_gradient(h_p), h_g)
    # at least float32 (16-bit features upcast), float64 kept
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    ce = models.masked_mean(optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(dtype), y), mask)
    reg = feature_distance(h_p.astype(dtype), h_g.astype(dtype), mask, config)
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
