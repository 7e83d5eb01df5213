"""Masked normalisation layers and padding helpers shared by the models.

The reference (CRD / AugFL PyTorch code) runs its client models in training
mode everywhere, so batch-norm statistics always come from the batch at hand,
also during evaluation. ``MaskedBatchNorm`` does the same, with a mask so
that padded rows never enter the statistics; a client model has only a
``"params"`` collection, so every model function is pure in its parameters
and can be vmapped / differentiated over clients. The reference runs its
pretrained teacher in eval mode instead, with running statistics gathered
while it trained: a model applied with a mutable ``"batch_stats"``
collection keeps such running averages (PyTorch's: momentum 0.1, unbiased
variance), and ``norm="running"`` normalises with them.

``norm`` strings understood by every model:

* ``"batch"``: ``MaskedBatchNorm``, per-batch statistics of the REAL examples
  (mask 1) of the batch the model is applied to, as the reference does.
* ``"running"``: the same layers and parameters, normalised with the running
  statistics of the ``"batch_stats"`` collection (eval mode; each example on
  its own, so the outputs do not depend on the rest of the batch).
* ``"group"``: ``flax.linen.GroupNorm``, per-example statistics (independent of
  the rest of the batch, so independent of padding by construction).
* ``"none"``: identity.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = [
    "apply_norm", "check_norm", "group_count", "masked_moments",
    "MaskedBatchNorm", "NORMS", "RUNNING_MOMENTUM", "zero_padding"
]

NORMS = ("batch", "running", "group", "none")
# PyTorch's BatchNorm momentum: running = (1 - m) running + m batch.
RUNNING_MOMENTUM = 0.1


def check_norm(norm: str) -> str:
  """Returns ``norm`` if it is one of ``NORMS``; raises ``ValueError`` else."""
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  return norm


def _row_weights(x: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Broadcastable per-row weights ``[n, 1, ..., 1]`` (float32) for ``x``."""
  n = x.shape[0]
  if mask is None:
    w = jnp.ones((n,), jnp.float32)
  else:
    if mask.shape != (n,):
      raise ValueError(
          f"mask must have shape [n] = {(n,)} to match x {x.shape}, "
          f"got {mask.shape}.")
    w = mask.astype(jnp.float32)
  return w.reshape((n,) + (1,) * (x.ndim - 1))


def zero_padding(x: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Sets the padded rows (mask 0) of ``x`` to zero.

  The models call this on their input so that whatever a padded row holds
  (garbage, huge values, even inf/NaN) cannot overflow inside the network and
  turn a ``0 * inf`` into a NaN in a weight gradient. Real rows are untouched.

  Args:
    x: ``[n, ...]`` inputs.
    mask: ``[n]`` mask (1 = real, 0 = padding) or None (all real).

  Returns:
    ``[n, ...]``, ``x`` with padded rows replaced by zeros.
  """
  if mask is None:
    return x
  keep = _row_weights(x, mask) > 0
  return jnp.where(keep, x, jnp.zeros((), x.dtype))


def _centred_moments(
    x: jax.Array, mask: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(mean [C], var [C], centred [n, ..., C])``; see ``masked_moments``.

  ``centred`` is ``x - mean`` on real rows and exactly 0 on padded rows.
  """
  x = x.astype(jnp.float32)
  w = _row_weights(x, mask)
  keep = w > 0
  axes = tuple(range(x.ndim - 1))
  spatial = math.prod(x.shape[1:-1])
  count = jnp.maximum(jnp.sum(w) * spatial, 1.0)
  mean = jnp.sum(jnp.where(keep, w * x, 0.0), axis=axes) / count
  centred = jnp.where(keep, x - mean, 0.0)
  var = jnp.sum(w * jnp.square(centred), axis=axes) / count
  return mean, var, centred


def masked_moments(
    x: jax.Array, mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """Per-channel mean and biased variance of the real rows of ``x``.

  With ``w_n = mask_n`` broadcast over the spatial axes and ``c`` indexing the
  last (channel) axis::

    count  = sum_n w_n * prod(spatial)
    mean_c = sum_{n,s} w_n x_{n,s,c} / max(count, 1)
    var_c  = sum_{n,s} w_n (x_{n,s,c} - mean_c)^2 / max(count, 1)

  Padded rows are removed with ``jnp.where`` (not only multiplied by zero), so
  neither their values nor their gradients can leak in, even if they are huge.
  An all-padding batch gives mean 0 and variance 0 instead of NaN.

  Args:
    x: ``[n, ..., C]`` activations (any number of spatial axes, possibly 0).
    mask: ``[n]`` (1 = real, 0 = padding) or None (all rows real).

  Returns:
    ``(mean, var)``, each ``[C]`` float32.
  """
  mean, var, _ = _centred_moments(x, mask)
  return mean, var


class MaskedBatchNorm(nn.Module):
  """Batch norm with statistics from the real examples of the current batch.

  With ``use_running_average=False`` (``norm="batch"``) the statistics are
  the batch's: computed over the batch and spatial axes of the rows with
  mask 1 only (training-mode batch norm, as the reference runs its client
  models, also at evaluation). ``y = (x - mean) / sqrt(var + epsilon) *
  scale + bias`` per channel (last axis), see ``masked_moments``. Adding
  padded rows (mask 0) with any values changes neither the outputs of the
  real rows nor their gradients. Padded rows are centred to exactly 0 (their
  output is ``bias``), so even inf/NaN there cannot reach a parameter
  gradient through ``0 * inf``.

  When the ``"batch_stats"`` collection is mutable (PM pretraining), the
  layer also keeps running averages ``mean`` and ``var`` (initialised to 0
  and 1): ``running <- (1 - momentum) running + momentum batch``, with the
  variance unbiased by ``count / (count - 1)``, as PyTorch does. With
  ``use_running_average=True`` (``norm="running"``) it normalises with those
  instead (eval mode).

  Attributes:
    epsilon: added to the variance (PyTorch's BatchNorm2d default, 1e-5).
    use_scale: learn a per-channel scale, initialised to 1.
    use_bias: learn a per-channel bias, initialised to 0.
    use_running_average: normalise with the running statistics.
    momentum: weight of a batch in the running statistics.
  """

  epsilon: float = 1e-5
  use_scale: bool = True
  use_bias: bool = True
  use_running_average: bool = False
  momentum: float = RUNNING_MOMENTUM

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Normalises ``x``.

    Args:
      x: ``[n, ..., C]`` activations.
      mask: ``[n]`` (1 = real, 0 = padding) or None (all rows real).

    Returns:
      ``[n, ..., C]``, same dtype as ``x``.
    """
    channels = x.shape[-1]
    tracking = (self.use_running_average or
                self.is_mutable_collection("batch_stats"))
    if tracking:
      ra_mean = self.variable("batch_stats", "mean", jnp.zeros, (channels,),
                              jnp.float32)
      ra_var = self.variable("batch_stats", "var", jnp.ones, (channels,),
                             jnp.float32)
    if self.use_running_average:
      keep = _row_weights(x, mask) > 0
      centred = jnp.where(keep, x.astype(jnp.float32) - ra_mean.value, 0.0)
      var = ra_var.value
    else:
      mean, var, centred = _centred_moments(x, mask)
      if tracking and not self.is_initializing():
        count = jnp.sum(_row_weights(x, mask)) * math.prod(x.shape[1:-1])
        unbiased = var * count / jnp.maximum(count - 1.0, 1.0)
        m = self.momentum
        ra_mean.value = (1 - m) * ra_mean.value + m * mean
        ra_var.value = (1 - m) * ra_var.value + m * unbiased
    y = centred * jax.lax.rsqrt(var + self.epsilon)
    if self.use_scale:
      y = y * self.param("scale", nn.initializers.ones, (channels,))
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (channels,))
    return y.astype(x.dtype)


def group_count(channels: int, max_groups: int = 32) -> int:
  """The largest divisor of ``channels`` that is at most ``max_groups``."""
  for g in range(min(max_groups, channels), 0, -1):
    if channels % g == 0:
      return g
  return 1


def apply_norm(
    norm: str,
    x: jax.Array,
    mask: jax.Array | None,
    *,
    name: str | None = None,
    num_groups: int = 32,
    epsilon: float = 1e-5,
) -> jax.Array:
  """Applies the normalisation named ``norm``; call inside ``nn.compact``.

  The submodule (if any) is created in the calling module's scope under
  ``name``.

  Args:
    norm: ``"batch"`` (``MaskedBatchNorm``: per-batch statistics of the real
      examples, as the reference does), ``"running"`` (``MaskedBatchNorm``
      with the running statistics of ``"batch_stats"``), ``"group"`` (``nn.GroupNorm`` with
      ``group_count(C, num_groups)`` groups) or ``"none"`` (identity).
    x: ``[n, ..., C]`` activations.
    mask: ``[n]`` (1 = real, 0 = padding) or None; only ``"batch"`` uses it.
    name: name of the created submodule.
    num_groups: upper bound on the number of groups of ``"group"``.
    epsilon: variance epsilon.

  Returns:
    ``[n, ..., C]`` normalised activations.
  """
  check_norm(norm)
  if norm in ("batch", "running"):
    return MaskedBatchNorm(epsilon=epsilon, name=name,
                           use_running_average=norm == "running")(x, mask)
  if norm == "group":
    groups = group_count(x.shape[-1], num_groups)
    return nn.GroupNorm(num_groups=groups, epsilon=epsilon, name=name)(x)
  return x
