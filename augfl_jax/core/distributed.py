"""A round across processes: placing its inputs as global arrays.

Under ``jax.distributed.initialize()`` every process runs the same Python
program and ``jax.devices()`` lists the devices of all processes, so the
``"sharded"`` client strategy's default mesh (``clients.client_mesh``)
spans them and ``augfl.make_round(..., strategy="sharded:map")`` runs the
client axis on all of them: each device its own clients, the server's sums
over clients (Eq. (13)) an XLA all-reduce across processes. What the
processes must agree on is the round's inputs, as global arrays (``jax.Array``):

* per-client leaves (``[C, ...]``: client data, duals, client models, round
  counters) split on the client axis: ``shard_clients`` when every process
  can build all of them (e.g. from one seed), ``shard_local_clients`` when
  each process loaded only its own clients (``local_client_range``);
* everything shared by all clients (the server model, scalars) whole on
  every device: ``replicate``.

``C`` must be a multiple of the number of devices (global arrays are split
evenly). The outputs stay global: per-client leaves split as the inputs,
the server model replicated; ``jax.experimental.multihost_utils.
process_allgather`` brings a per-client leaf whole to every process.
In one process the same functions place the data on its local devices.

``experiments.run`` with ``--distributed.*`` flags runs a whole experiment
this way (``augfl_jax.processes``: data, PM, evaluation,
checkpoints); for a loop of one's own, every process calls (as
``tests/test_distributed.py`` does on 2 processes x 4 CPU devices, getting
the single-process numbers)::

  jax.distributed.initialize()   # before any other JAX call
  strategy = clients.as_strategy("sharded:map")
  state = augfl.init_state(params, num_clients)
  state = state.replace(
      params=distributed.replicate(state.params, strategy),
      duals=distributed.shard_clients(state.duals, strategy),
      client_params=distributed.shard_clients(state.client_params, strategy),
      client_rounds=distributed.shard_clients(state.client_rounds, strategy),
      round=distributed.replicate(state.round, strategy))
  lo, hi = distributed.local_client_range(num_clients, strategy)
  data = distributed.shard_local_clients(load_clients(lo, hi), strategy)
  state, metrics = augfl.make_round(loss_fn, config, strategy)(state, data)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from augfl_jax.core.client_axis import (
    ClientStrategy, as_strategy, client_mesh, client_sharding)

__all__ = [
    "local_client_range", "replicate", "replicate_beside",
    "replicated_sharding", "shard_clients", "shard_local_clients"
]


def replicated_sharding(strategy: str | ClientStrategy) -> NamedSharding:
  """``NamedSharding`` that keeps a whole copy on every device of the mesh."""
  return NamedSharding(client_mesh(as_strategy(strategy)), PartitionSpec())


def _put(leaf: Any, sharding: NamedSharding) -> jax.Array:
  """``leaf`` (the same value in every process: host or one device) as a
  global array of ``sharding``, each process copying only its devices'
  part; a typed PRNG key by its data."""
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
      leaf.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(_put(jax.random.key_data(leaf), sharding),
                                    impl=jax.random.key_impl(leaf))
  host = np.asarray(leaf)
  return jax.make_array_from_callback(host.shape, sharding,
                                      lambda idx: host[idx])


def replicate(tree: Any, strategy: str | ClientStrategy) -> Any:
  """Places ``tree`` (the same value in every process) whole on every
  device of the strategy's mesh: the server model, scalars, anything that
  all clients share. Works in one process and across processes."""
  sharding = replicated_sharding(strategy)
  return jax.tree.map(lambda leaf: _put(leaf, sharding), tree)


def replicate_beside(tree: Any, args: Any) -> Any:
  """The arrays of ``tree`` that sit on one device (a PM's weights, the
  server split a round closes over) replicated on every device of the mesh
  that ``args``' global arrays span, so that one jitted program takes them
  all (in one process or across processes); ``tree`` unchanged when no
  argument spans several devices."""
  mesh = next((a.sharding.mesh for a in jax.tree.leaves(args)
               if isinstance(a, jax.Array)
               and isinstance(a.sharding, NamedSharding)
               and len(a.sharding.device_set) > 1), None)
  if mesh is None:
    return tree
  sharding = NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(
      lambda leaf: leaf if (not isinstance(leaf, jax.Array) or
                            len(leaf.sharding.device_set) > 1)
      else _put(leaf, sharding), tree)


def _check_divisible(num: int, strategy: ClientStrategy) -> int:
  shards = client_mesh(strategy).shape[strategy.axis_name]
  if num % shards:
    raise ValueError(
        f"{num} clients cannot be split evenly over the {shards} devices of "
        f"the mesh axis {strategy.axis_name!r}; use a multiple of {shards} "
        "clients (global arrays are split evenly)")
  return shards


def shard_clients(tree: Any, strategy: str | ClientStrategy) -> Any:
  """Global arrays of ``tree``'s ``[C, ...]`` leaves, split on the client axis.

  ``tree`` holds ALL clients and is the same in every process (e.g. built
  from one seed); each process copies only the rows of its own devices to
  them. For data that each process loaded for its own clients only, use
  ``shard_local_clients``. ``C`` must be a multiple of the mesh axis size.
  """
  strategy = as_strategy(strategy)
  sharding = client_sharding(strategy)

  def put(leaf):
    _check_divisible(np.shape(leaf)[0], strategy)
    return _put(leaf, sharding)

  return jax.tree.map(put, tree)


def local_client_range(num_clients: int, strategy: str | ClientStrategy
                       ) -> tuple[int, int]:
  """``(lo, hi)``: the clients ``lo .. hi - 1`` whose rows this process holds
  in a global ``[num_clients, ...]`` array split by ``client_sharding``.

  With the default mesh (``jax.devices()``, ordered by process) they are a
  contiguous block; raises ``ValueError`` if a custom mesh interleaves them.
  """
  strategy = as_strategy(strategy)
  _check_divisible(num_clients, strategy)
  index_map = client_sharding(strategy).addressable_devices_indices_map(
      (num_clients,))
  starts = sorted({idx[0].indices(num_clients)[:2] for idx in
                   index_map.values()})
  lo, hi = starts[0][0], starts[-1][1]
  if sum(b - a for a, b in starts) != hi - lo:
    raise ValueError("this process's clients are not contiguous in the "
                     "mesh; order the mesh's devices by process")
  return lo, hi


def shard_local_clients(local_tree: Any, strategy: str | ClientStrategy
                        ) -> Any:
  """Global ``[C, ...]`` arrays from each process's own clients.

  ``local_tree`` holds the rows ``local_client_range(C, strategy)`` of this
  process (leaves ``[hi - lo, ...]``); together the processes hold all ``C``
  clients. In a single process this is ``shard_clients``.
  """
  sharding = client_sharding(strategy)
  return jax.tree.map(
      lambda leaf: jax.make_array_from_process_local_data(
          sharding, np.asarray(leaf)), local_tree)
