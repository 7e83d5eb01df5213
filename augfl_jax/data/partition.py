"""Splitting a dataset into a server split and federated clients (§VI-A).

A :class:`Partition` only holds example indices into a dataset; the arrays are
gathered and padded later by :mod:`augfl_jax.data.federated`.

Protocol (pathological, the paper's):

1. The server split is the first ``server_size`` examples; clients never see
   them.
2. Client ``i`` draws its size ``|D_i|`` uniformly from ``{M, ..., 2M}`` and
   ``classes_per_client`` distinct classes at random, and takes its examples
   split as evenly as possible between those classes, without reusing any
   example of another client.
3. Each client's examples are shuffled and split into the support set
   ``D_i^s``, ``ceil(support_fraction |D_i|)`` of them (the paper's 50/50 by
   default: the support set gets the extra example when ``|D_i|`` is odd;
   the reference code uses 20/80 for Fashion-MNIST and EMNIST), and the query
   set ``D_i^q``, each at least one example.
4. Clients are split at random into ``train_fraction`` training clients and
   held-out test clients that are never trained on.

Randomness: ``np.random.SeedSequence(seed)`` is spawned into four independent
streams (per-class example order, client sizes/classes, support/query split,
train/test roles), so the same seed always gives the same partition and e.g. a
different ``train_fraction`` does not reshuffle the clients' examples.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

__all__ = [
    "Partition",
    "describe",
    "dirichlet_partition",
    "natural_partition",
    "pathological_partition",
    "server_split",
]


@dataclasses.dataclass(frozen=True, eq=False)
class Partition:
  """Who holds which example. All index arrays are int64 dataset positions.

  Attributes:
    server: ``[n_srv]`` indices of the server split (the first ``n_srv``).
    support: per client ``i``, ``[S_i]`` indices of ``D_i^s``.
    query: per client ``i``, ``[Q_i]`` indices of ``D_i^q``.
    classes: per client ``i``, the sorted classes it holds.
    train_clients: sorted ids of the clients that train.
    test_clients: sorted ids of the held-out clients, never trained on.
  """

  server: np.ndarray
  support: tuple[np.ndarray, ...]
  query: tuple[np.ndarray, ...]
  classes: tuple[np.ndarray, ...]
  train_clients: np.ndarray
  test_clients: np.ndarray

  @property
  def num_clients(self) -> int:
    """Number of clients (train and test together)."""
    return len(self.support)

  def client_indices(self, client: int) -> np.ndarray:
    """All examples of one client, ``D_i = D_i^s + D_i^q``, as ``[|D_i|]``."""
    return np.concatenate([self.support[client], self.query[client]])

  def sizes(self) -> np.ndarray:
    """``[num_clients]`` int64 client sizes ``|D_i|``."""
    return np.array([len(s) + len(q) for s, q in zip(self.support, self.query)],
                    dtype=np.int64)


def server_split(num_examples: int,
                 server_size: int) -> tuple[np.ndarray, np.ndarray]:
  """The server split is the first ``server_size`` examples (§VI-A).

  Args:
    num_examples: dataset size ``n``.
    server_size: number of server examples, in ``[0, n)``.

  Returns:
    ``(server_idx [server_size], rest_idx [n - server_size])``, int64.
  """
  _check_server_size(server_size, num_examples)
  idx = np.arange(num_examples, dtype=np.int64)
  return idx[:server_size], idx[server_size:]


# ----------------------------------------------------------------------------
# Validation.


def _check_int(name: str, value: object, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}.")
  return int(value)


def _check_server_size(server_size: object, num_examples: int) -> int:
  if (isinstance(server_size, bool)
      or not isinstance(server_size, (int, np.integer))
      or not 0 <= server_size < num_examples):
    raise ValueError(
        f"server_size must be an integer in [0, {num_examples}) for a dataset "
        f"of {num_examples} examples, got {server_size!r}.")
  return int(server_size)


def _check_train_fraction(train_fraction: float) -> float:
  if not 0.0 < float(train_fraction) < 1.0:
    raise ValueError(
        f"train_fraction must be strictly between 0 and 1 (e.g. 0.8), got "
        f"{train_fraction!r}.")
  return float(train_fraction)


def _check_labels(labels: np.ndarray, name: str = "labels") -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0:
    raise ValueError(
        f"{name} must be a non-empty 1-D array [n], got shape {labels.shape}.")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"{name} must be integers, got dtype {labels.dtype}.")
  if labels.min() < 0:
    raise ValueError(f"{name} must be >= 0, got a minimum of {labels.min()}.")
  return labels.astype(np.int64)


def _rngs(seed: int) -> list[np.random.Generator]:
  """Four independent streams: pool order, clients, support/query, roles."""
  seed = _check_int("seed", seed, 0)
  return [np.random.default_rng(s)
          for s in np.random.SeedSequence(seed).spawn(4)]


# ----------------------------------------------------------------------------
# Shared steps.


def _num_test_clients(num_clients: int, train_fraction: float) -> int:
  """round(N * (1 - train_fraction)), half up; >= 1 and <= N - 1 if N >= 2."""
  n_test = int(math.floor(num_clients * (1.0 - train_fraction) + 0.5))
  if num_clients >= 2:
    n_test = min(max(n_test, 1), num_clients - 1)
  else:
    n_test = 0
  return n_test


def num_train_clients(num_clients: int, train_fraction: float = 0.8) -> int:
  """How many of ``num_clients`` clients a partition trains (the rest are
  held out), known before any data is loaded."""
  return num_clients - _num_test_clients(num_clients, train_fraction)


def _check_support_fraction(support_fraction: float) -> float:
  if not 0.0 < float(support_fraction) < 1.0:
    raise ValueError(
        "support_fraction must be strictly between 0 and 1 (the paper's 0.5, "
        f"the reference's 0.2), got {support_fraction!r}.")
  return float(support_fraction)


def _finish(server: np.ndarray, clients: Sequence[np.ndarray],
            classes: Sequence[np.ndarray], train_fraction: float,
            split_rng: np.random.Generator,
            role_rng: np.random.Generator,
            support_fraction: float = 0.5) -> Partition:
  """Splits each client into support/query (``support_fraction``) and the
  clients into train/held out (``train_fraction``)."""
  support, query = [], []
  for idx in clients:
    perm = split_rng.permutation(np.asarray(idx, dtype=np.int64))
    n_support = min(max(math.ceil(support_fraction * len(perm) - 1e-9), 1),
                    len(perm) - 1)
    support.append(perm[:n_support])
    query.append(perm[n_support:])
  num_clients = len(clients)
  n_test = _num_test_clients(num_clients, train_fraction)
  roles = role_rng.permutation(num_clients)
  return Partition(
      server=np.asarray(server, dtype=np.int64),
      support=tuple(support),
      query=tuple(query),
      classes=tuple(np.asarray(c, dtype=np.int64) for c in classes),
      train_clients=np.sort(roles[n_test:]).astype(np.int64),
      test_clients=np.sort(roles[:n_test]).astype(np.int64))


def _setup(labels, num_clients, M, server_size, train_fraction, num_classes):
  """Validates the common arguments; returns labels, num_classes, rest."""
  labels = _check_labels(labels)
  num_clients = _check_int("num_clients", num_clients, 1)
  _check_int("M", M, 1)
  server_size = _check_server_size(server_size, labels.shape[0])
  _check_train_fraction(train_fraction)
  if num_classes is None:
    num_classes = int(labels.max()) + 1
  elif labels.max() >= num_classes:
    raise ValueError(
        f"labels go up to {labels.max()} but num_classes={num_classes}; pass "
        f"num_classes >= {labels.max() + 1}.")
  available = labels.shape[0] - server_size
  if num_clients * M > available:
    raise ValueError(
        f"{num_clients} clients of at least M={M} examples need at least "
        f"{num_clients * M} examples (about {num_clients * 3 * M // 2} on "
        f"average) but only {available} are left outside the server split of "
        f"{server_size}; lower num_clients, M or server_size.")
  return labels, num_classes, np.arange(server_size, labels.shape[0])


def _class_pools(labels: np.ndarray, rest: np.ndarray, num_classes: int,
                 rng: np.random.Generator) -> list[np.ndarray]:
  """Per class, the non-server examples in a random order."""
  rest_labels = labels[rest]
  return [rng.permutation(rest[rest_labels == c]) for c in range(num_classes)]


def _shortage_message(kind: str, client: int, num_clients: int, detail: str,
                      M: int, available: int, server_size: int) -> str:
  return (
      f"{kind} cannot fill client {client} (of {num_clients}): {detail}. "
      f"{num_clients} clients of M..2M={M}..{2 * M} examples need about "
      f"{num_clients * 3 * M // 2} examples vs {available} available outside "
      f"the server split of {server_size}; lower num_clients, M or "
      "server_size.")


# ----------------------------------------------------------------------------
# Partitions.


def pathological_partition(
    labels: np.ndarray,
    *,
    num_clients: int,
    classes_per_client: int = 2,
    M: int = 20,  # pylint: disable=invalid-name
    server_size: int,
    train_fraction: float = 0.8,
    support_fraction: float = 0.5,
    seed: int,
    num_classes: int | None = None,
) -> Partition:
  """The paper's pathological non-IID partition (§VI-A).

  Client ``i`` gets ``|D_i| ~ U{M, ..., 2M}`` examples from exactly
  ``classes_per_client`` distinct random classes, ``|D_i| // k`` per class with
  the remainder spread one each over randomly chosen classes among them.

  Class shortage: a class can only be picked for a client if it still has
  enough unused (non-server, unassigned) examples for that client's per-class
  quota; among those eligible classes the choice is uniform. If fewer than
  ``classes_per_client`` classes are eligible the request cannot be filled and
  a ``ValueError`` says what was needed vs available. Nothing is silently
  resized.

  Args:
    labels: ``[n]`` int labels of the whole dataset.
    num_clients: number of clients ``N`` (>= 1).
    classes_per_client: classes per client ``k``, in ``[1, num_classes]``.
    M: minimum client size; sizes are uniform on ``{M, ..., 2M}``; must be
      ``>= classes_per_client``.
    server_size: size of the server split (the first examples), in
      ``[0, n)``.
    train_fraction: fraction of clients that train, in ``(0, 1)``.
    support_fraction: fraction of a client's examples in its support set,
      in ``(0, 1)`` (step 3 of the module docstring).
    seed: non-negative integer seed.
    num_classes: number of classes (default: ``labels.max() + 1``).

  Returns:
    The :class:`Partition`.

  Raises:
    ValueError: bad arguments, or a request that cannot be filled.
  """
  labels, num_classes, rest = _setup(labels, num_clients, M, server_size,
                                     train_fraction, num_classes)
  k = _check_int("classes_per_client", classes_per_client, 1)
  if k > num_classes:
    raise ValueError(
        f"classes_per_client must be in [1, {num_classes}] (the number of "
        f"classes), got {k}.")
  if M < k:
    raise ValueError(
        f"M={M} is smaller than classes_per_client={k}: a client of M examples"
        f" could not hold {k} classes; use M >= {k}.")
  pool_rng, client_rng, split_rng, role_rng = _rngs(seed)
  pools = _class_pools(labels, rest, num_classes, pool_rng)
  used = np.zeros(num_classes, dtype=np.int64)
  total = np.array([len(p) for p in pools], dtype=np.int64)

  clients, client_classes = [], []
  for i in range(num_clients):
    size = int(client_rng.integers(M, 2 * M + 1))
    base, extra = divmod(size, k)  # `extra` classes take base + 1.
    left = total - used
    big_ok = np.flatnonzero(left >= base + 1)
    small_ok = np.flatnonzero(left >= base)
    if len(big_ok) < extra or len(small_ok) < k:
      if len(small_ok) < k:
        short = f"{k} classes with >= {base} unused examples"
        have = len(small_ok)
      else:
        short = f"{extra} classes with >= {base + 1} unused examples"
        have = len(big_ok)
      detail = (f"its {size} examples from {k} distinct classes need {short}"
                f" but only {have} class(es) have that many left "
                f"({int(left.sum())} unused examples in all)")
      raise ValueError(_shortage_message(
          "pathological_partition", i, num_clients, detail, M, len(rest),
          int(server_size)))
    big = client_rng.choice(big_ok, size=extra, replace=False)
    small = client_rng.choice(np.setdiff1d(small_ok, big), size=k - extra,
                              replace=False)
    chosen = np.concatenate([big, small]).astype(np.int64)
    quota = np.concatenate([np.full(extra, base + 1), np.full(k - extra, base)])
    parts = []
    for c, q in zip(chosen, quota):
      parts.append(pools[c][used[c]:used[c] + q])
      used[c] += q
    clients.append(np.concatenate(parts))
    client_classes.append(np.sort(chosen))
  return _finish(np.arange(server_size), clients, client_classes,
                 train_fraction, split_rng, role_rng,
                 _check_support_fraction(support_fraction))


def dirichlet_partition(
    labels: np.ndarray,
    *,
    num_clients: int,
    concentration: float,
    M: int = 20,  # pylint: disable=invalid-name
    server_size: int,
    train_fraction: float = 0.8,
    support_fraction: float = 0.5,
    seed: int,
    num_classes: int | None = None,
) -> Partition:
  """Dirichlet non-IID partition: class mix ``p_i ~ Dir(concentration)``.

  Client ``i`` draws ``|D_i| ~ U{M, ..., 2M}`` and ``p_i ~ Dir(concentration *
  1_K)``, then class counts ``~ Multinomial(|D_i|, p_i)``, examples drawn
  without reuse.

  Class shortage: counts are capped at what each class has left; the shortfall
  is drawn again from ``Multinomial(shortfall, p_i)`` restricted to (and
  renormalised over) the classes that still have examples, or uniformly over
  them if ``p_i`` puts no mass there, until the client is full. So a client
  keeps its size and its class mix as closely as the remaining data allows. A
  ``ValueError`` is raised only if fewer than ``|D_i|`` examples are left.

  Args:
    labels: ``[n]`` int labels of the whole dataset.
    num_clients: number of clients ``N`` (>= 1).
    concentration: Dirichlet concentration (> 0; small = more skewed).
    M: minimum client size; sizes are uniform on ``{M, ..., 2M}``.
    server_size: size of the server split (the first examples), in ``[0, n)``.
    train_fraction: fraction of clients that train, in ``(0, 1)``.
    support_fraction: fraction of a client's examples in its support set,
      in ``(0, 1)`` (step 3 of the module docstring).
    seed: non-negative integer seed.
    num_classes: number of classes (default: ``labels.max() + 1``).

  Returns:
    The :class:`Partition`; ``classes[i]`` lists the classes client ``i``
    actually received.

  Raises:
    ValueError: bad arguments, or a request that cannot be filled.
  """
  labels, num_classes, rest = _setup(labels, num_clients, M, server_size,
                                     train_fraction, num_classes)
  if not (np.isfinite(concentration) and concentration > 0):
    raise ValueError(
        f"concentration must be a positive number (e.g. 0.5), got "
        f"{concentration!r}.")
  pool_rng, client_rng, split_rng, role_rng = _rngs(seed)
  pools = _class_pools(labels, rest, num_classes, pool_rng)
  used = np.zeros(num_classes, dtype=np.int64)
  total = np.array([len(p) for p in pools], dtype=np.int64)

  clients, client_classes = [], []
  for i in range(num_clients):
    size = int(client_rng.integers(M, 2 * M + 1))
    p = client_rng.dirichlet(np.full(num_classes, float(concentration)))
    left = total - used
    if left.sum() < size:
      detail = f"it needs {size} examples but only {int(left.sum())} are unused"
      raise ValueError(_shortage_message(
          "dirichlet_partition", i, num_clients, detail, M, len(rest),
          int(server_size)))
    take = np.zeros(num_classes, dtype=np.int64)
    while (need := size - int(take.sum())) > 0:
      room = left - take
      weights = np.where(room > 0, np.nan_to_num(p), 0.0)
      if weights.sum() <= 0:
        weights = (room > 0).astype(np.float64)
      draw = client_rng.multinomial(need, weights / weights.sum())
      take += np.minimum(draw, room)
    parts = []
    for c in np.flatnonzero(take):
      parts.append(pools[c][used[c]:used[c] + take[c]])
      used[c] += take[c]
    clients.append(np.concatenate(parts))
    client_classes.append(np.flatnonzero(take))
  return _finish(np.arange(server_size), clients, client_classes,
                 train_fraction, split_rng, role_rng,
                 _check_support_fraction(support_fraction))


def natural_partition(
    client_ids: np.ndarray,
    *,
    train_fraction: float = 0.8,
    support_fraction: float = 0.5,
    seed: int,
    labels: np.ndarray | None = None,
    server_size: int = 0,
) -> Partition:
  """One client per natural client (e.g. ``synthetic``).

  Such a dataset has no "first examples" to set aside, so a server split
  (``server_size > 0``, e.g. for a pretrained model) is ``server_size``
  examples drawn uniformly at random from all clients' examples (the pool
  stream of ``seed``); they leave their clients, which keep the rest.

  Args:
    client_ids: ``[n]`` int natural client of each example; the ids must be
      exactly ``0 .. N - 1``, each with at least one example.
    train_fraction: fraction of clients that train, in ``(0, 1)``.
    support_fraction: fraction of a client's examples in its support set,
      in ``(0, 1)`` (step 3 of the module docstring).
    seed: non-negative integer seed (server draw, support/query split and
      roles).
    labels: optional ``[n]`` labels, used only to fill ``classes``; without
      them ``classes`` holds empty arrays.
    server_size: examples drawn for the server split (0: none).

  Returns:
    The :class:`Partition`; ``server`` is sorted.

  Raises:
    ValueError: bad ids or labels, or a server split that would leave a
      client fewer than 2 examples.
  """
  client_ids = _check_labels(client_ids, "client_ids")
  _check_train_fraction(train_fraction)
  server_size = _check_server_size(server_size, client_ids.shape[0])
  if labels is not None:
    labels = _check_labels(labels)
    if labels.shape != client_ids.shape:
      raise ValueError(
          f"labels {labels.shape} and client_ids {client_ids.shape} must have"
          " the same shape [n].")
  counts = np.bincount(client_ids)
  if (counts == 0).any():
    raise ValueError(
        f"client_ids must cover 0..{len(counts) - 1} without gaps; clients "
        f"{np.flatnonzero(counts == 0).tolist()} have no examples.")
  pool_rng, _, split_rng, role_rng = _rngs(seed)
  server = np.sort(pool_rng.choice(client_ids.shape[0], server_size,
                                   replace=False)).astype(np.int64)
  kept = np.ones(client_ids.shape[0], bool)
  kept[server] = False
  left = np.bincount(client_ids[kept], minlength=len(counts))
  if server_size and (left < 2).any():
    raise ValueError(
        f"a server split of {server_size} examples leaves clients "
        f"{np.flatnonzero(left < 2).tolist()} fewer than 2 examples; use a "
        "smaller server_size.")
  order = np.argsort(client_ids, kind="stable")
  order = order[kept[order]]
  clients = np.split(order, np.cumsum(left)[:-1])
  classes = [np.unique(labels[c]) if labels is not None
             else np.zeros(0, np.int64) for c in clients]
  return _finish(server, clients, classes, train_fraction, split_rng,
                 role_rng, _check_support_fraction(support_fraction))


def describe(partition: Partition, labels: np.ndarray) -> str:
  """A human-readable multi-line summary of a partition.

  Args:
    partition: the partition.
    labels: ``[n]`` labels of the dataset it indexes.

  Returns:
    Clients (train/test), client sizes and classes per client (min/mean/max),
    the server size and the server split's class histogram.
  """
  labels = np.asarray(labels)
  sizes = partition.sizes()
  n_classes = np.array([len(c) for c in partition.classes])
  s_len = np.array([len(s) for s in partition.support])
  q_len = np.array([len(q) for q in partition.query])

  def stats(a: np.ndarray, fmt: str = "d") -> str:
    if a.size == 0:
      return "n/a"
    return (f"min {a.min():{fmt}} / mean {a.mean():.1f} / "
            f"max {a.max():{fmt}}")

  server_labels = labels[partition.server]
  hist = np.bincount(server_labels, minlength=int(labels.max()) + 1)
  hist_str = " ".join(f"{c}:{h}" for c, h in enumerate(hist)) if len(
      partition.server) else "(empty)"
  return "\n".join([
      f"clients: {partition.num_clients} ({len(partition.train_clients)} "
      f"train, {len(partition.test_clients)} test)",
      f"client size |D_i|: {stats(sizes)} (total {int(sizes.sum())})",
      f"support |D_i^s|: {stats(s_len)}; query |D_i^q|: {stats(q_len)}",
      f"classes per client: {stats(n_classes)}",
      f"server split: {len(partition.server)} examples",
      f"server class histogram: {hist_str}",
  ])
