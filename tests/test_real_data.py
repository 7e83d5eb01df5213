"""Real Fashion-MNIST, from the IDX files of Debian's dataset-fashion-mnist.

Skipped where the files are not installed; ``.ci/run`` installs them and sets
``AUGFL_JAX_REQUIRE_REAL_DATA=1``, which turns the skip into a failure.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from augfl_jax import data, training
from augfl_jax.core import fields


def _fashion_mnist_or_skip() -> data.Location:
  try:
    return data.locate("fashion_mnist")
  except data.DatasetUnavailableError as e:
    if os.environ.get("AUGFL_JAX_REQUIRE_REAL_DATA") == "1":
      raise
    pytest.skip(f"real Fashion-MNIST is not installed: {e}")


@pytest.fixture(scope="module")
def fashion_mnist() -> data.Dataset:
  _fashion_mnist_or_skip()
  return data.load_dataset("fashion_mnist")


def test_the_train_split(fashion_mnist):
  assert fashion_mnist.x.shape == (60000, 28, 28, 1)
  assert fashion_mnist.num_classes == 10
  np.testing.assert_array_equal(np.bincount(fashion_mnist.y),
                                np.full(10, 6000))
  np.testing.assert_allclose(fashion_mnist.x.mean(), 0.0, atol=1e-4)
  np.testing.assert_allclose(fashion_mnist.x.std(), 1.0, atol=1e-3)


def test_server_split_histogram_as_a_run_prints_it(fashion_mnist):
  partition = data.make_partition(fashion_mnist, seed=0)
  assert len(partition.server) == 10000
  summary = data.describe(partition, fashion_mnist.y)
  assert ("server class histogram: 0:942 1:1027 2:1016 3:1019 4:974 5:989 "
          "6:1021 7:1022 8:990 9:1000") in summary.splitlines()


def test_test_split_clients_come_from_the_t10k_files(fashion_mnist):
  partition = data.make_partition(fashion_mnist, seed=0)
  clients = data.load_test_split_clients(
      fashion_mnist, partition, data_dir=None, num_clients=50, M=20, seed=0)
  assert "t10k-images-idx3-ubyte" in clients.source
  test = data.load_split("fashion_mnist", data.locate_test_split(
      "fashion_mnist", data.locate("fashion_mnist")), "test",
                         like=fashion_mnist)
  assert test.x.shape == (10000, 28, 28, 1)
  for i in (0, 49):  # their rows are the test split's rows
    n = len(clients.query[i])
    np.testing.assert_array_equal(
        np.asarray(clients.clients.query["x"][i, :n]),
        test.x[clients.query[i]])
    np.testing.assert_array_equal(
        np.asarray(clients.clients.query["y"][i, :n]),
        test.y[clients.query[i]])


@pytest.mark.slow
def test_three_rounds_of_fedavg(tmp_path):
  _fashion_mnist_or_skip()
  lines = []
  summary = training.run(
      training.RunConfig(dataset="fashion_mnist", algorithm="fedavg",
                         rounds=3, eval_every=3),
      str(tmp_path), log=lines.append)
  assert math.isfinite(summary["final_accuracy"])
  assert 0.1 < summary["final_accuracy"] <= 1.0  # above chance
  assert any("IDX files" in line for line in lines)
  # The test-split clients' interval is far narrower than the protocol's
  # 10 held-out clients'.
  split = summary["test_split"]
  assert split["clients"] == 1000 and "t10k" in split["source"]
  width = lambda ci: ci[1] - ci[0]
  assert width(split["accuracy_ci"]) < width(summary["final_accuracy_ci"]) / 3


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavgm", "fedadam", "fedyogi"])
def test_three_rounds_of_each_server_optimizer(tmp_path, algorithm):
  """FedAvgM, FedAdam and FedYogi at their defaults: three rounds on the
  real data (the test-split scoring, FedAvg's test above, left out), the
  held-out accuracy above chance and the training loss falling round by
  round."""
  _fashion_mnist_or_skip()
  config = fields.replace(
      training.RunConfig(dataset="fashion_mnist", algorithm=algorithm,
                         rounds=3, eval_every=1),
      **{"eval.test_split": "off"})
  summary = training.run(config, str(tmp_path), log=lambda s: None,
                         checkpoint_every=0)
  assert 0.1 < summary["final_accuracy"] <= 1.0  # above chance
  losses = [json.loads(line)["mean_train_loss"]
            for line in open(tmp_path / "metrics.jsonl")]
  assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
  assert losses[2] < losses[1] < losses[0], losses
