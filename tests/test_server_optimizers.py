"""Server optimizers of the averaging methods: FedAvgM, FedAdam and FedYogi
against a hand-written server update, FedAvg left bit for bit as it was,
runs that learn and resume, and table2's --methods."""

import json
import os
import subprocess
import sys

import chex
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from augfl_jax import algorithms, models, training
from augfl_jax.algorithms import averaging, fedavg, fedopt
from augfl_jax.core import client_axis, fields, tree
from experiments import table2
from tests import tiny

# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT = {"lr": 0.1, "batch_size": 4}


def _np(params):
  return {k: np.asarray(v, np.float64) for k, v in params.items()}


def _client_mean(params, state, clients):
  """The participants' sample-weighted mean model of a FedAvg round from
  ``params`` (its clients draw their keys from ``state``'s key and round,
  as the optimizer's round does)."""
  round_fn = fedavg.make_round(tiny.loss_fn, fedavg.FedAvgConfig(**CLIENT),
                               "vmap")
  start = averaging.AveragingState(params=params, key=state.key,
                                   round=state.round)
  return _np(round_fn(start, clients)[0].params)


def _momentum(config):
  """Hsu et al.'s server momentum: ``m <- beta m + Delta``, ``x <- x - eta
  m``."""
  def step(x, delta, s):
    m = config.server_momentum * s.get("m", 0.0) + delta
    return x - config.server_lr * m, {"m": m}
  return step


def _adaptive(config, yogi):
  """Adam's or Yogi's server step, as the module docstring states them
  (optax's bias correction; Yogi's moments start at 1e-6)."""
  b1, b2 = config.beta1, config.beta2
  def step(x, delta, s):
    start = 1e-6 if yogi else 0.0
    t = s.get("t", 0) + 1
    m = b1 * s.get("m", start) + (1 - b1) * delta
    v = s.get("v", start)
    if yogi:
      s["signs"] = s.get("signs", set()) | set(
          np.unique(np.sign(v - delta ** 2)).tolist())
      v = v - (1 - b2) * delta ** 2 * np.sign(v - delta ** 2)
    else:
      v = b2 * v + (1 - b2) * delta ** 2
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return (x - config.server_lr * m_hat / (np.sqrt(v_hat) + config.tau),
            {**s, "t": t, "m": m, "v": v})
  return step


CASES = {
    "fedavgm": (fedopt.FedAvgMConfig(server_lr=0.7, server_momentum=0.9,
                                     **CLIENT), _momentum),
    "fedadam": (fedopt.FedAdamConfig(server_lr=0.05, beta2=0.5, **CLIENT),
                lambda c: _adaptive(c, yogi=False)),
    # beta2 0.5: Yogi's v moves both ways (sign(v - Delta^2) takes both
    # signs in round 2), so both branches of its update are checked.
    "fedyogi": (fedopt.FedYogiConfig(server_lr=0.05, beta2=0.5, **CLIENT),
                lambda c: _adaptive(c, yogi=True)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_rounds_of_the_server_optimizer_against_numpy(name):
  """Each round: the clients' mean from the round's keys (FedAvg's round),
  then the server step written in numpy on Delta = x - mean; the
  algorithm's state after two rounds holds the same model."""
  config, reference = CASES[name]
  clients = tiny.client_data(seed=3, num_clients=4)
  theta = tiny.init(jax.random.key(5))
  opt = fedopt.server_optimizer(config)
  state = averaging.init_state(theta, jax.random.key(7), opt)
  assert isinstance(state, averaging.ServerOptState)
  round_fn = fedavg.make_round(tiny.loss_fn, config, "vmap",
                               server_optimizer=opt)
  step, x, s = reference(config), _np(theta), {}
  for _ in range(2):
    mean = _client_mean(jax.tree.map(jnp.float32, x), state, clients)
    for k in x:
      # One numpy step per leaf; a leaf's moments live under its name.
      x[k], s[k] = step(x[k], x[k] - mean[k], s.get(k, {}))
    state, _ = round_fn(state, clients)
    chex.assert_trees_all_close(_np(state.params), x, rtol=2e-5, atol=1e-6)
  assert int(state.round) == 2
  if name == "fedyogi":
    assert {-1.0, 1.0} <= set().union(*(s[k]["signs"] for k in s))


def test_default_fedavg_is_the_weighted_mean_bit_for_bit():
  """No server optimizer: the new model is the clients' weighted mean
  itself, as the round computed it before there were server optimizers
  (``p - 1.0 * (p - m)`` is not always ``m``); the state is the plain
  ``AveragingState``, as checkpoints of earlier runs hold it."""
  clients = tiny.client_data(seed=1, num_clients=5)
  config = fedavg.FedAvgConfig(**CLIENT)
  strategy = "vmap"

  @jax.jit
  def mean_round(state, clients):
    (new, _), weights, _ = averaging.run_participants(
        lambda c: fedavg.local_update(tiny.loss_fn, config, state.params,
                                      c["data"], c["key"]),
        state, clients, None, client_axis.as_strategy(strategy))
    return state.replace(params=tree.weighted_mean(new, weights),
                         round=state.round + 1)

  state = fedavg.init_state(tiny.init(jax.random.key(2)), jax.random.key(3))
  assert type(state) is averaging.AveragingState  # pylint: disable=unidiomatic-typecheck
  assert [f.name for f in state.__dataclass_fields__.values()] == [
      "params", "key", "round"]
  expected = state
  round_fn = fedavg.make_round(tiny.loss_fn, config, strategy)
  for _ in range(2):
    state, _ = round_fn(state, clients)
    expected = mean_round(expected, clients)
    chex.assert_trees_all_equal(state.params, expected.params)
  # SGD of step 1.0 through optax is the same up to rounding only.
  sgd = optax.sgd(1.0)
  via_sgd = fedavg.make_round(tiny.loss_fn, config, strategy,
                              server_optimizer=sgd)(
      averaging.init_state(tiny.init(jax.random.key(2)), jax.random.key(3),
                           sgd), clients)[0]
  first = mean_round(fedavg.init_state(tiny.init(jax.random.key(2)),
                                       jax.random.key(3)), clients)
  chex.assert_trees_all_close(via_sgd.params, first.params, atol=1e-6)
  assert type(algorithms.build("fedavg", models.MLP(num_classes=3),  # pylint: disable=unidiomatic-typecheck
                               fedavg.FedAvgConfig()).init(
      tiny.init(jax.random.key(0)), 4, jax.random.key(0))) is (
          averaging.AveragingState)


def test_a_library_user_passes_any_optax_transformation():
  """``averaging.constructor`` takes an optax ``GradientTransformation``
  (FedAdagrad here) as well as a function of the config."""
  build = averaging.constructor("fedadagrad", fedavg.make_round,
                                server_optimizer=optax.adagrad(0.1))
  model = models.MLP(num_classes=tiny.K, hidden=(tiny.H,))
  params = models.init_params(model, jax.random.key(0), (tiny.D,))
  clients = tiny.client_data(seed=0, num_clients=3)
  algo = build(model, fedavg.FedAvgConfig(**CLIENT), strategy="vmap")
  state = algo.init(params, 3, jax.random.key(1))
  assert isinstance(state.opt_state[0], optax.ScaleByRssState)
  new, metrics = algo.round(state, clients)
  plain = algorithms.build("fedavg", model, fedavg.FedAvgConfig(**CLIENT),
                           strategy="vmap")
  averaged, _ = plain.round(plain.init(params, 3, jax.random.key(1)), clients)
  assert np.isfinite(float(metrics["loss"]))
  assert not np.allclose(jax.flatten_util.ravel_pytree(new.params)[0],
                         jax.flatten_util.ravel_pytree(averaged.params)[0])


def _records(run_dir):
  return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
          for line in open(run_dir / "metrics.jsonl")]


@pytest.mark.parametrize("algorithm", ["fedavgm", "fedadam", "fedyogi"])
def test_each_runs_on_digits_and_learns(tmp_path, algorithm):
  """Ten rounds of ``training.run`` at the defaults: the held-out clients'
  accuracy and the training loss of the last round beat the first's."""
  config = training.RunConfig(algorithm=algorithm, dataset="digits",
                              rounds=10, eval_every=1)
  summary = training.run(config, str(tmp_path), log=lambda s: None,
                         checkpoint_every=0)
  records = _records(tmp_path)
  assert len(records) == 10
  assert records[-1]["accuracy"] > records[0]["accuracy"] + 0.05, records
  assert records[-1]["mean_train_loss"] < records[0]["mean_train_loss"]
  assert summary["final_accuracy"] == pytest.approx(records[-1]["accuracy"])
  saved = json.load(open(tmp_path / "config.json"))
  assert saved[algorithm] == json.loads(json.dumps(
      fields.to_dict(getattr(training.RunConfig(), algorithm))))


def _saved_state(run_dir, step):
  """The state of checkpoint ``step`` of the run in ``run_dir``, as saved
  (dicts of arrays, PRNG keys as their key data)."""
  manager = ocp.CheckpointManager(
      str(run_dir / "checkpoints"), item_names=("state", "meta"),
      options=ocp.CheckpointManagerOptions(step_prefix="step", create=False,
                                           read_only=True))
  try:
    state = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(),
        meta=ocp.args.JsonRestore()))["state"]
  finally:
    manager.close()
  return jax.tree.map(
      lambda x: np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(
          x.dtype, jax.dtypes.prng_key) else x), state)


def test_a_resumed_fedyogi_run_continues_its_moments(tmp_path):
  """Stopped at round 2 and resumed to 4, a run ends where one of 4
  rounds does, bit for bit: the server optimizer's moments are in its
  checkpoints (resumed from fresh moments, round 3 would differ)."""
  config = lambda rounds: training.RunConfig(
      algorithm="fedyogi", dataset="digits", rounds=rounds, eval_every=1)
  quiet = lambda s: None
  training.run(config(4), str(tmp_path / "whole"), log=quiet,
               checkpoint_every=0)
  training.run(config(2), str(tmp_path / "parts"), log=quiet,
               checkpoint_every=2)
  summary = training.run(config(4), str(tmp_path / "parts"), log=quiet,
                         resume=True)
  assert summary["resumed_from_round"] == 2
  # Round 2 of the 2-round run also scored its test-split clients.
  parts = [{k: v for k, v in r.items() if k != "test_split" or
            r["round"] == 4} for r in _records(tmp_path / "parts")]
  assert parts == _records(tmp_path / "whole")
  whole, parts = (_saved_state(tmp_path / name, 4)
                  for name in ("whole", "parts"))
  assert set(whole) == {"params", "key", "round", "opt_state"}
  chex.assert_trees_all_equal(parts, whole)


def test_table2_takes_them_and_keeps_its_default_columns(tmp_path,
                                                        compile_cache):
  """--methods lists each of them, its default stays the paper's columns
  and this library's (those of the committed tables), and a table of
  FedAvg and FedAdam is made."""
  default = ("fedavg", "fedavg_code", "per_fedavg", "fedproto", "fedcp",
             "fedlp", "fedpcl", "augfl_wo_pm", "augfl", "fedbc", "fedoa")
  assert table2.COLUMNS == default
  assert {"fedavgm", "fedadam", "fedyogi"} <= set(table2.methods_known())
  result = subprocess.run(
      [sys.executable, "-m", "experiments.table2", "--help"], cwd=ROOT,
      capture_output=True, text=True, timeout=300,
      env={**os.environ, "XDG_CACHE_HOME": compile_cache})
  assert result.returncode == 0, result.stderr
  methods = " ".join(result.stdout.split("--methods: ")[1].split(
      "\n  --")[0].split())
  assert "fedavgm, fedadam, fedyogi" in methods
  assert methods.endswith(f"(default: {','.join(default)})"), methods
  text = table2.run_table(
      training.RunConfig(rounds=1), ["digits"], ["fedavg", "fedadam"], [0],
      str(tmp_path / "runs"), results_dir=str(tmp_path / "results"),
      log=lambda s: None)
  assert "| FedAvg | " in text and "| FedAdam | " in text
  assert "* FedAdam: fedadam: " in text and "server_lr=" in text
