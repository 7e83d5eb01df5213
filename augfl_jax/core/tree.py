"""The few pytree helpers that ``optax.tree`` and ``jax.tree`` do not offer.

All of them act on pytrees whose leaves share a leading client axis ``C``.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.core.types import Params

__all__ = [
    "all_finite", "broadcast_to_clients", "check_participants", "checked_round",
    "client_subset", "digest", "put", "take", "weighted_mean", "weighted_sum"
]


def broadcast_to_clients(tree: Params, num_clients: int) -> Params:
  """Stacks ``num_clients`` copies of ``tree``: leaves ``[...]`` -> ``[C, ...]``.

  Raises:
    ValueError: ``num_clients`` is not an int >= 1.
  """
  if (isinstance(num_clients, bool) or
      not isinstance(num_clients, (int, np.integer)) or num_clients < 1):
    raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
  return jax.tree.map(
      lambda leaf: jnp.broadcast_to(leaf, (num_clients,) + jnp.shape(leaf)),
      tree)


def weighted_sum(stacked: Params, weights: jax.Array) -> Params:
  """``sum_i weights[i] * stacked[i]`` over the leading client axis.

  Args:
    stacked: pytree with leaves ``[C, ...]``.
    weights: ``[C]``.

  Returns:
    A pytree with leaves ``[...]``.
  """
  return jax.tree.map(
      lambda leaf: jnp.tensordot(weights.astype(leaf.dtype), leaf, axes=1),
      stacked)


def weighted_mean(stacked: Params, weights: jax.Array) -> Params:
  """``sum_i w_i x_i / sum_i w_i`` over the leading client axis (weights ``[C]``)."""
  return weighted_sum(stacked, weights / jnp.sum(weights))


def take(stacked: Params, indices: jax.Array | int) -> Params:
  """Rows ``indices`` (``[K]`` ints, or one) of every leaf: ``[C, ...]`` ->
  ``[K, ...]`` (``[...]`` for one).

  Raises:
    ValueError: a concrete index outside ``[0, C)``. Traced ones (under
      jit) cannot be checked: one out of range is clamped (``100`` of 32
      clients takes client 31).
  """
  if not isinstance(indices, jax.core.Tracer):
    ids = np.asarray(indices)
    num = jax.tree.leaves(stacked)[0].shape[0]
    if not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"client indices must be integers, got {ids.dtype}")
    outside = ids[(ids < 0) | (ids >= num)]
    if outside.size:
      raise ValueError(f"client indices {outside.tolist()[:5]} are out of "
                       f"range: the {num} clients are 0..{num - 1}")
  return jax.tree.map(lambda leaf: leaf[indices], stacked)


def put(stacked: Params, indices: jax.Array, rows: Params) -> Params:
  """Returns ``stacked`` with rows ``indices`` replaced by ``rows`` (``[K, ...]``)."""
  return jax.tree.map(lambda leaf, new: leaf.at[indices].set(new), stacked, rows)


def all_finite(tree: Params) -> jax.Array:
  """Scalar bool: every element of every leaf is finite."""
  leaves = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def check_participants(participants: Any, num_clients: int) -> None:
  """Raises ``ValueError`` unless ``participants`` names a non-empty set of
  distinct client ids in ``[0, num_clients)``.

  Only concrete values can be checked: ``None`` (everyone) and a traced
  array (inside ``jax.jit``, ``vmap``, ...) pass unchecked. Under jit a
  bad array is NOT an error, and its rounds are wrong without a word: an
  id out of range is clamped when the client's rows are gathered (``100``
  of 32 clients trains client 31) and dropped when they are written back
  (its update is lost); a repeated id trains that client twice and counts
  it twice in the round's loss; an empty array makes the loss 0/0 = NaN.
  Call this where the ids are known: every method's ``make_round`` does,
  before entering jit (:func:`checked_round`), and ``training.run`` where it
  draws them.
  """
  if participants is None or isinstance(participants, jax.core.Tracer):
    return
  ids = np.asarray(participants)
  if ids.ndim != 1:
    raise ValueError(f"participants must be a [K] array of client ids, got "
                     f"shape {ids.shape}")
  if ids.size == 0:
    raise ValueError("participants is empty: a round needs at least one "
                     "client (None: all of them)")
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"participants must be integer client ids, got dtype "
                     f"{ids.dtype}")
  outside = ids[(ids < 0) | (ids >= num_clients)]
  if outside.size:
    raise ValueError(f"participants {outside.tolist()} are not client ids: "
                     f"the {num_clients} clients are 0..{num_clients - 1}")
  values, counts = np.unique(ids, return_counts=True)
  if (counts > 1).any():
    raise ValueError(f"participants {values[counts > 1].tolist()} appear "
                     "more than once: each client takes part at most once "
                     "a round")


def checked_round(round_fn: Callable[..., Any], position: int
                 ) -> Callable[..., Any]:
  """``round_fn`` (jitted, ``round_fn(state, clients, ...)``) with
  :func:`check_participants` on its ``participants`` argument (keyword, or
  positional at ``position``) before the call; attributes of the jitted
  function (``lower``, ``trace``, ...) are those of ``round_fn``."""

  @functools.wraps(round_fn)
  def checked(*args, **kwargs):
    participants = kwargs.get(
        "participants", args[position] if len(args) > position else None)
    if len(args) > 1:
      clients = args[1]
    else:
      clients = kwargs.get("clients")
    if clients is not None:
      check_participants(participants, clients.num_examples.shape[0])
    return round_fn(*args, **kwargs)

  for name in ("lower", "trace", "eval_shape", "clear_cache"):
    if hasattr(round_fn, name):
      setattr(checked, name, getattr(round_fn, name))
  return checked


def client_subset(participants: jax.Array | None):
  """``(select, merge)`` for a round in which only ``participants`` take part.

  ``select(stacked)`` keeps the participants' rows (``[C, ...]`` ->
  ``[K, ...]``); ``merge(stacked, rows)`` writes their new rows back. With
  ``participants=None`` (everyone) both are the identity, so full
  participation costs no gather or scatter.

  ``participants`` must be distinct ids in ``[0, C)``: a round checks
  them before it is traced (:func:`checked_round`); out-of-range or
  repeated ids give wrong rounds silently (:func:`check_participants`).
  """
  if participants is None:
    return (lambda stacked: stacked), (lambda stacked, rows: rows)
  return (lambda stacked: take(stacked, participants),
          lambda stacked, rows: put(stacked, participants, rows))


def digest(tree: Any) -> str:
  """SHA-256 (hex) of every leaf of ``tree`` on the host, shapes and dtypes
  included: the identity of the arrays (the same digest iff the same
  arrays, in the same tree order)."""
  sha = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    array = np.ascontiguousarray(jax.device_get(leaf))
    sha.update(f"{array.shape}{array.dtype.str}".encode())
    sha.update(array.tobytes())
  return sha.hexdigest()
