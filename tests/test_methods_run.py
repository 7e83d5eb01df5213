"""Every registered algorithm runs from experiments.run's entry point on
both embedded datasets, and the defaults that depend on the method."""

import json

import pytest

from augfl_jax import algorithms, training
from augfl_jax.core import fields
from augfl_jax.training.config import algorithm_config


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.fixture(scope="module")
def pm_root(tmp_path_factory):
  """PM checkpoints of this module's runs (pretrained once per dataset and
  architecture, 1 epoch)."""
  return tmp_path_factory.mktemp("pm")


@pytest.mark.parametrize("dataset", [
    pytest.param("digits", marks=pytest.mark.slow), "synthetic"])
@pytest.mark.parametrize("algorithm", tuple(algorithms.REGISTRY))
def test_every_algorithm_runs_on_the_embedded_datasets(tmp_path, pm_root,
                                                       dataset, algorithm):
  """Two rounds with the dataset's defaults (on synthetic, the methods with
  a PM draw a server split of 500 examples and use an mlp PM)."""
  config = training.RunConfig(dataset=dataset, algorithm=algorithm,
                              rounds=2, pm=training.PMConfig(epochs=1))
  resolved = training.validate(config)
  needs_pm = training.pm_role(resolved) != "none"
  if needs_pm:
    # FedLP's PM is the client model; the others share the dataset's PM.
    name = resolved.pm.model + ("_client" if algorithm == "fedlp" else "")
    config = fields.replace(config,
                            **{"pm.dir": str(pm_root / f"{dataset}_{name}")})
  summary = training.run(config, str(tmp_path), log=lambda s: None,
                         checkpoint_every=0)
  assert 0.0 <= summary["final_accuracy"] <= 1.0
  if dataset == "digits":  # scored on its test-split clients too
    assert 0.0 <= summary["test_split"]["accuracy"] <= 1.0
  else:
    assert "natural client" in summary["test_split"]["off"]
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["data"]["server_size"] == (
      500 if dataset == "synthetic" and needs_pm else
      {"digits": 400, "synthetic": 0}[dataset])


def test_defaults_that_depend_on_the_method():
  resolve = lambda **kw: training.validate(
      fields.replace(training.RunConfig(), **kw))
  # augfl.lam is AugFL's lambda (5 by default); the other methods with a
  # lambda have their own section's, which augfl.lam does not touch.
  assert resolve(algorithm="augfl").augfl.lam == 5.0
  for algorithm, lam in (("fedoa", 0.5), ("fedproto", 1.0), ("fedcp", 5.0)):
    config = resolve(algorithm=algorithm)
    assert algorithm_config(config).lam == lam
    assert algorithm_config(resolve(
        algorithm=algorithm, **{"augfl.lam": 0.25})).lam == lam
    assert algorithm_config(resolve(
        algorithm=algorithm, **{f"{algorithm}.lam": 0.25})).lam == 0.25
  # Held-out clients adapt with the method's own alpha where it has one,
  # else with the paper's 0.03; eval.alpha, when given, wins.
  for algorithm, own in (("augfl", "augfl.alpha"), ("kt_only", "augfl.alpha"),
                         ("per_fedavg", "per_fedavg.alpha"),
                         ("per_fedbc", "fedbc.alpha")):
    assert resolve(algorithm=algorithm, **{own: 0.125}).eval.alpha == 0.125
  for algorithm in ("fedavg", "fedbc", "fedproto", "fedit"):
    assert resolve(algorithm=algorithm,
                   **{"augfl.alpha": 0.125}).eval.alpha == 0.03
  assert resolve(**{"augfl.alpha": 0.125,
                    "eval.alpha": 0.5}).eval.alpha == 0.5
  # synthetic has no server split; a method with a PM draws one (an mlp PM
  # per seed: the data are generated from the seed).
  assert resolve(dataset="synthetic",
                 algorithm="fedavg").data.server_size == 0
  fedoa = resolve(dataset="synthetic", algorithm="fedoa", seed=2)
  assert (fedoa.data.server_size, fedoa.pm.model) == (500, "mlp")
  assert "seed2" in fedoa.pm.dir and fedoa.pm.dir.endswith("_srv500")
  assert resolve(dataset="synthetic", algorithm="augfl",
                 **{"data.server_size": 300}).data.server_size == 300
  with pytest.raises(ValueError, match="fedoa needs a pretrained model"):
    resolve(dataset="synthetic", algorithm="fedoa",
            **{"data.server_size": 0})
  with pytest.raises(ValueError, match="augfl needs a pretrained model") as e:
    resolve(dataset="synthetic", algorithm="augfl",
            **{"data.server_size": 0})
  assert "--data.server_size" in str(e.value)
  assert "--augfl.lam=0" in str(e.value)
  # AugFL without its regulariser needs no PM, hence no server split.
  assert training.pm_role(resolve(dataset="synthetic", algorithm="augfl",
                                 **{"augfl.lam": 0.0})) == "none"
