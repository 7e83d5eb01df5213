"""The AugFL authors' division of an IDX dataset into clients, reproduced
example for example (zerui981105/AugFL: ``src/DataDivider.py``,
``generate_Fmnist``, its ``dist5`` and ``shuffle_data``, then
``src/launch_w_PM.py``'s ``prepare_dataset``).

1. The pool is the train file then the test file, joined, z-scored per
   pixel: ``(x - mean) / (std + 0.001)`` over the raw 0..255 values of all
   joined images, in float32 (:func:`joined_pool`).
2. User ``u`` (``u = 0 .. N-1``) draws classes ``(k u + j) mod K``,
   ``j < k`` (the fixed pairs {2u, 2u+1} mod 10: five distinct tasks), and
   from each, in class order, the next ``a + b`` examples of that class in
   pool order, with ``a = M // k`` and ``b = random.randint(0, a)`` after
   ``random.seed(u)`` (Python's ``random``, re-seeded before each class, so
   both classes get the same ``b``): sizes are ``k (a + b)``, the even
   numbers 20..40 at M = 20.
3. Each user's examples are permuted as ``np.random.seed(1);
   np.random.shuffle(rows)`` does; then the users' example lists are
   permuted among the users by ``random.shuffle`` continuing from the
   state step 2 left (``random.seed(N - 1)`` and one ``randint(0, a)``).
4. User ``u`` (after that permutation) keeps its first
   ``int(support_fraction |D_u|)`` examples as support, the rest as query.
5. ``random.seed(1); random.shuffle(users)``: the first
   ``round(train_fraction N)`` train, the others are held out, whatever the
   run's seed (at N = 50: the same 10 users, 247 query examples).

The server split is the first ``server_size`` pool examples (the train
file's first: the authors' server uses ``data[:10000]`` of it). With
``server_overlap`` the classes' examples are taken from the start of the
pool, so every client example lies inside the server split (and the PM's
training data), as in the authors' code; without it, from the examples
after the server split, so the two stay disjoint (the paper's rule).

Held-out clients from the test file (:func:`draw_clients`) follow the same
protocol: a random user index's classes, ``a + b`` consecutive examples of
each class in pool order from a random start, ``b`` uniform on ``0..a``,
the support fraction truncated. Consecutive examples matter: Fashion-MNIST's
neighbouring images of a class look alike, so a client built of them is
easier than one of random examples of its classes (a model trained under
this division scores 96% on 50 such clients from train positions 30,000+,
80% on random draws of the same classes there).
"""

from __future__ import annotations

import dataclasses
import random

import jax.numpy as jnp
import numpy as np

from augfl_jax.data import catalog, idx
from augfl_jax.data.dataset import Dataset
from augfl_jax.data.federated import (FederatedData, build_federated,
                                     pad_stack)
from augfl_jax.data.splits import (Partition, _check_int, _check_labels,
                                   _check_server_size,
                                   _check_support_fraction,
                                   _check_train_fraction, _num_test_clients)
from augfl_jax.data.official_test_split import OfficialTestClients
from augfl_jax.core.types import ClientData

__all__ = ["authors_partition", "draw_clients", "joined_pool",
           "load_federated", "load_joined_pool", "user_classes"]

EPSILON = 0.001  # added to the per-pixel std (DataDivider.norm)


def joined_pool(images: list[np.ndarray]) -> np.ndarray:
  """``[n, H, W, C]`` float32: the uint8 image arrays joined in order and
  z-scored per pixel, ``(x - mean) / (std + 0.001)`` with float32 numpy
  statistics over the joined images (as ``DataDivider.norm``)."""
  joined = np.concatenate(images)
  flat = joined.reshape(joined.shape[0], -1).astype(np.float32)
  flat = (flat - np.mean(flat, 0)) / (np.std(flat, 0) + EPSILON)
  return flat.reshape(joined.shape)


def load_joined_pool(name: str, data_dir: str | None = None,
                     location: catalog.Location | None = None
                     ) -> tuple[Dataset, int]:
  """A dataset's train and test IDX files as one pool (:func:`joined_pool`).

  Returns:
    ``(dataset, n_train)``: the pool (its first ``n_train`` examples are
    the train file's, in file order) and the train file's size.

  Raises:
    DatasetUnavailableError: no IDX files (a tfds copy is not read here).
    ValueError: no test files beside the train files.
    idx.DataFileError: a truncated or corrupt file.
  """
  spec = catalog.spec(name)
  location = location or catalog.locate(spec.name, data_dir)
  test = (catalog.find_idx(spec, location.path, spec.test_idx_files)
          if location.kind == "idx" and spec.test_idx_files else None)
  if test is None:
    raise ValueError(
        f"the authors' division joins {spec.name}'s train and test IDX "
        f"files, but {location.describe()} has no test files beside it")
  parts = [idx.read_images_and_labels(
      *files, num_classes=spec.num_classes, label_offset=spec.label_offset)
           for files in (location.files, test.files)]
  x = joined_pool([images for images, _ in parts])
  y = np.concatenate([labels for _, labels in parts]).astype(np.int32)
  source = (f"{location.describe()} and {', '.join(test.files)}, joined and "
            "z-scored per pixel (the authors' division)")
  return (Dataset(name=spec.name, x=x, y=y, num_classes=spec.num_classes,
                  source=source), len(parts[0][1]))


def user_classes(user: int, classes_per_client: int, num_classes: int
                 ) -> list[int]:
  """User ``u``'s classes ``(k u + j) mod K``, ``j < k`` (``dist5``)."""
  return [(classes_per_client * user + j) % num_classes
          for j in range(classes_per_client)]


def authors_partition(labels: np.ndarray, *, num_clients: int, M: int = 20,  # pylint: disable=invalid-name
                      classes_per_client: int = 2, server_size: int,
                      support_fraction: float = 0.2,
                      train_fraction: float = 0.8,
                      server_overlap: bool = False,
                      num_classes: int | None = None) -> Partition:
  """The authors' division of ``labels`` (module docstring, steps 2-5).

  Args:
    labels: ``[n]`` int labels of the joined pool.
    num_clients: users N.
    M: ``a = M // classes_per_client`` examples a class at least (the
      authors' 10), ``a + b`` with ``b`` in ``0..a``.
    classes_per_client: classes a user, ``k`` (the authors' 2).
    server_size: the server split, the first ``server_size`` examples.
    support_fraction: a user's first ``int(support_fraction |D_u|)``
      examples are its support set (the authors' 0.2).
    train_fraction: the first ``round(train_fraction N)`` users of the
      shuffled list train.
    server_overlap: take the clients' examples from the start of the pool
      (inside the server split, as the authors' code) instead of after it.
    num_classes: K (default ``labels.max() + 1``).

  Returns:
    The :class:`Partition`; ``classes[u]`` are the classes user ``u`` holds.

  Raises:
    ValueError: bad arguments, or a class with too few examples.
  """
  labels = _check_labels(labels)
  n_users = _check_int("num_clients", num_clients, 2)
  k = _check_int("classes_per_client", classes_per_client, 1)
  server_size = _check_server_size(server_size, labels.shape[0])
  _check_train_fraction(train_fraction)
  _check_support_fraction(support_fraction)
  if num_classes is None:
    num_classes = int(labels.max()) + 1
  a = _check_int("M // classes_per_client", M // k, 1)
  first = 0 if server_overlap else server_size
  pools = [np.flatnonzero(labels[first:] == c) + first
           for c in range(num_classes)]
  used = np.zeros(num_classes, np.int64)
  drawn = []
  rng = random.Random()
  for u in range(n_users):
    parts = []
    for c in user_classes(u, k, num_classes):
      rng.seed(u)
      take = a + rng.randint(0, a)
      if used[c] + take > len(pools[c]):
        raise ValueError(
            f"the authors' division runs out of class {c} at user {u}: it "
            f"needs {used[c] + take} examples, the pool has {len(pools[c])}")
      parts.append(pools[c][used[c]:used[c] + take])
      used[c] += take
    rows = np.concatenate(parts)
    perm = np.arange(len(rows))
    np.random.RandomState(1).shuffle(perm)
    drawn.append((rows[perm], np.unique(labels[rows])))
  rng.shuffle(drawn)
  support, query = [], []
  for rows, _ in drawn:
    n_support = min(max(int(support_fraction * len(rows)), 1), len(rows) - 1)
    support.append(rows[:n_support])
    query.append(rows[n_support:])
  users = list(range(n_users))
  random.Random(1).shuffle(users)
  n_train = n_users - _num_test_clients(n_users, train_fraction)
  return Partition(
      server=np.arange(server_size, dtype=np.int64),
      support=tuple(support), query=tuple(query),
      classes=tuple(classes for _, classes in drawn),
      train_clients=np.sort(users[:n_train]).astype(np.int64),
      test_clients=np.sort(users[n_train:]).astype(np.int64))


def draw_clients(dataset: Dataset, pool: np.ndarray, *, num_clients: int,
                 M: int = 20, classes_per_client: int = 2,  # pylint: disable=invalid-name
                 support_fraction: float = 0.2, seed: int
                 ) -> tuple[ClientData, tuple[np.ndarray, ...],
                            tuple[np.ndarray, ...]]:
  """Held-out clients of the authors' protocol drawn from ``pool``.

  Client ``i`` takes a user index ``u`` uniform on ``0..K-1`` and that
  user's classes (:func:`user_classes`), of each ``a + b`` consecutive
  examples of the class in ``pool`` order from a uniform start (``a = M //
  k``, ``b`` uniform on ``0..a``, the same for its classes), in random
  order, and its first ``int(support_fraction |D_i|)`` examples as
  support. Clients are drawn independently (an example may serve
  several, never twice within one), with the fifth stream of
  ``np.random.SeedSequence(seed)`` as the test split's clients are.

  Args:
    dataset: the pool's dataset.
    pool: ``[m]`` indices the clients may take.
    num_clients, M, classes_per_client, support_fraction: the protocol.
    seed: the run's seed.

  Returns:
    ``(clients, support, query)``: the padded ``ClientData`` and, per
    client, its ``[S_i]`` and ``[Q_i]`` indices into ``dataset``.
  """
  k, num_classes = classes_per_client, dataset.num_classes
  a = M // k
  by_class = [pool[dataset.y[pool] == c] for c in range(num_classes)]
  rng = np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(5)[4])
  support, query = [], []
  for _ in range(num_clients):
    classes = user_classes(int(rng.integers(num_classes)), k, num_classes)
    take = a + int(rng.integers(a + 1))
    starts = [int(rng.integers(len(by_class[c]) - take + 1))
              for c in classes]
    rows = rng.permutation(np.concatenate(
        [by_class[c][i:i + take] for c, i in zip(classes, starts)]))
    n_support = min(max(int(support_fraction * len(rows)), 1), len(rows) - 1)
    support.append(rows[:n_support])
    query.append(rows[n_support:])
  pad_to = max(len(rows) for rows in support + query)
  clients = ClientData(
      support=pad_stack(dataset.x, dataset.y, support, pad_to=pad_to),
      query=pad_stack(dataset.x, dataset.y, query, pad_to=pad_to),
      num_examples=jnp.asarray([len(s) + len(q)
                                for s, q in zip(support, query)],
                               jnp.float32))
  return clients, tuple(support), tuple(query)


def load_federated(name: str, *, location: catalog.Location,
                   num_clients: int,
                   M: int, classes_per_client: int, server_size: int,  # pylint: disable=invalid-name
                   support_fraction: float, train_fraction: float = 0.8,
                   server_overlap: bool, test_clients: int, seed: int
                   ) -> tuple[FederatedData, Dataset]:
  """The joined pool (:func:`load_joined_pool`), the authors' division of it
  (:func:`authors_partition`) and, when ``test_clients > 0``, that many
  held-out clients drawn from its test-file part (:func:`draw_clients`),
  which no client, the server split or the PM holds.

  Returns:
    ``(federated data, the pool)``.

  Raises:
    as :func:`load_joined_pool` and :func:`authors_partition`.
  """
  dataset, n_train = load_joined_pool(name, location=location)
  partition = authors_partition(
      dataset.y, num_clients=num_clients, M=M,
      classes_per_client=classes_per_client, server_size=server_size,
      support_fraction=support_fraction, train_fraction=train_fraction,
      server_overlap=server_overlap, num_classes=dataset.num_classes)
  fed = build_federated(dataset, partition)
  if not test_clients:
    return fed, dataset
  pool = np.arange(n_train, dataset.num_examples)
  clients, support, query = draw_clients(
      dataset, pool, num_clients=test_clients, M=M,
      classes_per_client=classes_per_client,
      support_fraction=support_fraction, seed=seed)
  return dataclasses.replace(fed, test_split=OfficialTestClients(
      clients, support, query,
      f"{test_clients} clients of the authors' protocol drawn from the "
      f"{len(pool)} test-file examples of the joined pool")), dataset
