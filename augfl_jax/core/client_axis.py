"""How the client axis runs: one per-client function, several execution strategies.

Every algorithm writes its client step for ONE client and lifts it over the
leading client axis with ``map_clients``. The strategies compute the same
numbers (up to float rounding) and differ only in speed and memory:

* ``"vmap"``: ``jax.vmap``; all clients at once, one batched program. Fast on
  accelerators; memory grows with the number of clients. Work whose
  parameters every client shares (AugFL's support gradient at theta^t) is
  not batched over clients by ``vmap``: its forward pass is one large batch.
  On XLA's CPU backend a convolution with per-client weights becomes a
  grouped convolution, which is slow there (the models' ``conv_impl``
  default on CPU, ``"patches"``, avoids it; see ``augfl_jax.models.conv``).
* ``"map"``: ``jax.lax.map``; clients one after another inside the same
  compiled program (no Python loop, no per-client dispatch). Memory of one
  client.
* ``"chunked"``: ``jax.lax.map(..., batch_size=chunk_size)``; ``vmap`` over
  chunks of ``chunk_size`` clients, chunks in sequence. Memory bounded by the
  chunk, not by the number of clients; ``chunk_size_for_budget`` picks the
  largest chunk that fits a memory budget.
* ``"sharded"``: the client axis split over the devices of a
  ``jax.sharding.Mesh`` (``jax.shard_map``; default: a 1-D mesh of all
  devices, axis ``"clients"``); each device runs its clients with the
  ``inner`` strategy (``"vmap"``, ``"map"`` or ``"chunked"``). The outputs stay
  sharded on the client axis, so a server reduction over clients (e.g.
  Eq. (13)'s sums) compiles to per-device partial sums and an XLA all-reduce.
  A client count that the mesh does not divide is padded with copies of the
  last client, whose outputs are dropped.

``default_strategy(backend)`` is the measured choice per backend (see
``benchmarks/RESULTS.md``): ``"map"`` on CPU, ``"vmap"`` elsewhere. It is
what ``strategy=None`` (the default of every ``make_round`` and evaluator)
and the name ``"auto"`` mean; ``as_strategy`` resolves them when a round is
built, so the jitted functions see a concrete strategy.

Several processes (hosts): the same program runs unchanged. Call
``jax.distributed.initialize()`` (coordinator address, process count and id;
on TPU pods and SLURM they are detected) in every process before any other
JAX call; ``jax.devices()`` then lists the devices of all processes, so the
default ``"sharded"`` mesh spans them. Every process runs the same Python
program, on global arrays: ``augfl_jax.core.distributed`` places a round's inputs
(per-client leaves split on the client axis, shared ones replicated), and
``experiments.run --distributed.*`` runs a whole experiment so
(``augfl_jax.processes``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "as_strategy", "AUTO", "chunk_size_for_budget", "CLIENT_AXIS",
    "client_mesh", "client_sharding", "ClientStrategy", "default_strategy",
    "INNER_STRATEGIES", "map_clients", "STRATEGIES"
]

STRATEGIES = ("vmap", "map", "chunked", "sharded")
AUTO = "auto"  # default_strategy() of the backend in use
INNER_STRATEGIES = ("vmap", "map", "chunked")
CLIENT_AXIS = "clients"


@dataclasses.dataclass(frozen=True)
class ClientStrategy:
  """A way to run a per-client function over the client axis.

  Attributes:
    name: one of ``STRATEGIES``.
    chunk_size: clients per chunk for ``"chunked"`` (and for ``"sharded"``
      with ``inner="chunked"``); ignored otherwise.
    inner: for ``"sharded"``, how each device runs its own clients: one of
      ``INNER_STRATEGIES``.
    mesh: for ``"sharded"``, the mesh whose ``axis_name`` axis carries the
      clients; None means a 1-D mesh of all ``jax.devices()``.
    axis_name: the mesh axis of the clients.
  """

  name: str = "vmap"
  chunk_size: int | None = None
  inner: str = "vmap"
  mesh: Mesh | None = None
  axis_name: str = CLIENT_AXIS

  def __post_init__(self):
    if self.name not in STRATEGIES:
      raise ValueError(
          f"unknown client strategy {self.name!r}; choose one of {STRATEGIES}")
    if self.inner not in INNER_STRATEGIES:
      raise ValueError(f"unknown inner strategy {self.inner!r}; choose one "
                       f"of {INNER_STRATEGIES}")
    uses_chunks = self.name == "chunked" or (self.name == "sharded" and
                                             self.inner == "chunked")
    if uses_chunks and (self.chunk_size is None or self.chunk_size < 1):
      raise ValueError(
          "the 'chunked' strategy needs chunk_size >= 1, got "
          f"{self.chunk_size!r}")
    if self.mesh is not None and self.axis_name not in self.mesh.axis_names:
      raise ValueError(f"mesh has no axis {self.axis_name!r}: "
                       f"{self.mesh.axis_names}")


def as_strategy(strategy: str | ClientStrategy | None = None
                ) -> ClientStrategy:
  """Accepts a strategy name, a ``ClientStrategy`` or None.

  None and ``"auto"``: ``default_strategy()`` of ``jax.default_backend()``.
  Strings: ``"vmap"``, ``"map"``, ``"chunked:K"`` (K clients per chunk),
  ``"sharded"`` (vmap on each device) or ``"sharded:INNER"`` /
  ``"sharded:chunked:K"``.
  """
  if isinstance(strategy, ClientStrategy):
    return strategy
  if strategy is None or strategy == AUTO:
    return default_strategy()
  parts = strategy.split(":")
  if parts[0] == "chunked" and len(parts) == 2:
    return ClientStrategy("chunked", chunk_size=int(parts[1]))
  if parts[0] == "sharded" and len(parts) > 1:
    chunk = int(parts[2]) if len(parts) == 3 else None
    return ClientStrategy("sharded", chunk_size=chunk, inner=parts[1])
  if len(parts) != 1:
    raise ValueError(f"cannot parse client strategy {strategy!r}")
  return ClientStrategy(name=strategy)


def default_strategy(backend: str | None = None) -> ClientStrategy:
  """The measured default for ``backend`` (``jax.default_backend()`` if None).

  CPU: ``"map"``: clients in sequence inside one program; with the models'
  ``conv_impl="patches"`` it was the fastest of vmap / map / chunked on a
  2-core CPU (``benchmarks/RESULTS.md``), and its memory is one client's.
  Accelerators: ``"vmap"``.
  """
  backend = backend or jax.default_backend()
  if backend == "cpu":
    return ClientStrategy("map")
  return ClientStrategy("vmap")


def client_mesh(strategy: ClientStrategy) -> Mesh:
  """The mesh a ``"sharded"`` strategy uses (1-D over all devices if unset)."""
  if strategy.mesh is not None:
    return strategy.mesh
  return Mesh(np.array(jax.devices()), (strategy.axis_name,))


def client_sharding(strategy: str | ClientStrategy) -> NamedSharding:
  """``NamedSharding`` that splits a leading client axis over the mesh.

  ``jax.device_put(per_client_tree, client_sharding(s))`` places client
  data where a ``"sharded"`` round will use it (no resharding per round).
  """
  strategy = as_strategy(strategy)
  return NamedSharding(client_mesh(strategy),
                       PartitionSpec(strategy.axis_name))


def _run_local(fn: Callable[[Any], Any], per_client: Any, name: str,
               chunk_size: int | None) -> Any:
  if name == "vmap":
    return jax.vmap(fn)(per_client)
  if name == "map":
    return jax.lax.map(fn, per_client)
  return jax.lax.map(fn, per_client, batch_size=chunk_size)


def _num_clients(per_client: Any) -> int:
  """``C``, the leading axis every leaf of ``per_client`` shares.

  Raises:
    ValueError: no leaves, leaves that disagree on ``C`` (naming them), or
      ``C = 0`` (a round or an evaluation needs at least one client).
  """
  leaves = jax.tree_util.tree_flatten_with_path(per_client)[0]
  if not leaves:
    raise ValueError("per_client has no leaves")
  sizes = {jax.tree_util.keystr(path): (jnp.shape(leaf) or (None,))[0]
           for path, leaf in leaves}
  if len(set(sizes.values())) > 1:
    shown = ", ".join(f"{k}: {v}" for k, v in list(sizes.items())[:6])
    raise ValueError("the clients' arrays disagree on the number of clients "
                     f"(their leading axis: {shown}); stack every "
                     "per-client array over the same clients")
  num = next(iter(sizes.values()))
  if num is None:
    raise ValueError("per_client's arrays have no leading client axis")
  if num == 0:
    raise ValueError("there are no clients (the leading client axis is 0): "
                     "a round or an evaluation needs at least one client")
  return num


def _pad_clients(per_client: Any, size: int) -> Any:
  """Pads the client axis to ``size`` with copies of the last client."""

  def pad(leaf):
    extra = size - leaf.shape[0]
    tail = jnp.broadcast_to(leaf[-1:], (extra,) + leaf.shape[1:])
    return jnp.concatenate([leaf, tail], axis=0)

  return jax.tree.map(pad, per_client)


def _map_sharded(fn: Callable[[Any], Any], per_client: Any,
                 strategy: ClientStrategy) -> Any:
  mesh = client_mesh(strategy)
  shards = mesh.shape[strategy.axis_name]
  num = _num_clients(per_client)
  padded = -(-num // shards) * shards
  if padded != num:
    per_client = _pad_clients(per_client, padded)
  spec = PartitionSpec(strategy.axis_name)
  run = jax.shard_map(
      lambda local: _run_local(fn, local, strategy.inner, strategy.chunk_size),
      mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
  out = run(per_client)
  if padded != num:
    out = jax.tree.map(lambda leaf: leaf[:num], out)
  return out


def map_clients(fn: Callable[[Any], Any], per_client: Any,
                strategy: str | ClientStrategy | None = None) -> Any:
  """Applies ``fn`` to every client's slice of ``per_client``.

  Args:
    fn: a function of ONE client's pytree (leaves without the client axis).
      Anything shared by all clients is closed over, not passed here.
    per_client: a pytree whose leaves all have the leading client axis ``C``.
    strategy: how to run the client axis (see the module docstring); None:
      ``default_strategy()``.

  Returns:
    ``fn``'s outputs stacked over the client axis (leaves ``[C, ...]``).

  Raises:
    ValueError: ``C = 0``, or leaves with different leading axes (shapes
      are known under jit too).
  """
  strategy = as_strategy(strategy)
  _num_clients(per_client)
  if strategy.name == "sharded":
    return _map_sharded(fn, per_client, strategy)
  return _run_local(fn, per_client, strategy.name, strategy.chunk_size)


def chunk_size_for_budget(fn: Callable[[Any], Any], one_client: Any,
                          budget_bytes: float, num_clients: int) -> int:
  """The largest chunk whose compiled working memory fits ``budget_bytes``.

  Compiles ``vmap(fn)`` for 1 and 2 clients (host-side, no execution) and
  reads XLA's ``memory_analysis()``: ``temp(k) ~ base + k * per_client``.
  The stacked inputs and outputs of all ``num_clients`` clients are counted
  too, as they live for the whole round.

  Args:
    fn: the per-client function (as given to ``map_clients``).
    one_client: one client's pytree (leaves without the client axis), arrays
      or ``jax.ShapeDtypeStruct``.
    budget_bytes: memory the round may use.
    num_clients: C.

  Returns:
    A chunk size in ``[1, num_clients]`` (1 if even one client does not fit).
  """

  def analysis(k):
    stacked = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct((k,) + tuple(a.shape), a.dtype),
        one_client)
    return jax.jit(jax.vmap(fn)).lower(stacked).compile().memory_analysis()

  m1, m2 = analysis(1), analysis(2)
  per_client = max(m2.temp_size_in_bytes - m1.temp_size_in_bytes, 1)
  base = max(m1.temp_size_in_bytes - per_client, 0)
  io = num_clients * (m1.argument_size_in_bytes + m1.output_size_in_bytes)
  fit = int((budget_bytes - io - base) // per_client)
  return max(1, min(num_clients, fit))

