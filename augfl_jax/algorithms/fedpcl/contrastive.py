"""FedPCL's embedding and prototype-wise contrastive objective (``fedpcl``'s
module docstring): ``z = g(h(x)) / ||g(h(x))||`` and
``L = CE(z Cbar^T / tau, y) + (1/M) sum_m CE(z C_m^T / tau, y)``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from augfl_jax import models
from augfl_jax.core.types import Params

__all__ = [
    "contrastive_loss", "l2_normalize", "make_project_fn",
    "padded_client_prototypes"
]

_EXCLUDED = -1e30  # logit of a class left out of a softmax


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """``x / max(||x||, eps)`` row-wise (``torch.nn.functional.normalize``)."""
  sq = jnp.sum(x * x, axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sq, eps * eps))


def make_project_fn(model: nn.Module):
  """``project(params, h, mask) -> z [n, d]``: the unit-norm penultimate
  features of the projector ``model`` applied to encoder outputs ``h``."""
  features_fn = models.make_features_fn(model)

  def project(params: Params, h: jax.Array, mask: jax.Array) -> jax.Array:
    feats, _ = features_fn(params, h, mask)
    return l2_normalize(feats)

  return project


def padded_client_prototypes(local_protos: jax.Array, local_counts: jax.Array,
                             global_protos: jax.Array,
                             global_counts: jax.Array
                            ) -> tuple[jax.Array, jax.Array]:
  """Each client's prototype set with its missing classes filled from Cbar.

  Returns:
    ``(protos [M, K, d], valid [M, K])``: ``C_m^(k)`` where client m holds k,
    else ``Cbar^(k)``; valid where either exists.
  """
  held = local_counts > 0
  protos = jnp.where(held[..., None], local_protos, global_protos[None])
  return protos, held | (global_counts > 0)[None, :]


def _prototype_ce(z, labels, protos, valid, temperature):
  """``CE(z protos^T / tau, y)`` per row, invalid classes out of the softmax.

  Invalid logits are a large finite negative (not -inf), so rows the caller
  masks out stay finite, gradients included.
  """
  logits = jnp.where(valid[None, :], z @ protos.T / temperature, _EXCLUDED)
  true = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
  return jax.nn.logsumexp(logits, axis=-1) - true


def contrastive_loss(z: jax.Array, labels: jax.Array, mask: jax.Array,
                     global_protos: jax.Array, global_counts: jax.Array,
                     client_protos: jax.Array, client_valid: jax.Array, *,
                     temperature: float) -> tuple[jax.Array, dict]:
  """``L_g + L_p`` of FedPCL on one batch (module docstring).

  Args:
    z: ``[n, d]`` embeddings; labels ``[n]``; mask ``[n]``.
    global_protos: ``[K, d]``; global_counts ``[K]``.
    client_protos: ``[M, K, d]`` and client_valid ``[M, K]`` from
      ``padded_client_prototypes``.
    temperature: tau.

  Returns:
    ``(loss, {"global": L_g, "local": L_p})``; only real examples whose class
    has a global prototype count (masked means).
  """
  labels = jnp.where(mask > 0, labels, 0).astype(jnp.int32)
  has = global_counts > 0
  weight = jnp.where(has[labels], mask, 0.0)
  l_g = models.masked_mean(
      _prototype_ce(z, labels, global_protos, has, temperature), weight)
  per_client = jax.vmap(
      lambda p, v: models.masked_mean(
          _prototype_ce(z, labels, p, v, temperature), weight))(
              client_protos, client_valid)
  l_p = jnp.mean(per_client)
  return l_g + l_p, {"global": l_g, "local": l_p}
