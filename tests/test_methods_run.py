"""Every registered algorithm runs from experiments.run's entry point on
both embedded datasets, and the defaults that depend on the method."""

import dataclasses
import json

import pytest

from augfl_jax import algorithms
from experiments import config as config_lib
from experiments import runner


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.fixture(scope="module")
def pm_root(tmp_path_factory):
  """PM checkpoints of this module's runs (pretrained once per dataset and
  architecture, 1 epoch)."""
  return tmp_path_factory.mktemp("pm")


@pytest.mark.parametrize("dataset", ["digits", "synthetic"])
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS)
def test_every_algorithm_runs_on_the_embedded_datasets(tmp_path, pm_root,
                                                       dataset, algorithm):
  """Two rounds with the dataset's defaults (on synthetic, the methods with
  a PM draw a server split of 500 examples and use an mlp PM)."""
  config = runner.RunConfig(dataset=dataset, algorithm=algorithm, rounds=2,
                            pm_epochs=1)
  resolved = runner.validate(config)
  if resolved.needs_pm:
    # FedLP's PM is the client model; the others share the dataset's PM.
    name = resolved.pm_model + ("_client" if algorithm == "fedlp" else "")
    config = dataclasses.replace(config,
                                 pm_dir=str(pm_root / f"{dataset}_{name}"))
  summary = runner.run(config, str(tmp_path), log=lambda s: None,
                       checkpoint_every=0)
  assert 0.0 <= summary["final_accuracy"] <= 1.0
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["server_size"] == (
      500 if dataset == "synthetic" and resolved.needs_pm else
      {"digits": 400, "synthetic": 0}[dataset])


def test_defaults_that_depend_on_the_method():
  resolve = lambda **kw: runner.validate(runner.RunConfig(**kw))
  # --lam is AugFL's lambda (5 by default); the other methods with a lambda
  # keep their own unless it is given.
  assert resolve(algorithm="augfl").lam == 5.0
  for algorithm, lam in (("fedoa", 0.5), ("fedproto", 1.0), ("fedcp", 5.0)):
    config = resolve(algorithm=algorithm)
    assert config.lam is None
    assert config_lib.algorithm_config(config).lam == lam
    assert config_lib.algorithm_config(
        resolve(algorithm=algorithm, lam=0.25)).lam == 0.25
  # synthetic has no server split; a method with a PM draws one (an mlp PM
  # per seed: the data are generated from the seed).
  assert resolve(dataset="synthetic", algorithm="fedavg").server_size == 0
  fedoa = resolve(dataset="synthetic", algorithm="fedoa", seed=2)
  assert (fedoa.server_size, fedoa.pm_model) == (500, "mlp")
  assert "seed2" in fedoa.pm_dir and fedoa.pm_dir.endswith("_srv500")
  assert resolve(dataset="synthetic", algorithm="augfl",
                 server_size=300).server_size == 300
  with pytest.raises(ValueError, match="fedoa needs a pretrained model"):
    resolve(dataset="synthetic", algorithm="fedoa", server_size=0)
  with pytest.raises(ValueError, match="augfl with --lam=5.0 needs"):
    resolve(dataset="synthetic", algorithm="augfl", server_size=0)
