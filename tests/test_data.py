"""Tests of augfl_jax.data: sources, partitions, padding. Nothing downloads."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from augfl_jax import data as D

# ----------------------------------------------------------------------------
# Fixtures and helpers.


@pytest.fixture(scope="module")
def digits() -> D.Dataset:
  return D.load_dataset("digits")


@pytest.fixture(scope="module")
def synthetic() -> D.Dataset:
  return D.load_dataset("synthetic", seed=0)


def _assert_partition_invariants(p: D.Partition, labels: np.ndarray, *,
                                 num_clients: int, server_size: int,
                                 M: int | None, k: int | None) -> None:
  n = len(labels)
  assert p.num_clients == num_clients
  np.testing.assert_array_equal(p.server, np.arange(server_size))
  seen = np.zeros(n, dtype=np.int64)
  seen[p.server] += 1
  for i in range(num_clients):
    s, q = p.support[i], p.query[i]
    size = len(s) + len(q)
    # support/query disjoint and 50/50 (support gets the odd one).
    assert not set(s.tolist()) & set(q.tolist())
    assert len(s) == (size + 1) // 2 and len(q) == size // 2
    idx = p.client_indices(i)
    np.testing.assert_array_equal(np.unique(labels[idx]), p.classes[i])
    if M is not None:
      assert M <= size <= 2 * M
    if k is not None:
      assert len(p.classes[i]) == k
      counts = np.bincount(labels[idx])[p.classes[i]]
      assert counts.max() - counts.min() <= 1  # as even as possible
    seen[idx] += 1
  # No example in two clients, none shared with the server.
  assert seen.max() <= 1
  assert (seen[np.arange(server_size, n)] <= 1).all()
  # train/test: disjoint, cover everything, 80/20.
  train, test = set(p.train_clients.tolist()), set(p.test_clients.tolist())
  assert not train & test
  assert train | test == set(range(num_clients))
  assert len(test) == max(1, round(num_clients * 0.2))


def _same_partition(a: D.Partition, b: D.Partition) -> bool:
  fields = [(a.server, b.server), (a.train_clients, b.train_clients),
            (a.test_clients, b.test_clients)]
  fields += list(zip(a.support, b.support)) + list(zip(a.query, b.query))
  fields += list(zip(a.classes, b.classes))
  return (a.num_clients == b.num_clients
          and all(np.array_equal(x, y) for x, y in fields))


# ----------------------------------------------------------------------------
# Sources.


def test_available_and_unknown():
  names = D.available_datasets()
  for name in ("emnist/letters", "fashion_mnist", "mnist", "kmnist",
               "cifar10", "cifar100", "digits", "synthetic"):
    assert name in names and D.spec(name).name == name
  assert D.canonical_name("emnist") == "emnist/letters"
  assert D.DATASETS["emnist/letters"].num_classes == 26
  with pytest.raises(ValueError, match="digits"):
    D.load_dataset("imagenet")
  with pytest.raises(ValueError, match="emnist/letters, the paper's EMNIST"):
    D.load_federated("imagenet")


@pytest.mark.parametrize("name", sorted(D.DATASETS))
def test_each_dataset_states_every_fact_a_run_needs(name):
  """A registered dataset without them fails here (or cannot be built):
  its example shape, its preset's client model, where it comes from."""
  spec = D.DATASETS[name]
  assert spec.example_shape and all(n >= 1 for n in spec.example_shape)
  assert spec.preset["model"]
  assert spec.embedded or spec.idx_files or spec.tfds_name
  assert spec.natural_clients == (spec.natural_server_size is not None)
  if spec.embedded:  # made here: the shape it states is the shape it has
    dataset = D.load_dataset(name, seed=0)
    assert dataset.x.shape[1:] == spec.example_shape
    assert dataset.num_classes == spec.num_classes
    assert (dataset.client_ids is not None) == spec.natural_clients
  with pytest.raises(TypeError):
    D.DatasetSpec(name="x", num_classes=2, num_clients=4, server_size=0,  # pylint: disable=missing-kwoa
                  load=spec.load)
  with pytest.raises(ValueError, match="must name the client model"):
    D.DatasetSpec(name="x", num_classes=2, num_clients=4, server_size=0,
                  example_shape=(3,), preset={}, load=spec.load)


def test_register_dataset_adds_one_and_refuses_a_taken_name():
  digits = D.DATASETS["digits"]
  assert D.register_dataset(digits) is digits  # the same spec: no change
  with pytest.raises(ValueError, match="registered already"):
    D.register_dataset(D.DatasetSpec(
        name="digits", num_classes=10, num_clients=4, server_size=0,
        example_shape=(8, 8, 1), preset={"model": "mlp"}, load=digits.load))
  with pytest.raises(TypeError):
    D.DATASETS["x"] = digits  # read-only; register_dataset adds


def test_digits(digits):
  assert digits.x.shape == (1797, 8, 8, 1) and digits.x.dtype == np.float32
  assert digits.y.shape == (1797,) and digits.y.dtype == np.int32
  assert digits.num_classes == 10 and digits.client_ids is None
  np.testing.assert_allclose(digits.x.mean(), 0.0, atol=1e-5)
  np.testing.assert_allclose(digits.x.std(), 1.0, atol=1e-4)
  # Fixed shuffle: the seed does not change the dataset, and the first 400
  # examples (the default server split) hold every class.
  other = D.load_dataset("digits", seed=123)
  np.testing.assert_array_equal(digits.y, other.y)
  np.testing.assert_array_equal(digits.x, other.x)
  assert np.bincount(digits.y[:400], minlength=10).min() >= 20


def test_synthetic(synthetic):
  d = synthetic
  assert d.x.shape[1:] == (60,) and d.x.dtype == np.float32
  assert d.y.dtype == np.int32 and d.y.shape == d.x.shape[:1]
  assert d.y.min() >= 0 and d.y.max() <= 9 and d.num_classes == 10
  sizes = np.bincount(d.client_ids)
  assert len(sizes) == 30 and sizes.min() >= 50
  again = D.load_dataset("synthetic", seed=0)
  np.testing.assert_array_equal(d.x, again.x)
  np.testing.assert_array_equal(d.y, again.y)
  other = D.load_dataset("synthetic", seed=1)
  assert d.x.shape != other.x.shape or not np.array_equal(d.x, other.x)
  small = D.load_dataset("synthetic", num_clients=5, seed=2)
  assert len(np.bincount(small.client_ids)) == 5
  flat = D.synthetic_dataset(num_clients=5, seed=2, alpha=0.0, beta=0.0)
  assert len(np.bincount(flat.client_ids)) == 5


def fake_tfds_copy(root, tfds_name: str) -> str:
  """The files :func:`D.locate` takes for a tfds prepared copy (their
  contents come from ``tfds.testing.mock_data``); returns ``root``."""
  version = os.path.join(str(root), tfds_name, "1.0.0")
  os.makedirs(version)
  base = tfds_name.split("/")[0]
  for name in ("dataset_info.json", f"{base}-train.tfrecord-00000-of-00001"):
    with open(os.path.join(version, name), "w") as f:
      f.write("{}")
  return str(root)


def test_offline_error_is_fast_and_clear(tmp_path, monkeypatch):
  # "Fast" means no network attempt that could hang: record every connect.
  attempts = []
  monkeypatch.setattr(socket.socket, "connect",
                      lambda self, address: attempts.append(address))
  monkeypatch.delenv(D.catalog.ENV_VAR, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no_user_data"))
  with pytest.raises(D.DatasetUnavailableError) as err:
    D.load_dataset("cifar10", data_dir=str(tmp_path))
  assert not attempts, f"tfds tried the network: {attempts}"
  message = str(err.value)
  assert "cifar10" in message and str(tmp_path) in message
  assert "--data.data_dir" in message and "--data.download" in message
  assert "\n" not in message
  with pytest.raises(D.DatasetUnavailableError, match="--data.data_dir"):
    D.load_federated("mnist", data_dir=str(tmp_path))


def _tfds_with_tensorflow():
  """``tensorflow_datasets``, or a skip saying why: the mock tfds tests read
  their mock records through TensorFlow, which a GPU image may not have
  (``tensorflow-cpu`` is only there to read prepared tfds copies)."""
  for name in ("tensorflow", "tensorflow_datasets"):
    try:
      __import__(name)
    except ImportError as e:
      pytest.skip(f"the mock tfds tests need {name}, which is not importable "
                  f"here ({e}); the embedded and IDX datasets are tested "
                  "without it")
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def test_tfds_mock_mnist_end_to_end(tmp_path):
  tfds = _tfds_with_tensorflow()
  root = fake_tfds_copy(tmp_path, "mnist")
  assert D.locate("mnist", root) == D.Location("tfds", root)
  with tfds.testing.mock_data(num_examples=300):
    ds = D.load_dataset("mnist", data_dir=root)
    fed = D.load_federated("mnist", num_clients=6, M=10, server_size=60,
                           seed=0, data_dir=root)
  assert ds.x.shape == (300, 28, 28, 1) and ds.x.dtype == np.float32
  assert ds.num_classes == 10 and ds.y.min() >= 0 and ds.y.max() <= 9
  assert ds.source == f"tfds prepared copy in {root}"
  np.testing.assert_allclose(ds.x.mean(), 0.0, atol=1e-4)
  np.testing.assert_allclose(ds.x.std(), 1.0, atol=1e-3)
  assert fed.input_shape == (28, 28, 1) and fed.num_classes == 10
  assert fed.server["x"].shape == (60, 28, 28, 1)
  assert fed.train.num_clients + fed.test.num_clients == 6
  assert fed.test.num_clients == 1
  assert fed.train.support["x"].shape[2:] == (28, 28, 1)


def _letters_as_dataset(n: int):
  """Mock `_as_dataset` for emnist/letters with the real 1..26 label range."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def as_dataset(self, split, decoders=None, read_config=None, **kwargs):
    del self, split, decoders, read_config, kwargs
    rng = np.random.default_rng(0)
    return tf.data.Dataset.from_tensor_slices({
        "image": rng.integers(0, 256, (n, 28, 28, 1)).astype(np.uint8),
        "label": (np.arange(n) % 26 + 1).astype(np.int64),
    })
  return as_dataset


def test_tfds_mock_emnist_letters_label_shift(tmp_path):
  tfds = _tfds_with_tensorflow()
  root = fake_tfds_copy(tmp_path, "emnist/letters")
  n = 520
  with tfds.testing.mock_data(as_dataset_fn=_letters_as_dataset(n)):
    ds = D.load_dataset("emnist", data_dir=root)
    fed = D.load_federated("emnist/letters", num_clients=10, M=10,
                           server_size=100, seed=1, data_dir=root)
  assert ds.name == "emnist/letters" and ds.num_classes == 26
  assert ds.x.shape == (n, 28, 28, 1)
  # Raw labels 1..26 in stored order become 0..25.
  np.testing.assert_array_equal(ds.y, np.arange(n) % 26)
  assert fed.num_classes == 26 and fed.server["y"].shape == (100,)
  np.testing.assert_array_equal(np.asarray(fed.server["y"]),
                                np.arange(100) % 26)
  assert fed.train.num_clients == 8 and fed.test.num_clients == 2
  # The mock's default labels (0..36, the 37-way ClassLabel) are rejected.
  with tfds.testing.mock_data(num_examples=200):
    with pytest.raises(D.DataFileError, match="expected 0..25"):
      D.load_dataset("emnist/letters", data_dir=root)


# ----------------------------------------------------------------------------
# Partitions.


def test_pathological_digits_invariants(digits):
  p = D.pathological_partition(digits.y, num_clients=40, M=20,
                               server_size=400, seed=0)
  _assert_partition_invariants(p, digits.y, num_clients=40, server_size=400,
                               M=20, k=2)
  assert len(p.train_clients) == 32 and len(p.test_clients) == 8
  p3 = D.pathological_partition(digits.y, num_clients=20, classes_per_client=3,
                                M=15, server_size=100, seed=5)
  _assert_partition_invariants(p3, digits.y, num_clients=20, server_size=100,
                               M=15, k=3)
  summary = D.describe(p, digits.y)
  assert "32 train, 8 test" in summary and "400 examples" in summary


def test_pathological_synthetic_labels(synthetic):
  p = D.pathological_partition(synthetic.y, num_clients=30, M=20,
                               server_size=500, seed=3)
  _assert_partition_invariants(p, synthetic.y, num_clients=30,
                               server_size=500, M=20, k=2)


def test_partition_seeds(digits):
  kw = dict(num_clients=30, M=20, server_size=400)
  a = D.pathological_partition(digits.y, seed=7, **kw)
  b = D.pathological_partition(digits.y, seed=7, **kw)
  c = D.pathological_partition(digits.y, seed=8, **kw)
  assert _same_partition(a, b)
  assert not _same_partition(a, c)
  da = D.dirichlet_partition(digits.y, concentration=0.5, seed=7, **kw)
  db = D.dirichlet_partition(digits.y, concentration=0.5, seed=7, **kw)
  dc = D.dirichlet_partition(digits.y, concentration=0.5, seed=8, **kw)
  assert _same_partition(da, db) and not _same_partition(da, dc)


def test_dirichlet_invariants(digits):
  for alpha in (0.05, 0.5, 100.0):
    p = D.dirichlet_partition(digits.y, num_clients=40, concentration=alpha,
                              M=20, server_size=400, seed=0)
    _assert_partition_invariants(p, digits.y, num_clients=40, server_size=400,
                                 M=20, k=None)
  # Nearly all examples requested: classes run out, clients keep their size.
  p = D.dirichlet_partition(digits.y, num_clients=45, concentration=0.1,
                            M=20, server_size=400, seed=0)
  _assert_partition_invariants(p, digits.y, num_clients=45, server_size=400,
                               M=20, k=None)


def test_natural_partition(synthetic):
  p = D.natural_partition(synthetic.client_ids, seed=0, labels=synthetic.y)
  sizes = np.bincount(synthetic.client_ids)
  assert p.num_clients == 30 and len(p.server) == 0
  np.testing.assert_array_equal(p.sizes(), sizes)
  for i in range(30):
    idx = p.client_indices(i)
    assert (synthetic.client_ids[idx] == i).all()
  _assert_partition_invariants(p, synthetic.y, num_clients=30, server_size=0,
                               M=None, k=None)
  assert len(p.test_clients) == 6


def test_impossible_requests_raise(digits):
  y = digits.y
  with pytest.raises(ValueError, match=r"need at least 4000 .* 1397 .*lower "
                     r"num_clients, M or server_size"):
    D.pathological_partition(y, num_clients=200, M=20, server_size=400, seed=0)
  # Enough examples in total but the greedy draw runs classes dry.
  with pytest.raises(ValueError, match=r"cannot fill client .*lower "
                     r"num_clients, M or server_size"):
    for seed in range(50):  # fails for most seeds; one failure is enough.
      D.pathological_partition(y, num_clients=46, M=20, server_size=400,
                               seed=seed)
  bad = [
      (dict(num_clients=0), "num_clients must be >= 1"),
      (dict(M=0), "M must be >= 1"),
      (dict(classes_per_client=11), r"classes_per_client must be in \[1, 10\]"),
      (dict(classes_per_client=0), "classes_per_client must be >= 1"),
      (dict(server_size=1797),
       r"server_size must be an integer in \[0, 1797\)"),
      (dict(server_size=-1), "server_size"),
      (dict(train_fraction=1.0), "train_fraction must be strictly between"),
      (dict(M=2, classes_per_client=3), "use M >= 3"),
      (dict(seed=-1), "seed must be >= 0"),
  ]
  for override, pattern in bad:
    kw = dict(num_clients=10, M=10, server_size=100, seed=0)
    kw.update(override)
    with pytest.raises(ValueError, match=pattern):
      D.pathological_partition(y, **kw)
  with pytest.raises(ValueError, match="concentration must be a positive"):
    D.dirichlet_partition(y, num_clients=10, concentration=0.0,
                          server_size=100, seed=0)
  with pytest.raises(ValueError, match="unknown partition"):
    D.load_federated("digits", partition="iid")


def test_server_split():
  srv, rest = D.server_split(10, 3)
  np.testing.assert_array_equal(srv, [0, 1, 2])
  np.testing.assert_array_equal(rest, np.arange(3, 10))
  with pytest.raises(ValueError):
    D.server_split(10, 10)


# ----------------------------------------------------------------------------
# Padding and federated arrays.


def test_pad_stack_masks_and_zero_padding():
  x = np.arange(10 * 2 * 3, dtype=np.float32).reshape(10, 2, 3) + 1.0
  y = np.arange(10, dtype=np.int32) + 1
  lists = [np.array([3, 1]), np.array([], dtype=np.int64), np.array([0, 9, 5])]
  b = {k: np.asarray(v) for k, v in D.pad_stack(x, y, lists).items()}
  assert b["x"].shape == (3, 3, 2, 3) and b["x"].dtype == np.float32
  assert b["y"].shape == (3, 3) and b["y"].dtype == np.int32
  assert b["mask"].dtype == np.float32
  np.testing.assert_array_equal(b["mask"].sum(1), [2, 0, 3])
  np.testing.assert_array_equal(b["y"][0], [4, 2, 0])
  np.testing.assert_array_equal(b["x"][2, 1], x[9])
  pad = b["mask"] == 0
  assert (b["x"][pad] == 0).all() and (b["y"][pad] == 0).all()
  wide = D.pad_stack(x, y, lists, pad_to=5)
  assert wide["x"].shape == (3, 5, 2, 3)
  with pytest.raises(ValueError, match="pad_to"):
    D.pad_stack(x, y, lists, pad_to=2)


def test_build_federated_digits(digits):
  p = D.pathological_partition(digits.y, num_clients=40, M=20,
                               server_size=400, seed=0)
  fed = D.build_federated(digits, p)
  assert fed.input_shape == (8, 8, 1) and fed.num_classes == 10
  assert fed.dataset_name == "digits" and fed.partition is p
  assert fed.train.num_clients == 32 and fed.test.num_clients == 8
  for cd, ids in ((fed.train, p.train_clients), (fed.test, p.test_clients)):
    np.testing.assert_array_equal(np.asarray(cd.num_examples), p.sizes()[ids])
    assert cd.num_examples.dtype == np.float32
    s_mask = np.asarray(cd.support["mask"])
    q_mask = np.asarray(cd.query["mask"])
    np.testing.assert_array_equal(s_mask.sum(1) + q_mask.sum(1),
                                  p.sizes()[ids])
    assert cd.support["x"].shape == cd.query["x"].shape
    # Real rows are the dataset's rows, in partition order.
    first = ids[0]
    n_s = len(p.support[first])
    np.testing.assert_array_equal(np.asarray(cd.support["x"][0, :n_s]),
                                  digits.x[p.support[first]])
    np.testing.assert_array_equal(np.asarray(cd.query["y"][0, :len(
        p.query[first])]), digits.y[p.query[first]])
  assert fed.train.support["x"].shape[1] == fed.test.support["x"].shape[1]
  np.testing.assert_array_equal(np.asarray(fed.server["index"]), np.arange(400))
  np.testing.assert_array_equal(np.asarray(fed.server["y"]), digits.y[:400])
  np.testing.assert_array_equal(np.asarray(fed.server["mask"]), np.ones(400))


def test_load_federated_defaults():
  fed = D.load_federated("digits")
  assert fed.server["x"].shape == (400, 8, 8, 1)
  assert fed.train.num_clients == 32 and fed.test.num_clients == 8
  syn = D.load_federated("synthetic", seed=0)
  assert syn.server["x"].shape == (0, 60) and syn.input_shape == (60,)
  assert syn.train.num_clients == 24 and syn.test.num_clients == 6
  assert (np.asarray(syn.train.num_examples) >= 50).all()
  # A server split of natural clients: drawn from their examples, which
  # leave them; the clients keep the rest.
  syn_srv = D.load_federated("synthetic", seed=0, server_size=500)
  assert syn_srv.server["x"].shape == (500, 60)
  total = lambda f: float(f.train.num_examples.sum() +
                          f.test.num_examples.sum())
  assert total(syn_srv) == total(syn) - 500


def test_natural_partition_with_a_server_split(synthetic):
  p = D.natural_partition(synthetic.client_ids, seed=0, labels=synthetic.y,
                          server_size=500)
  again = D.natural_partition(synthetic.client_ids, seed=0, server_size=500)
  np.testing.assert_array_equal(p.server, again.server)
  assert len(p.server) == 500 and np.all(np.diff(p.server) > 0)
  held = np.concatenate([p.client_indices(i) for i in range(30)])
  assert not set(held) & set(p.server)
  assert len(held) + 500 == synthetic.num_examples
  for i in range(30):
    assert (synthetic.client_ids[p.client_indices(i)] == i).all()
  # The server draws from every client, in proportion to its size.
  drawn = np.bincount(synthetic.client_ids[p.server], minlength=30)
  assert (drawn > 0).sum() > 20
  with pytest.raises(ValueError, match="fewer than 2 examples"):
    D.natural_partition(synthetic.client_ids, seed=0,
                        server_size=synthetic.num_examples - 40)


def test_tensorflow_import_is_lazy():
  code = ("import sys, augfl_jax.data as D; D.load_dataset('digits'); "
          "D.load_dataset('synthetic'); "
          "print('tensorflow' in sys.modules, 'tensorflow_datasets' in "
          "sys.modules)")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", code], cwd=root, check=True,
                       capture_output=True, text=True).stdout.split()
  assert out == ["False", "False"]


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_support_fraction(digits, fraction):
  """The support set holds ceil(fraction |D_i|) examples (at least one, and
  at least one left for the query set); 0.5 is the 50/50 split (the support
  set gets the odd one) and 0.2 the reference's 20/80."""
  p = D.pathological_partition(digits.y, num_clients=40, M=20,
                               server_size=400, support_fraction=fraction,
                               seed=0)
  for s, q in zip(p.support, p.query):
    n = len(s) + len(q)
    assert len(s) == min(max(int(np.ceil(fraction * n - 1e-9)), 1), n - 1)
    assert not set(s.tolist()) & set(q.tolist())
  with pytest.raises(ValueError, match="support_fraction"):
    D.pathological_partition(digits.y, num_clients=40, M=20,
                             server_size=400, support_fraction=1.0, seed=0)
  fed = D.load_federated("digits", support_fraction=fraction)
  counts = np.asarray(fed.train.support["mask"]).sum(1)
  sizes = np.asarray(fed.train.num_examples)
  np.testing.assert_array_equal(counts, np.ceil(fraction * sizes - 1e-9))
