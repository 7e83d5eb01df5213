"""The non-finite guard: :func:`keep_finite` wraps a ``FederatedAlgorithm``
into one of the same interface whose round never hands back a non-finite
state (as optax's ``apply_if_finite`` wraps a ``GradientTransformation``).

When the new state or a metric of a round holds a NaN or inf, the wrapped
round returns the state it was given instead, and says so in its metrics:
``metrics[FINITE]`` (a bool) and ``metrics[NONFINITE]``, a per-leaf account
of where the non-finite values are (:func:`describe` turns it into one
sentence: metrics by name, state leaves by path, the training clients'
rows; :func:`split` takes both out of the metrics). Nothing here compiles:
the caller jits the round (``training.rounds`` does, donating the state:
the selection between the old and the new state is then fused into the
round's outputs, so the duals and client models are neither copied nor
kept twice). A round that cannot be traced (``traceable`` False: a Python
loop of its own, the CRD server step with ``loop="python"``) runs as it
is; its check then keeps the previous state until it is done.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.algorithms import FederatedAlgorithm
from augfl_jax.core.progress import some

__all__ = ["FINITE", "NONFINITE", "describe", "keep_finite", "split"]

# The wrapped round's metrics: whether the round was finite (its state
# kept), and where it was not: ``(state_flags, metric_flags)``.
FINITE, NONFINITE = "finite", "nonfinite"


def _is_float(leaf: Any) -> bool:
  return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def _select(ok: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
  """``new`` where ``ok`` else ``old`` (typed PRNG keys by their data)."""
  if jax.dtypes.issubdtype(new.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(
        jnp.where(ok, jax.random.key_data(new), jax.random.key_data(old)),
        impl=jax.random.key_impl(new))
  return jnp.where(ok, new, old)


def _nonfinite(state: Any, metrics: Any, num_clients: int):
  """``(ok, state_flags, metric_flags)``: per float leaf of the state, a
  bool (or ``[C]`` bools for a leaf stacked over the ``C`` clients) that is
  True where a value is non-finite; likewise per metric (``[K]`` for
  ``client_loss``)."""
  def flags(leaf):
    if not _is_float(leaf):
      return jnp.zeros((), bool)
    bad = ~jnp.isfinite(leaf)
    if leaf.ndim >= 1 and leaf.shape[0] == num_clients:
      return bad.reshape(num_clients, -1).any(1)
    return bad.any()
  state_flags = jax.tree.map(flags, state)
  metric_flags = {k: (~jnp.isfinite(v) if _is_float(v) else
                      jnp.zeros(jnp.shape(v), bool))
                  for k, v in metrics.items()}
  ok = ~jnp.any(jnp.stack([f.any() for f in jax.tree.leaves(
      (state_flags, metric_flags))] or [jnp.zeros((), bool)]))
  return ok, state_flags, metric_flags


def keep_finite(algorithm: FederatedAlgorithm) -> FederatedAlgorithm:
  """``algorithm`` whose round keeps the state it was given when the new
  state or a metric is not finite; its metrics gain :data:`FINITE` and
  :data:`NONFINITE` (module docstring). Everything else is
  ``algorithm``'s, ``traceable`` included: jit the round where it is."""
  inner = algorithm.round

  def finite_round(state, clients, participants=None):
    new, metrics = inner(state, clients, participants)
    ok, state_flags, metric_flags = _nonfinite(
        new, metrics, clients.num_examples.shape[0])
    if algorithm.traceable:  # one program: a selection, no copy
      new = jax.tree.map(lambda n, o: _select(ok, n, o), new, state)
    elif not bool(ok):
      new = state
    return new, {**metrics, FINITE: ok,
                 NONFINITE: (state_flags, metric_flags)}

  return dataclasses.replace(algorithm, round=finite_round)


def split(metrics: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
  """``(metrics, ok, flags)``: a guarded round's metrics without the
  guard's two, whether the round was finite and where it was not (as
  :func:`describe` takes them)."""
  rest = {k: v for k, v in metrics.items() if k not in (FINITE, NONFINITE)}
  return rest, metrics[FINITE], metrics[NONFINITE]


def describe(flags: Any, participants: np.ndarray | None,
             metrics: dict[str, Any]) -> str:
  """One sentence naming what was non-finite: metrics (``client_loss`` by
  training-client id, with its non-finite values), state leaves by path
  and the rows (training clients) of the client-stacked ones; at most a
  handful of clients and of leaves by name, then how many others
  (``clients 3, 7, 12 and 29 others``: ``core.progress.some``)."""
  state_flags, metric_flags = jax.device_get(flags)
  metrics = jax.device_get(metrics)
  parts = []
  for name, bad in metric_flags.items():
    bad = np.asarray(bad)
    if not bad.any():
      continue
    if name == "client_loss":
      ids = (np.arange(bad.shape[0]) if participants is None
             else np.asarray(participants))
      values = dict.fromkeys(str(v) for v in np.asarray(metrics[name])[bad])
      parts.append(f"client_loss of training "
                   f"{'clients' if bad.sum() > 1 else 'client'} "
                   f"{some(ids[bad].tolist())} ({', '.join(values)})")
    else:
      parts.append(f"{name} = {metrics[name]}" if bad.ndim == 0
                   else f"{name} (non-finite entries)")
  paths, rows = [], set()
  for keypath, bad in jax.tree_util.tree_flatten_with_path(state_flags)[0]:
    bad = np.asarray(bad)
    if not bad.any():
      continue
    paths.append(jax.tree_util.keystr(keypath))
    if bad.ndim == 1:
      rows.update(np.flatnonzero(bad).tolist())
  if paths:
    parts.append(f"parameters/state {some(paths)}" + (
        f" (rows of training {'clients' if len(rows) > 1 else 'client'} "
        f"{some(sorted(rows))})" if rows else ""))
  return "; ".join(parts)
