"""A run across processes (``jax.distributed``): who writes, where the
clients live, and what the processes decide together.

Every process runs the same command (``experiments.run`` with its
``--distributed.*`` flags, or ``training.run`` after
``processes.group.initialize``); ``jax.devices()`` then lists the devices of
all processes and the run's client axis is sharded over all of them
(:func:`run_strategy`: ``"sharded:<inner>"``, the server's sums over
clients an all-reduce). In one process every function here is the
identity, or nothing, so that a one-process run is unchanged.

* Writer: process 0 (:func:`is_writer`) writes the run directory's files
  and the console; every process writes its own shards of a checkpoint
  (orbax's multi-process saving) and reads the directory, which must be
  one shared file system.
* Clients: every process builds the partition, the server split, the PM
  and the held-out clients identically (one seed; :mod:`augfl_jax.data`
  builds them from the dataset's files), and keeps and places only the
  training clients of its own devices (:func:`place_clients`, rows
  ``core.distributed.local_client_range``); the state's per-client leaves
  are split the same way, the rest replicated (:func:`place_state`).
* Agreement: every decision that ends or saves a round is taken by all
  processes at once: a signal received by any process (:func:`agree`) and
  the same non-finite checks and evaluations, computed on the same global
  arrays.

How the processes start and end together is
:mod:`augfl_jax.processes.group`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from augfl_jax.core import client_axis, distributed

__all__ = [
    "agree", "count", "describe", "gather", "index", "is_writer",
    "place_clients", "place_state", "run_strategy", "start", "sync",
    "to_host"
]


def count() -> int:
  """The number of processes of the run (1 without ``jax.distributed``)."""
  return jax.process_count()


def index() -> int:
  """This process's index, 0 .. ``count() - 1``."""
  return jax.process_index()


def is_writer() -> bool:
  """Whether this process writes the run's files and console: process 0."""
  return jax.process_index() == 0


def run_strategy(strategy: client_axis.ClientStrategy
                ) -> client_axis.ClientStrategy:
  """The strategy of a run's rounds and evaluations: ``strategy`` in one
  process; across processes the client axis sharded over all devices,
  each device running its clients as ``strategy`` says (``"auto"``: the
  backend's default), unless ``strategy`` is ``"sharded"`` already."""
  if count() == 1 or strategy.name == "sharded":
    return strategy
  return client_axis.ClientStrategy("sharded", strategy.chunk_size,
                                    inner=strategy.name)


def describe(strategy: client_axis.ClientStrategy) -> str:
  """``"sharded:map over 4 devices of 2 processes"``, ``"map"``."""
  if strategy.name != "sharded":
    return strategy.name
  return (f"sharded:{strategy.inner} over {jax.device_count()} devices of "
          f"{count()} processes")


def _host(leaf: Any) -> np.ndarray:
  return np.asarray(jax.device_get(leaf))


def _place(leaf: Any, per_client: bool, strategy) -> Any:
  """One leaf (host or one device) as a global array: split on the client
  axis or replicated."""
  place = distributed.shard_clients if per_client else distributed.replicate
  return place(leaf, strategy)


def _splits(num_clients: int, strategy: client_axis.ClientStrategy) -> bool:
  """Whether the run's arrays are split on the client axis: a sharded
  strategy whose mesh divides the clients (always across processes: the
  run checks it)."""
  return strategy.name == "sharded" and (
      count() > 1 or num_clients % client_axis.client_mesh(strategy).shape[
          strategy.axis_name] == 0)


def place_state(state: Any, num_clients: int,
                strategy: client_axis.ClientStrategy) -> Any:
  """For a sharded ``strategy``, ``state`` (the same in every process) as
  global arrays on its mesh: leaves ``[num_clients, ...]`` split on the
  client axis, every other leaf replicated. Otherwise, or in one process
  when the mesh does not divide the clients (the strategy pads them),
  ``state``."""
  if not _splits(num_clients, strategy):
    return state
  return jax.tree.map(
      lambda a: _place(a, np.ndim(a) >= 1 and np.shape(a)[0] == num_clients,
                       strategy), state)


def start(make_state: Callable[..., Any], args: Any, num_clients: int,
          strategy: client_axis.ClientStrategy) -> Any:
  """``make_state(*args)``, the state a run starts from, placed as
  :func:`place_state` places it. It is computed by one jitted program whose
  outputs are split already, so that no process holds every client's state
  (``args``, host arrays, are the same in every process); a ``make_state``
  that does not trace (it needs concrete values) runs as it is and is
  placed afterwards."""
  if not _splits(num_clients, strategy):
    return make_state(*args)
  args = jax.tree.map(_host, args)
  try:
    shapes = jax.eval_shape(make_state, *args)
  except jax.errors.JAXTypeError:
    return place_state(make_state(*args), num_clients, strategy)
  split = client_axis.client_sharding(strategy)
  whole = distributed.replicated_sharding(strategy)
  shardings = jax.tree.map(
      lambda s: split if s.ndim >= 1 and s.shape[0] == num_clients
      else whole, shapes)
  return jax.jit(make_state, out_shardings=shardings)(*args)


def place_clients(clients: Any, strategy: client_axis.ClientStrategy
                 ) -> Any:
  """For a sharded ``strategy``, the training clients as global ``[C,
  ...]`` arrays split on the client axis, of which this process holds only
  its own rows (``local_client_range``); the other rows of ``clients`` are
  dropped here. Otherwise (as :func:`place_state`) ``clients``."""
  num = jax.tree.leaves(clients)[0].shape[0]
  if not _splits(num, strategy):
    return clients
  lo, hi = distributed.local_client_range(num, strategy)
  return distributed.shard_local_clients(
      jax.tree.map(lambda a: _host(a)[lo:hi], clients), strategy)


def to_host(tree: Any) -> Any:
  """``jax.device_get(tree)``, for global arrays too: a replicated leaf
  from this process's copy, a split one gathered from all processes (a
  collective: every process calls it)."""
  if count() == 1:
    return jax.device_get(tree)

  def get(leaf):
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
      return jax.device_get(leaf)
    if leaf.is_fully_replicated:
      return np.asarray(leaf.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
  return jax.tree.map(get, tree)


def gather(value: np.ndarray) -> np.ndarray:
  """``[count(), ...]``: every process's ``value`` (same shape in all; a
  collective)."""
  if count() == 1:
    return np.asarray(value)[None]
  return np.asarray(multihost_utils.process_allgather(np.asarray(value)))


def agree(value: int) -> int:
  """The largest of every process's ``value`` (a collective; in one
  process, ``value``)."""
  if count() == 1:
    return int(value)
  return int(np.max(gather(np.int32(value))))


def sync(name: str) -> None:
  """Waits until every process gets here (nothing in one process)."""
  if count() > 1:
    multihost_utils.sync_global_devices(name)
