"""The authors' division (augfl_jax.data.authors) against their code's steps
rewritten here from zerui981105/AugFL (src/DataDivider.py: dist5,
shuffle_data, generate_train_test; src/launch_w_PM.py: prepare_dataset),
with Python's and numpy's global generators as they use them.

The real-data tests skip where Debian's Fashion-MNIST is not installed,
unless AUGFL_JAX_REQUIRE_REAL_DATA=1.
"""

from __future__ import annotations

import gzip
import os
import random

import numpy as np
import pytest

from augfl_jax import data
from augfl_jax.data import authors


@pytest.fixture(autouse=True)
def _keep_global_generators():
  state, np_state = random.getstate(), np.random.get_state()
  yield
  random.setstate(state)
  np.random.set_state(np_state)


def _their_division(labels: np.ndarray, num_users: int = 50, a: int = 10,
                    ratio: float = 0.2, clients_per_round: int = 40):
  """Per user name order (f_00000, ...), ``(support, query)`` positions in
  the pool, and the held-out users: their steps on an index column."""
  positions = np.arange(len(labels))
  data_list = [positions[labels == i] for i in range(10)]
  label_list = [labels[labels == i] for i in range(10)]
  idx = [0] * 10
  dataset, c_pos = {}, 0
  for u in range(num_users):  # dist5(n=2)
    data_u, label_u = [], []
    classes = [i % 10 for i in range(c_pos, c_pos + 2)]
    c_pos += 2
    for class_idx in classes:
      random.seed(u)
      bias = random.randint(0, 10)
      data_u.append(data_list[class_idx][idx[class_idx]:idx[class_idx] + a
                                         + bias])
      label_u.append(label_list[class_idx][idx[class_idx]:idx[class_idx] + a
                                           + bias])
      idx[class_idx] += a + bias
    dataset[u] = {"X": np.concatenate(data_u)[:, None],
                  "y": np.concatenate(label_u)}
  udata_new = []  # shuffle_data
  for d in dataset.values():
    combined = np.concatenate((d["X"], d["y"].reshape((-1, 1))), axis=1)
    np.random.seed(1)
    np.random.shuffle(combined)
    udata_new.append({"X": combined[:, 0], "y": combined[:, 1]})
  np.random.seed(1)
  random.shuffle(udata_new)
  dataset = dict(zip(dataset.keys(), udata_new))
  users = {}
  for i in range(num_users):  # generate_train_test
    x = dataset[i]["X"].tolist()
    train_len = int(ratio * len(x))
    users[f"f_{i:05d}"] = (x[:train_len], x[train_len:])
  names = sorted(users)  # read_data, prepare_dataset
  random.seed(1)
  random.shuffle(names)
  return users, names[clients_per_round:]


def _check_same(partition: data.Partition, users, held_out,
                offset: int = 0) -> None:
  for u in range(50):
    support, query = users[f"f_{u:05d}"]
    np.testing.assert_array_equal(partition.support[u], np.add(support,
                                                               offset))
    np.testing.assert_array_equal(partition.query[u], np.add(query, offset))
  assert [f"f_{u:05d}" for u in partition.test_clients] == sorted(held_out)


def test_the_division_on_synthetic_labels():
  labels = np.random.default_rng(0).integers(0, 10, 5000)
  partition = authors.authors_partition(labels, num_clients=50,
                                        server_size=1000,
                                        server_overlap=True)
  _check_same(partition, *_their_division(labels))
  sizes = partition.sizes()
  assert set(sizes % 2) == {0} and sizes.min() >= 20 and sizes.max() <= 40
  for u in range(50):
    assert len(partition.support[u]) == int(0.2 * sizes[u])
    assert set(labels[partition.client_indices(u)]) == set(
        partition.classes[u])
    assert tuple(partition.classes[u]) in {(0, 1), (2, 3), (4, 5), (6, 7),
                                           (8, 9)}


def test_disjoint_from_the_server_split_unless_asked():
  labels = np.random.default_rng(1).integers(0, 10, 6000)
  kept_apart = authors.authors_partition(labels, num_clients=50,
                                         server_size=3000)
  used = np.concatenate([kept_apart.client_indices(u) for u in range(50)])
  assert used.min() >= 3000 and len(np.unique(used)) == len(used)
  overlapping = authors.authors_partition(labels, num_clients=50,
                                          server_size=3000,
                                          server_overlap=True)
  used = np.concatenate([overlapping.client_indices(u) for u in range(50)])
  assert used.max() < 3000
  # Their division of the examples after the server split.
  _check_same(kept_apart, *_their_division(labels[3000:]), offset=3000)


def _real_idx(name: str, directory: str) -> np.ndarray:
  with gzip.open(os.path.join(directory, name + ".gz")) as f:
    raw = f.read()
  offset = 16 if "images" in name else 8
  return np.frombuffer(raw, np.uint8, offset=offset)


@pytest.fixture(scope="module")
def real_pool():
  try:
    location = data.locate("fashion_mnist")
  except data.DatasetUnavailableError as e:
    if os.environ.get("AUGFL_JAX_REQUIRE_REAL_DATA") == "1":
      raise
    pytest.skip(f"real Fashion-MNIST is not installed: {e}")
  return authors.load_joined_pool("fashion_mnist"), location.path


def test_the_division_of_real_fashion_mnist(real_pool):
  (pool, n_train), directory = real_pool
  labels = np.concatenate([
      _real_idx("train-labels-idx1-ubyte", directory),
      _real_idx("t10k-labels-idx1-ubyte", directory)]).astype(np.int64)
  assert n_train == 60000
  np.testing.assert_array_equal(pool.y, labels)
  partition = authors.authors_partition(pool.y, num_clients=50,
                                        server_size=10000,
                                        server_overlap=True)
  users, held_out = _their_division(labels)
  _check_same(partition, users, held_out)
  assert sum(len(partition.query[u]) for u in partition.test_clients) == 247
  assert max(partition.client_indices(u).max() for u in range(50)) == 1737


def test_the_pool_is_z_scored_per_pixel(real_pool):
  (pool, _), directory = real_pool
  images = np.concatenate([
      _real_idx("train-images-idx3-ubyte", directory),
      _real_idx("t10k-images-idx3-ubyte", directory)]).reshape(70000, 784)
  pixels = [0, 300, 407, 783]
  column = images[:, pixels].astype(np.float64)
  expected = (column - column.mean(0)) / (column.std(0) + 0.001)
  # float32 statistics (theirs) against float64 ones: 3e-4 apart where a
  # pixel is nearly always 0 and its rare values lie hundreds of std out.
  np.testing.assert_allclose(pool.x.reshape(70000, 784)[:, pixels],
                             expected, rtol=1e-3, atol=1e-4)


def test_test_file_clients_follow_the_protocol(real_pool):
  (pool, n_train), _ = real_pool
  index = np.arange(n_train, pool.num_examples)
  clients, support, query = authors.draw_clients(pool, index,
                                                 num_clients=30, seed=0)
  again = authors.draw_clients(pool, index, num_clients=30, seed=0)
  for s, q, s2 in zip(support, query, again[1]):
    np.testing.assert_array_equal(s, s2)
    rows = np.concatenate([s, q])
    for c in np.unique(pool.y[rows]):  # consecutive in the class's order
      order = np.flatnonzero(pool.y[index] == c)
      taken = np.sort(np.searchsorted(index[order], rows[pool.y[rows] == c]))
      assert np.array_equal(taken, np.arange(taken[0], taken[-1] + 1))
    assert rows.min() >= n_train and len(np.unique(rows)) == len(rows)
    assert len(rows) % 2 == 0 and 20 <= len(rows) <= 40
    assert len(s) == int(0.2 * len(rows))
    assert tuple(np.unique(pool.y[rows])) in {(0, 1), (2, 3), (4, 5),
                                              (6, 7), (8, 9)}
  assert clients.query["mask"].shape[0] == 30


def test_server_overlap_in_the_paper_partition():
  labels = np.random.default_rng(2).integers(0, 10, 4000)
  held = lambda p: np.concatenate([p.client_indices(u)
                                   for u in range(p.num_clients)])
  apart = data.pathological_partition(labels, num_clients=50,
                                      server_size=2000, seed=0)
  assert held(apart).min() >= 2000
  inside = data.pathological_partition(labels, num_clients=50,
                                       server_size=2000, seed=0,
                                       server_overlap=True)
  assert held(inside).min() < 2000 and (held(inside) < 2000).mean() > 0.3
  np.testing.assert_array_equal(inside.server, np.arange(2000))
