"""The label-based partition schemes (§VI-A): :func:`pathological_partition`
(the paper's) and :func:`dirichlet_partition`. The :class:`Partition` record,
the server split and the support/query and role splits they share are in
:mod:`augfl_jax.data.splits`; natural clients in :mod:`augfl_jax.data.natural`
(all re-exported here and by :mod:`augfl_jax.data`).

Protocol (pathological, the paper's):

1. The server split is the first ``server_size`` examples; clients never see
   them (unless ``server_overlap``: then clients draw from every example,
   the server's included, as the authors' code lets them).
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

import numpy as np

from augfl_jax.data.natural import natural_partition
from augfl_jax.data.splits import (Partition, _check_int, _check_labels,
                                   _check_server_size,
                                   _check_support_fraction,
                                   _check_train_fraction, _finish, _rngs,
                                   describe, num_train_clients, server_split)

__all__ = [
    "Partition",
    "describe",
    "dirichlet_partition",
    "natural_partition",
    "num_train_clients",
    "pathological_partition",
    "server_split",
]


# ----------------------------------------------------------------------------
# Shared steps.


def _setup(labels, num_clients, M, server_size, train_fraction, num_classes,
           server_overlap=False):
  """Validates the common arguments; returns labels, num_classes and the
  examples clients may take (after the server split, or all of them with
  ``server_overlap``)."""
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
  first = 0 if server_overlap else server_size
  available = labels.shape[0] - first
  if num_clients * M > available:
    raise ValueError(
        f"{num_clients} clients of at least M={M} examples need at least "
        f"{num_clients * M} examples (about {num_clients * 3 * M // 2} on "
        f"average) but only {available} are left outside the server split of "
        f"{server_size}; lower num_clients, M or server_size.")
  return labels, num_classes, np.arange(first, labels.shape[0])


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
    server_overlap: bool = False,
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
    server_overlap: clients may take examples of the server split.

  Returns:
    The :class:`Partition`.

  Raises:
    ValueError: bad arguments, or a request that cannot be filled.
  """
  labels, num_classes, rest = _setup(labels, num_clients, M, server_size,
                                     train_fraction, num_classes,
                                     server_overlap)
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
    server_overlap: bool = False,
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
    server_overlap: clients may take examples of the server split.

  Returns:
    The :class:`Partition`; ``classes[i]`` lists the classes client ``i``
    actually received.

  Raises:
    ValueError: bad arguments, or a request that cannot be filled.
  """
  labels, num_classes, rest = _setup(labels, num_clients, M, server_size,
                                     train_fraction, num_classes,
                                     server_overlap)
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
