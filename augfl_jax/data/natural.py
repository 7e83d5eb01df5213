"""A partition along a dataset's natural clients (e.g. ``synthetic``): one
client per natural client, and a server split drawn at random from their
examples.
"""

from __future__ import annotations

import numpy as np

from augfl_jax.data.splits import (Partition, _check_labels,
                                   _check_server_size,
                                   _check_support_fraction,
                                   _check_train_fraction, _finish, _rngs)

__all__ = ["natural_partition"]


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
      in ``(0, 1)`` (step 3 of :mod:`augfl_jax.data.partition`).
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
