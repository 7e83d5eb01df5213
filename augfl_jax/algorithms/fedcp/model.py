"""FedCP's client model (``fedcp``'s module docstring): the conditional
policy network (CPN), the split of the features into a personal and a global
part, the ensemble of the personal and the global head, and the MMD
regulariser of the local objective.

With ``r = f(x; W^fe)`` (``[n, d]``) and ``v = normalize(sum_k W^hp[:, k])``:
``(p, g) = CPN(r * v)``, ``r_p = r * p``, ``r_g = r * g`` and
``logits = W^hp(r_p) + W^hg(r_g)``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from augfl_jax.algorithms import prototypes
from augfl_jax.core.types import Params, PRNGKey

__all__ = [
    "ConditionalPolicy", "context_vector", "dense", "ensemble_logits",
    "gumbel_noise", "mmd", "MMD_BANDWIDTHS", "split_features", "split_head"
]

MMD_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


class ConditionalPolicy(nn.Module):
  """The CPN: ``Dense(2d) -> LayerNorm -> ReLU -> [n, 2, d] -> softmax``.

  Attributes:
    dim: the feature width d.
  """

  dim: int

  @nn.compact
  def __call__(self, x: jax.Array, noise: jax.Array | None = None,
               temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Policies for ``x [n, d]``.

    Args:
      x: the conditional input ``r * v``.
      noise: ``[n, 2, d]`` Gumbel noise, or None (plain softmax).
      temperature: the Gumbel-softmax tau.

    Returns:
      ``(p, g)``, each ``[n, d]`` in [0, 1], ``p + g = 1``: the personal and
      global policies.
    """
    h = nn.Dense(2 * self.dim, name="fc")(x)
    h = nn.relu(nn.LayerNorm(epsilon=1e-5, name="norm")(h))
    h = h.reshape((x.shape[0], 2, self.dim))
    if noise is not None:
      h = h + noise
    policy = jax.nn.softmax(h / temperature, axis=1)
    return policy[:, 0], policy[:, 1]


def dense(head: Params, x: jax.Array) -> jax.Array:
  """A classifier head: ``x @ kernel + bias``."""
  return x @ head["kernel"] + head["bias"]


def context_vector(personal_head: Params) -> jax.Array:
  """``v = normalize(sum_k W^hp[:, k])`` (``[d]``), no gradient."""
  v = jnp.sum(jax.lax.stop_gradient(personal_head["kernel"]), axis=1)
  return v / jnp.maximum(jnp.linalg.norm(v), 1e-12)


def split_features(cpn_params: Params, features: jax.Array,
                   context: jax.Array, noise: jax.Array | None = None,
                   temperature: float = 1.0):
  """``(r_p, r_g, p, g)`` for features ``r [n, d]``: ``r_p = r * p`` and
  ``r_g = r * g`` with ``(p, g) = CPN(r * v)``, so ``r_p + r_g = r``."""
  p, g = ConditionalPolicy(features.shape[-1]).apply(
      {"params": cpn_params}, features * context[None, :], noise,
      temperature)
  return features * p, features * g, p, g


def gumbel_noise(key: PRNGKey, shape: tuple[int, ...]) -> jax.Array:
  """Standard Gumbel samples ``-log(-log U)``."""
  return jax.random.gumbel(key, shape)


def mmd(x: jax.Array, y: jax.Array, mask: jax.Array,
        bandwidths=MMD_BANDWIDTHS) -> jax.Array:
  """RBF-kernel MMD^2 of the code over the real rows (``mask > 0``).

  ``mean_{j,l real} [k(x_j, x_l) + k(y_j, y_l) - 2 k(x_j, y_l)]`` with
  ``k(a, b) = sum_s exp(-||a - b||^2 / (2 s))`` over the bandwidths s.
  """
  real = (mask > 0)[:, None]
  x, y = jnp.where(real, x, 0.0), jnp.where(real, y, 0.0)

  def kernel(a, b):
    d2 = (jnp.sum(a * a, 1)[:, None] + jnp.sum(b * b, 1)[None, :]
          - 2.0 * a @ b.T)
    return sum(jnp.exp(-0.5 * d2 / s) for s in bandwidths)

  pair = (real & real.T).astype(x.dtype)
  total = kernel(x, x) + kernel(y, y) - 2.0 * kernel(x, y)
  return jnp.sum(pair * total) / jnp.maximum(jnp.sum(pair), 1.0)


def split_head(params: Params) -> tuple[str, Params, Params]:
  """``(name, extractor, head)``: the classifier's name in ``params``, the
  params without it (W^fe) and the classifier (W^hg)."""
  name = prototypes.head_name(params)
  return name, {k: v for k, v in params.items() if k != name}, params[name]


def ensemble_logits(model: nn.Module, extractor: Params, cpn: Params,
                    personal_head: Params, global_head: Params,
                    context: jax.Array, x: jax.Array, mask: jax.Array,
                    noise: jax.Array | None, head_key: str,
                    temperature: float) -> tuple[jax.Array, jax.Array]:
  """``(logits [n, K], features r [n, d])`` of a client's ensemble on ``x``:
  ``W^hp(r_p) + W^hg(r_g)`` (``W^hg`` without gradient), ``r`` the features
  of ``model`` with the extractor's params, ``head_key`` its classifier."""
  rep, _ = model.apply({"params": {**extractor, head_key: global_head}}, x,
                       mask=mask)
  rep_p, rep_g, _, _ = split_features(cpn, rep, context, noise, temperature)
  logits = (dense(personal_head, rep_p) +
            dense(jax.lax.stop_gradient(global_head), rep_g))
  return logits, rep
