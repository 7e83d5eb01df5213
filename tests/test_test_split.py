"""Held-out clients drawn from a test split, and their scoring in chunks."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from augfl_jax import data, models, training
from augfl_jax.core import evaluation, fields
from augfl_jax.data import idx, official_test_split as test_split
from augfl_jax.training import experiment
from tests import test_data


def _labels(n_per_class=50, classes=10):
  return np.repeat(np.arange(classes), n_per_class)


@pytest.mark.parametrize("kind", ["pathological", "dirichlet"])
def test_clients_follow_the_protocol(kind):
  labels = _labels()
  pool = np.arange(len(labels))
  support, query = test_split.draw_clients(
      labels, pool, num_clients=300, M=20, classes_per_client=2,
      support_fraction=0.2, seed=3, partition=kind, dirichlet_alpha=0.3,
      num_classes=10)
  assert len(support) == len(query) == 300
  for s, q in zip(support, query):
    client = np.concatenate([s, q])
    assert 20 <= len(client) <= 40
    assert len(np.unique(client)) == len(client)  # no example twice
    assert len(s) == int(np.ceil(0.2 * len(client) - 1e-9))
    counts = np.bincount(labels[client], minlength=10)
    if kind == "pathological":  # two classes, split as evenly as possible
      assert np.count_nonzero(counts) == 2
      assert sorted(counts[counts > 0])[1] - sorted(counts[counts > 0])[0] <= 1
  sizes = [len(s) + len(q) for s, q in zip(support, query)]
  assert min(sizes) == 20 and max(sizes) == 40  # U{M..2M}, 300 draws
  again = test_split.draw_clients(
      labels, pool, num_clients=300, M=20, classes_per_client=2,
      support_fraction=0.2, seed=3, partition=kind, dirichlet_alpha=0.3,
      num_classes=10)
  assert all(np.array_equal(a, b) for a, b in zip(support, again[0]))
  other = test_split.draw_clients(
      labels, pool, num_clients=300, M=20, classes_per_client=2,
      support_fraction=0.2, seed=4, partition=kind, dirichlet_alpha=0.3,
      num_classes=10)
  assert not all(np.array_equal(a, b) for a, b in zip(support, other[0]))


def test_a_pool_too_small_is_unavailable_not_shrunk():
  labels = np.repeat(np.arange(10), 3)  # 3 examples a class
  with pytest.raises(test_split.OfficialTestSplitUnavailable, match="too few"):
    test_split.draw_clients(labels, np.arange(30), num_clients=5, M=20,
                            seed=0, num_classes=10)


def test_digits_clients_are_what_the_partition_left_unused():
  fed = data.load_federated("digits", seed=1, test_clients=200)
  part = fed.partition
  used = set(np.concatenate([part.server, *part.support, *part.query]))
  drawn = set(np.concatenate([*fed.test_split.support,
                              *fed.test_split.query]))
  assert drawn and not drawn & used  # disjoint from every training example
  assert "left unused" in fed.test_split.source
  dataset = data.load_dataset("digits")
  np.testing.assert_array_equal(  # the arrays are those examples
      np.asarray(fed.test_split.clients.query["y"][0][
          :len(fed.test_split.query[0])]),
      dataset.y[fed.test_split.query[0]])


def test_the_same_clients_for_every_method_of_a_seed():
  def test_clients(seed, **changes):
    plan = training.prepare(fields.replace(
        training.RunConfig(seed=seed, **{k: v for k, v in changes.items()
                                         if "." not in k}),
        **{k: v for k, v in changes.items() if "." in k}))
    return experiment.load_federated(plan).test_split.clients

  base = test_clients(0)
  for changes in ({"algorithm": "fedavg"}, {"augfl.lam": 0.0},
                  {"algorithm": "fedproto", "rounds": 3}):
    other = test_clients(0, **changes)
    jax.tree.map(np.testing.assert_array_equal, base, other)
  moved = test_clients(1)
  assert not np.array_equal(base.support["y"], moved.support["y"])


def _idx_dir(path, test_files=True, n=600, test_side=28):
  """A tiny Fashion-MNIST-like IDX directory: ``n`` train and 200 test
  images (``test_side`` x ``test_side``, the train images 28x28), the test
  split a different scale so its standardisation shows."""
  rng = np.random.default_rng(0)
  os.makedirs(path, exist_ok=True)
  splits = [("train", n, 100, 28)] + (
      [("t10k", 200, 200, test_side)] if test_files else [])
  for prefix, count, high, side in splits:
    idx.write_idx(os.path.join(path, f"{prefix}-images-idx3-ubyte.gz"),
                  rng.integers(0, high, (count, side, side)).astype(np.uint8))
    idx.write_idx(os.path.join(path, f"{prefix}-labels-idx1-ubyte.gz"),
                  (np.arange(count) % 10).astype(np.uint8))
  return str(path)


def test_the_test_split_is_read_beside_the_train_files(tmp_path):
  root = _idx_dir(tmp_path / "fm")
  train = data.load_dataset("fashion_mnist", data_dir=root)
  location = data.locate_test_split("fashion_mnist",
                                    data.locate("fashion_mnist", root))
  assert location.files[0].endswith("t10k-images-idx3-ubyte.gz")
  test = data.load_split("fashion_mnist", location, "test", like=train)
  raw = idx.read_idx(location.files[0]).astype(np.float32)[..., None] / 255
  mean, std = train.standardisation
  np.testing.assert_allclose(test.x, (raw - mean) / std, rtol=1e-5,
                             atol=1e-5)  # the train split's statistics
  assert abs(float(test.x.mean())) > 0.5  # not its own


def test_test_images_of_another_shape_are_refused_where_they_are_read(
    tmp_path):
  root = _idx_dir(tmp_path / "fm", test_side=14)
  train = data.load_dataset("fashion_mnist", data_dir=root)
  location = data.locate_test_split("fashion_mnist",
                                    data.locate("fashion_mnist", root))
  with pytest.raises(idx.DataFileError) as e:
    data.load_split("fashion_mnist", location, "test", like=train)
  assert str(e.value) == (
      f"dataset 'fashion_mnist': the test split's examples are 14x14x1 "
      f"(IDX files {root}/t10k-images-idx3-ubyte.gz, "
      f"{root}/t10k-labels-idx1-ubyte.gz) but the train split's are "
      f"28x28x1 (IDX files {root}/train-images-idx3-ubyte.gz, "
      f"{root}/train-labels-idx1-ubyte.gz); put the test files of the same "
      "dataset beside the train files")
  own = data.load_split("fashion_mnist", location, "test")  # no train split
  assert own.x.shape[1:] == (14, 14, 1)


@pytest.mark.parametrize("test_split", ["auto", "on"])
def test_a_run_with_test_images_of_another_shape_stops_before_round_1(
    tmp_path, test_split):
  """14x14 ``t10k-*`` files beside 28x28 train files: the run stops as it
  reads them, before it compiles or trains, under ``auto`` too (the files
  are there but are not this dataset's test split: scoring without them
  would hide it), not after the last round."""
  root = _idx_dir(tmp_path / "fm", test_side=14)
  config = training.RunConfig(
      dataset="fashion_mnist", algorithm="fedavg", rounds=2,
      data=training.DataConfig(data_dir=root, num_clients=10, M=10,
                               server_size=100),
      eval=training.EvalConfig(test_split=test_split))
  lines, out = [], str(tmp_path / "run")
  with pytest.raises(idx.DataFileError, match=r"the test split's examples "
                     r"are 14x14x1 .* but the train split's are 28x28x1"):
    training.run(config, out, log=lines.append)
  assert not any(line.startswith("round") for line in lines), lines
  assert not os.path.exists(os.path.join(out, "metrics.jsonl"))


def test_a_missing_test_split_is_said_once_or_stops_the_run(tmp_path):
  root = _idx_dir(tmp_path / "fm", test_files=False)
  config = training.RunConfig(
      dataset="fashion_mnist", algorithm="fedavg",
      data=training.DataConfig(data_dir=root, num_clients=10, M=10,
                               server_size=100))
  fed = experiment.load_federated(training.prepare(config))
  description = fed.describe()
  assert fed.test_split is None
  off = [line for line in description.splitlines() if "test-split" in line]
  assert off == [f"test-split scoring off: fashion_mnist's test split is "
                 f"not beside its train files: no t10k-images-idx3-ubyte[.gz]"
                 f" and t10k-labels-idx1-ubyte[.gz] in {root}; "
                 "--data.download fetches them"]
  asked = fields.replace(config, **{"eval.test_split": "on"})
  with pytest.raises(ValueError, match=r"^--eval.test_split=on: "
                     "fashion_mnist's test split is not beside"):
    training.validate(asked)  # before anything is loaded
  with pytest.raises(ValueError, match="natural client"):
    training.validate(training.RunConfig(
        dataset="synthetic", algorithm="fedavg",
        eval=training.EvalConfig(test_split="on")))


def test_a_run_without_a_test_split_says_so_in_its_summary(tmp_path):
  lines = []
  summary = training.run(
      training.RunConfig(dataset="synthetic", algorithm="fedavg", rounds=2),
      str(tmp_path), log=lines.append)
  assert summary["test_split"] == {
      "off": "synthetic has no test split: every example belongs to a "
             "natural client"}
  assert sum("test-split scoring off" in line for line in lines) == 1


def test_scoring_in_chunks_equals_one_evaluation():
  fed = data.load_federated("digits", seed=0, test_clients=23)
  model = models.create_model("mlp", fed.num_classes, norm="group")
  params = models.init_params(model, jax.random.key(0), fed.input_shape)
  evaluate = evaluation.make_evaluator(
      models.make_loss_fn(model), models.make_eval_fn(model), alpha=0.03)
  clients = fed.test_split.clients
  whole = jax.device_get(evaluate(params, clients))
  chunked = evaluation.score_in_chunks(evaluate, params, clients,
                                       chunk_size=5)  # 5 chunks of 4 or 5
  np.testing.assert_allclose(chunked["client_accuracy"],
                             whole["client_accuracy"], rtol=1e-6)
  assert chunked["accuracy"] == pytest.approx(float(whole["accuracy"]),
                                              rel=1e-6)
  assert chunked["loss"] == pytest.approx(float(whole["loss"]), rel=1e-5)
  np.testing.assert_array_equal(chunked["client_count"],
                                fed.test_split.query_counts())
  interval = chunked["accuracy_interval"]
  assert interval.low < chunked["accuracy"] < interval.high
  assert interval.n == 23


def test_tfds_copy_has_its_test_split_found(tmp_path):
  root = tmp_path / "tfds"
  version = root / "mnist" / "1.0.0"
  os.makedirs(version)
  for name in ("dataset_info.json", "mnist-train.tfrecord-00000-of-00001"):
    (version / name).write_text("{}")
  location = data.locate("mnist", str(root))
  with pytest.raises(data.OfficialTestSplitUnavailable, match="no prepared test"):
    data.locate_test_split("mnist", location)
  (version / "mnist-test.tfrecord-00000-of-00001").write_text("{}")
  assert data.locate_test_split("mnist", location) == location


def test_tfds_mock_test_split_end_to_end(tmp_path):
  tfds = test_data._tfds_with_tensorflow()
  root = test_data.fake_tfds_copy(tmp_path, "mnist")
  (tmp_path / "mnist" / "1.0.0" /
   "mnist-test.tfrecord-00000-of-00001").write_text("{}")
  with tfds.testing.mock_data(num_examples=300):
    fed = data.load_federated("mnist", num_clients=6, M=10, server_size=60,
                              seed=0, data_dir=root, test_clients=20)
  assert fed.test_split.num_clients == 20
  assert fed.test_split.clients.support["x"].shape[2:] == (28, 28, 1)
  assert f"tfds prepared copy in {root}" in fed.test_split.source
