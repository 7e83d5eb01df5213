"""The server split as the knowledge transfer reads it: minibatches, the
reference's augmentation, and the PM's outputs computed once.

Pure functions of arrays, used by :mod:`augfl_jax.transfer.crd`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.core.types import Batch, PRNGKey

__all__ = [
    "all_outputs", "AUGMENTATIONS", "crop_flip", "CROP_PADDING",
    "minibatch_positions", "server_arrays"
]

AUGMENTATIONS = ("none", "crop_flip")
CROP_PADDING = 4  # the reference's RandomCrop(size, padding=4)


def server_arrays(server: Batch) -> tuple[jax.Array, np.ndarray]:
  """The real rows of the server split: ``(x [n, ...], y [n] numpy)``."""
  if "x" not in server or "y" not in server:
    raise ValueError("server must be a Batch with 'x' and 'y' (and 'mask')")
  y = np.asarray(server["y"])
  mask = np.asarray(server.get("mask", np.ones(y.shape[0])))
  if y.ndim != 1 or mask.shape != y.shape:
    raise ValueError(f"server 'y' and 'mask' must be [n]; got {y.shape} "
                     f"and {mask.shape}")
  real = mask > 0
  x = server["x"] if real.all() else jnp.asarray(np.asarray(server["x"])[real])
  y = y[real]
  if y.size < 2 or np.unique(y).size < 2:
    raise ValueError(
        "CRD needs a server split with at least two classes (negatives come "
        f"from other classes); got {y.size} examples of classes "
        f"{np.unique(y).tolist()}")
  if y.min() < 0:
    raise ValueError(f"server labels must be >= 0, got min {y.min()}")
  return jnp.asarray(x), y.astype(np.int32)


def minibatch_positions(key: PRNGKey, n: int, batch_size: int,
                        steps: int) -> jax.Array:
  """``[steps, batch_size]`` int32 server positions, -1 for padding.

  Shuffled passes over ``0..n-1``, each cut into ``ceil(n / batch_size)``
  minibatches, the last one padded (DataLoader with ``drop_last=False``);
  the first ``steps`` minibatches are kept. Pass p is the argsort of
  ``jax.random.bits(key, (passes, n))[p]`` (ties, probability ~ n^2 / 2^33,
  keep index order).
  """
  per_pass = -(-n // batch_size)
  passes = -(-steps // per_pass)
  order = jnp.argsort(jax.random.bits(key, (passes, n), jnp.uint32),
                      axis=-1).astype(jnp.int32)
  order = jnp.pad(order, ((0, 0), (0, per_pass * batch_size - n)),
                  constant_values=-1)
  return order.reshape(passes * per_pass, batch_size)[:steps]


def crop_flip(keys: PRNGKey, x: jax.Array, fill: jax.Array) -> jax.Array:
  """The reference's server augmentation, per example: ``RandomCrop(H,
  padding=4)`` (pad every side with ``fill``, the value of a black pixel
  per channel, then cut an ``H x W`` window at a uniform offset in
  ``0..8``) and ``RandomHorizontalFlip`` (probability 1/2).

  Args:
    keys: ``[B]`` keys, one per example.
    x: ``[B, H, W, C]`` images.
    fill: ``[C]`` the padding value.

  Returns:
    ``[B, H, W, C]``.
  """
  pad = CROP_PADDING
  height, width = x.shape[1:3]

  def one(key, image):
    k_y, k_x, k_f = jax.random.split(key, 3)
    padded = jnp.broadcast_to(fill.astype(image.dtype),
                              (height + 2 * pad, width + 2 * pad,
                               image.shape[-1]))
    padded = jax.lax.dynamic_update_slice(padded, image, (pad, pad, 0))
    dy = jax.random.randint(k_y, (), 0, 2 * pad + 1)
    dx = jax.random.randint(k_x, (), 0, 2 * pad + 1)
    crop = jax.lax.dynamic_slice(padded, (dy, dx, 0), image.shape)
    return jnp.where(jax.random.bernoulli(k_f), crop[:, ::-1], crop)

  return jax.vmap(one)(keys, x)


def all_outputs(apply_fn: Callable[[Any, jax.Array, jax.Array], Any],
                consts: Any, x: jax.Array, batch_size: int) -> Any:
  """``apply_fn(consts, x_chunk, ones)`` over ``x [n, ...]`` in chunks of
  ``batch_size``, concatenated to ``[n, ...]`` leaves (the PM's outputs for
  the whole server split, for a PM whose output for an example does not
  depend on the rest of its batch)."""
  n = x.shape[0]
  chunks = -(-n // batch_size)
  padded = jnp.pad(x, ((0, chunks * batch_size - n),) + ((0, 0),) *
                   (x.ndim - 1))
  mask = jnp.ones((batch_size,), jnp.float32)
  out = jax.jit(lambda c, xs: jax.lax.map(lambda xb: apply_fn(c, xb, mask),
                                          xs))(
      consts, padded.reshape((chunks, batch_size) + x.shape[1:]))
  return jax.tree.map(lambda o: o.reshape((-1,) + o.shape[2:])[:n], out)
