"""A round that never hands back a non-finite state (with the exceptions a
run stops with: :class:`NonFiniteError`, :class:`RunInterrupted`; the stop
signals are ``augfl_jax.processes.signals``).

:func:`guard_round` wraps a round ``(state, clients, participants) ->
(state, metrics)``: when the new state or a metric holds a NaN or inf it
returns the state it was given instead, with a per-leaf account of where the
non-finite values are (:func:`describe` turns it into one sentence: metrics
by name, state leaves by path, the training clients' rows). Fused, the guard
and the round are one jitted program that DONATES the state: the selection
between old and new is fused into the round's outputs, so the duals and
client models are neither copied nor kept twice.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.core import jit
from augfl_jax.core.progress import some

__all__ = ["guard_round", "describe", "NonFiniteError", "RunInterrupted"]


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


def guard_round(round_fn: Callable[..., tuple[Any, dict[str, jax.Array]]],
                num_clients: int, *, fused: bool = True) -> Callable[..., Any]:
  """``guarded(state, clients, participants) -> (state, metrics, ok,
  flags)``: the round's outputs when they are all finite, else the input
  state (``ok`` False; ``flags`` as :func:`describe` takes them).

  Args:
    round_fn: a round that can be traced (a jitted function is).
    num_clients: ``C``, the leading axis of the client-stacked state.
    fused: one jitted program that donates ``state``. ``False`` for a round
      that runs a Python loop of its own (the CRD server step with
      ``loop="python"``), which must not be traced into one program: it
      runs as it is and the previous state is kept until the check.
  """
  def guarded(state, clients, participants=None):
    new, metrics = round_fn(state, clients, participants)
    ok, state_flags, metric_flags = _nonfinite(new, metrics, num_clients)
    kept = jax.tree.map(lambda n, o: _select(ok, n, o), new, state)
    return kept, metrics, ok, (state_flags, metric_flags)

  if fused:
    return jit.hoisted_jit(guarded, donate_first=True)
  check = jax.jit(lambda new, metrics: _nonfinite(new, metrics, num_clients))

  def unfused(state, clients, participants=None):
    new, metrics = round_fn(state, clients, participants)
    ok, state_flags, metric_flags = check(new, metrics)
    return (new if bool(ok) else state), metrics, ok, (state_flags,
                                                       metric_flags)
  return unfused


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


class RunInterrupted(Exception):
  """SIGINT or SIGTERM stopped the run; its state, if any, was saved.

  Attributes: ``signum``, ``round`` (the last completed round) and
  ``checkpoint`` (the checkpoint the stop saved; ``None`` before round 1,
  and after a run the signal came too late to stop, which ended as usual).
  """

  def __init__(self, message: str, signum: int, round_: int,
               checkpoint_path: str | None):
    super().__init__(message)
    self.signum, self.round, self.checkpoint = signum, round_, checkpoint_path


class NonFiniteError(FloatingPointError):
  """A round or an evaluation produced a NaN or inf (the last good state
  was saved first)."""
