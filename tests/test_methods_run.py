"""Every registered algorithm reads its section, learns and runs from the
library's entry point on both embedded datasets; the defaults that depend
on the method."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import algorithms, training
from augfl_jax.core import fields
from augfl_jax.training import checkpoints
from augfl_jax.training.config import algorithm_config


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.fixture(scope="module")
def pm_root(tmp_path_factory):
  """PM checkpoints of this module's runs (pretrained once per dataset and
  architecture, 1 epoch)."""
  return tmp_path_factory.mktemp("pm")


# A field of each method's section that moves its rounds: the rounds
# built with it halved must differ from those of the run's section.
ROUND_FIELD = {"augfl": "augfl.alpha", "kt_only": "augfl.lam",
               "fedavg": "fedavg.lr", "fedlp": "fedavg.lr",
               "fedavgm": "fedavgm.server_lr", "fedadam": "fedadam.server_lr",
               "fedyogi": "fedyogi.server_lr",
               "per_fedavg": "per_fedavg.beta", "fedbc": "fedbc.lr",
               "per_fedbc": "fedbc.beta", "fedproto": "fedproto.lr",
               "fedpcl": "fedpcl.lr", "fedcp": "fedcp.lr",
               "fedit": "fedit.lr", "fedoa": "fedoa.lr"}
# FedBC's five local epochs over synthetic's largest clients (thousands of
# examples) take most of this file's time: one epoch shows the same.
QUICKER = {"fedbc": {"fedbc.local_epochs": 1},
           "per_fedbc": {"fedbc.local_epochs": 1}}

def _config(dataset, algorithm, pm_root, **changes):
  """Two rounds with the dataset's defaults (on synthetic, the methods
  with a PM draw a server split of 500 examples and use an mlp PM,
  pretrained once per architecture for 1 epoch)."""
  config = fields.replace(training.RunConfig(
      dataset=dataset, algorithm=algorithm, rounds=2,
      pm=training.PMConfig(epochs=1)), **changes)
  resolved = training.validate(config)
  if training.pm_role(resolved) != "none":
    # FedLP's PM is the client model; the others share the dataset's PM.
    name = resolved.pm.model + ("_client" if algorithm == "fedlp" else "")
    config = fields.replace(config,
                            **{"pm.dir": str(pm_root / f"{dataset}_{name}")})
  return config


def _rounds(config, rounds):
  """The state after ``rounds`` rounds of the algorithm built from
  ``config``'s plan, on the run's data, from the run's initial state."""
  built = training.build(training.prepare(config))
  state, train = built.start(), built.data.train
  for _ in range(rounds):
    state = built.algorithm.round(state, train, None)[0]
  return state


def _floats(state):
  return [np.asarray(x) for x in jax.tree.leaves(state)
          if jnp.issubdtype(x.dtype, jnp.floating)]


@pytest.mark.parametrize("algorithm", tuple(algorithms.REGISTRY))
def test_each_method_reads_its_section_and_learns_on_synthetic(
    tmp_path, pm_root, algorithm):
  """Its section reaches its round (ten rounds of ``training.run`` equal
  ten rounds of the algorithm built from the same plan, and those built
  with a field of its section halved differ) and its training loss falls:
  the mean of rounds 8-10 under the loss of round 1 or 2 (round 1 of a
  prototype method has no prototype term to train against)."""
  name = ROUND_FIELD[algorithm]  # a registered method must have one
  config = _config("synthetic", algorithm, pm_root, rounds=10, eval_every=1,
                   **QUICKER.get(algorithm, {}))
  summary = training.run(config, str(tmp_path), log=lambda s: None,
                         checkpoint_every=0)
  expected = _rounds(config, 10)
  manager = checkpoints.RunCheckpoints(str(tmp_path / "checkpoints"))
  try:
    _, ran, _ = manager.restore(expected, log=lambda s: None)
  finally:
    manager.close()
  for a, b in zip(_floats(ran), _floats(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  halved = fields.replace(config, **{
      name: fields.get(training.validate(config), name) / 2})
  assert any(not np.allclose(a, b) for a, b in zip(
      _floats(ran), _floats(_rounds(halved, 10)))), f"{name} changed nothing"
  losses = [json.loads(line)["mean_train_loss"]
            for line in open(tmp_path / "metrics.jsonl")]
  assert np.mean(losses[7:10]) < max(losses[:2]), losses
  assert "natural client" in summary["test_split"]["off"]
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["data"]["server_size"] == (
      500 if training.pm_role(training.validate(config)) != "none" else 0)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", tuple(algorithms.REGISTRY))
def test_every_algorithm_runs_on_digits(tmp_path, pm_root, algorithm):
  """Two rounds with digits' defaults, scored on its test-split clients."""
  summary = training.run(_config("digits", algorithm, pm_root),
                         str(tmp_path), log=lambda s: None,
                         checkpoint_every=0)
  assert 0.0 <= summary["final_accuracy"] <= 1.0
  assert 0.0 <= summary["test_split"]["accuracy"] <= 1.0
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["data"]["server_size"] == 400


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
