"""What every partition scheme shares: the :class:`Partition` record (example
indices only; :mod:`augfl_jax.data.federated` gathers and pads the arrays),
the server split, the argument checks, the random streams, the
support/query split of each client and the train/held-out roles of the
clients (steps 3 and 4 of :mod:`augfl_jax.data.partition`'s protocol), and
:func:`describe`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

__all__ = ["Partition", "describe", "num_train_clients", "server_split"]


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
# Support/query and train/held-out.


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
