"""Checkpoint / resume of runs, TensorBoard events, partial participation.

Runs are tiny (digits, mlp, a few rounds) and share a persistent compilation
cache in the session's temporary directory, so each program compiles once.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest

from augfl_jax import algorithms, checkpoint, clients, models, pretrain
from experiments import runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PM_RUN = dict(lam=5.0, pm_model="mlp")


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.fixture(scope="module")
def pm_dir(tmp_path_factory):
  """A PM checkpoint as the runs expect it (an mlp on the digits server
  split); its weights are a fresh initialisation: training it would only
  cost time here (pretraining has its own tests)."""
  path = str(tmp_path_factory.mktemp("pm") / "digits_mlp")
  mlp = models.create_model("mlp", 10, norm="group")
  shapes = jax.eval_shape(
      lambda: models.init_params(mlp, jax.random.key(0), (8, 8, 1)))
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda s: rng.normal(0, 0.1, s.shape).astype(s.dtype), shapes)
  pretrain.save_pm(path, params, pretrain.pm_metadata(
      "digits", "mlp", 400, 0, model_kwargs=pretrain.model_kwargs(mlp)))
  return path


class Crash(Exception):
  pass


def _crash_at(round_):
  def log(line):
    if line.startswith(f"round {round_:4d}/"):
      raise Crash(line)
  return log


def _records(path):
  with open(os.path.join(path, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _without_seconds(records):
  return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def _leaves(tree):
  """Host arrays of every leaf (PRNG keys as their key data)."""
  return [np.asarray(jax.random.key_data(x)
                     if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                     else x) for x in jax.tree.leaves(tree)]


def _state(path, step):
  tree, meta = checkpoint.restore(
      checkpoint.step_path(os.path.join(path, "checkpoints"), step))
  assert meta["round"] == step
  return tree["state"]


def _assert_same_state(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert len(la) == len(lb) and la
  for x, y in zip(la, lb):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)  # bit for bit


@pytest.mark.parametrize("algorithm,extra", [
    ("augfl", {"lam": 0.0}),
    ("fedavg", {}),
    ("augfl", PM_RUN),
], ids=["augfl", "fedavg", "augfl_pm"])
def test_crash_then_resume_equals_straight_run(tmp_path, pm_dir, algorithm,
                                                extra):
  extra = {**extra, "pm_dir": pm_dir} if extra.get("lam") else extra
  config = runner.RunConfig(algorithm=algorithm, rounds=6, eval_every=2,
                            **extra)
  quiet = lambda s: None
  runner.run(config, str(tmp_path / "straight"), log=quiet,
             checkpoint_every=3)
  # Checkpoint at 3; the run dies in round 5, after round 4's evaluation
  # was written: resuming must drop that record and recompute it.
  with pytest.raises(Crash):
    runner.run(config, str(tmp_path / "split"), log=_crash_at(5),
               checkpoint_every=3)
  assert [r["round"] for r in _records(tmp_path / "split")] == [2, 4]
  assert checkpoint.all_steps(tmp_path / "split" / "checkpoints") == [3]
  summary = runner.run(config, str(tmp_path / "split"), log=quiet,
                       checkpoint_every=3, resume=True)
  assert summary["resumed_from_round"] == 3
  straight = _records(tmp_path / "straight")
  split = _records(tmp_path / "split")
  assert [r["round"] for r in split] == [2, 4, 6]
  assert _without_seconds(split) == _without_seconds(straight)
  _assert_same_state(_state(tmp_path / "straight", 6),
                     _state(tmp_path / "split", 6))
  # Only the newest checkpoint is kept.
  assert checkpoint.all_steps(tmp_path / "split" / "checkpoints") == [6]
  if extra.get("lam"):  # the CRD state (heads, optimiser, banks) came along
    state = _state(tmp_path / "split", 6)
    assert "transfer" in state and int(state["transfer"]["step"]) == 6


def test_larger_rounds_continue_a_finished_run(tmp_path):
  base = runner.RunConfig(algorithm="fedavg", rounds=6, eval_every=2)
  quiet = lambda s: None
  runner.run(base, str(tmp_path / "a"), log=quiet, checkpoint_every=3)
  short = runner.RunConfig(algorithm="fedavg", rounds=4, eval_every=2)
  runner.run(short, str(tmp_path / "b"), log=quiet, checkpoint_every=3)
  assert checkpoint.all_steps(tmp_path / "b" / "checkpoints") == [4]
  runner.run(base, str(tmp_path / "b"), log=quiet, checkpoint_every=3,
             resume=True)
  assert _without_seconds(_records(tmp_path / "b")) == _without_seconds(
      _records(tmp_path / "a"))
  _assert_same_state(_state(tmp_path / "a", 6), _state(tmp_path / "b", 6))
  assert json.load(open(tmp_path / "b" / "config.json"))["rounds"] == 6
  # A finished run resumed with the same rounds has nothing to do.
  lines = []
  summary = runner.run(base, str(tmp_path / "b"), log=lines.append,
                       resume=True)
  assert summary["rounds"] == 6 and "larger --rounds" in lines[-1]


def test_resume_refuses_another_config_naming_the_fields(tmp_path):
  config = runner.RunConfig(algorithm="fedavg", rounds=2, lam=0.0)
  runner.run(config, str(tmp_path), log=lambda s: None, checkpoint_every=1)
  other = runner.RunConfig(algorithm="fedavg", rounds=2, lam=0.0, seed=1,
                           lr=0.5)
  with pytest.raises(ValueError) as e:
    runner.run(other, str(tmp_path), log=lambda s: None, resume=True)
  message = str(e.value)
  assert "seed: 0 -> 1" in message and "lr: " in message and "-> 0.5" in message
  assert "rounds" in message  # says what may change
  with pytest.raises(ValueError, match="beyond --rounds=1"):
    runner.run(runner.RunConfig(algorithm="fedavg", rounds=1, lam=0.0),
               str(tmp_path), log=lambda s: None, resume=True)


def test_a_run_started_under_vmap_resumes_under_the_defaults(tmp_path):
  """A checkpoint of a run from before the defaults followed the backend
  (strategy "vmap", no conv_impl in its config) resumes without flags;
  config.json then records what runs."""
  quiet = lambda s: None
  runner.run(runner.RunConfig(algorithm="fedavg", rounds=2, eval_every=2,
                              strategy="vmap"),
             str(tmp_path), log=quiet, checkpoint_every=2)
  path = os.path.join(checkpoint.step_path(tmp_path / "checkpoints", 2),
                      "metadata", "metadata")
  meta = json.load(open(path))
  del meta["config"]["conv_impl"]
  json.dump(meta, open(path, "w"))
  summary = runner.run(runner.RunConfig(algorithm="fedavg", rounds=4,
                                        eval_every=2),
                       str(tmp_path), log=quiet, resume=True)
  assert summary["resumed_from_round"] == 2
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["strategy"] == clients.default_strategy().name
  assert saved["conv_impl"] == models.default_conv_impl()


def _events(logdir):
  """``{tag: {step: value}}`` from the TFRecord event files (read by hand:
  u64 length, u32 crc, Event proto, u32 crc)."""
  # Imported here, after a run has imported tensorboardX without torch.
  from tensorboardX.proto import event_pb2  # noqa: E402
  out = {}
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for value in event.summary.value:
        out.setdefault(value.tag, {})[event.step] = value.simple_value
  return out


def test_tensorboard_events_match_metrics(tmp_path):
  runner.run(runner.RunConfig(algorithm="augfl", lam=0.0, rounds=4,
                              eval_every=2), str(tmp_path), log=lambda s: None)
  events = _events(tmp_path / "tb")
  assert sorted(events["train/loss"]) == [1, 2, 3, 4]
  records = _records(tmp_path)
  assert sorted(events["eval/accuracy"]) == [2, 4]
  for r in records:
    assert events["eval/accuracy"][r["round"]] == pytest.approx(r["accuracy"])
    assert events["eval/loss"][r["round"]] == pytest.approx(r["test_loss"])
  # train_loss of a record is the mean of the rounds' losses since the last.
  assert records[0]["train_loss"] == pytest.approx(
      np.mean([events["train/loss"][1], events["train/loss"][2]]), rel=1e-6)


def test_sigint_saves_a_checkpoint_and_resume_finishes(tmp_path,
                                                       compile_cache):
  env = {**os.environ, "XDG_CACHE_HOME": compile_cache,
         "PYTHONUNBUFFERED": "1"}
  args = ["--lam=0", "--rounds=200", "--eval_every=50",
          "--checkpoint_every=0", f"--output_dir={tmp_path}"]
  proc = subprocess.Popen([sys.executable, "-m", "experiments.run", *args],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    for line in proc.stdout:
      if line.startswith("round"):
        break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 128 + signal.SIGINT, err
  assert "Traceback" not in err
  assert "--resume" in err and "SIGINT" in err
  step = checkpoint.latest_step(tmp_path / "checkpoints")
  assert step is not None and 1 <= step < 200
  tree, meta = checkpoint.restore(
      checkpoint.step_path(tmp_path / "checkpoints", step))
  assert meta["round"] == step and meta["config"]["rounds"] == 200
  assert int(tree["state"]["augfl"]["round"]) == step
  # --resume (in-process: the same code as the CLI's, without its start-up).
  lines = []
  config = runner.RunConfig(lam=0.0, rounds=200, eval_every=50)
  runner.run(config, str(tmp_path), log=lines.append, checkpoint_every=0,
             resume=True)
  assert f"resuming from round {step}" in " ".join(lines)
  rounds = [r["round"] for r in _records(tmp_path)]
  assert rounds == [50, 100, 150, 200]
  # --checkpoint_every=0: nothing saved but the interrupted round.
  assert checkpoint.all_steps(tmp_path / "checkpoints") == [step]


# ----------------------------------------------------------------------------
# Partial participation.


def test_sampled_participants_are_reproducible_and_uniform():
  n, k = 32, 8
  draws = [runner.sample_participants(7, r, n, k) for r in range(1, 2001)]
  again = [runner.sample_participants(7, r, n, k) for r in range(1, 2001)]
  assert all(np.array_equal(a, b) for a, b in zip(draws, again))
  for d in draws[:50]:
    assert d.shape == (k,) and np.all(np.diff(d) > 0)
    assert d.min() >= 0 and d.max() < n
  assert len({tuple(d) for d in draws}) > 1900  # rounds differ
  other_seed = runner.sample_participants(8, 1, n, k)
  assert not np.array_equal(other_seed, draws[0]) or not np.array_equal(
      runner.sample_participants(8, 2, n, k), draws[1])
  counts = np.bincount(np.concatenate(draws), minlength=n)
  expected = len(draws) * k / n  # 500; binomial std ~19.4
  assert np.all(np.abs(counts - expected) < 6 * 19.4)
  assert runner.sample_participants(7, 1, n, n) is None
  assert runner.sample_participants(7, 1, n, None) is None


@pytest.mark.parametrize("algorithm", ["augfl", "fedavg"])
def test_all_clients_per_round_is_full_participation(tmp_path, algorithm):
  extra = {"lam": 0.0} if algorithm == "augfl" else {}
  full = runner.run(runner.RunConfig(algorithm=algorithm, rounds=2,
                                     eval_every=2, **extra),
                    str(tmp_path / "full"), log=lambda s: None,
                    checkpoint_every=2)
  every = runner.run(runner.RunConfig(algorithm=algorithm, rounds=2,
                                      eval_every=2, clients_per_round=32,
                                      **extra),
                     str(tmp_path / "every"), log=lambda s: None,
                     checkpoint_every=2)
  assert full["final_accuracy"] == every["final_accuracy"]
  _assert_same_state(_state(tmp_path / "full", 2),
                     _state(tmp_path / "every", 2))
  # The explicit participant list of everyone takes the gather/scatter path
  # and must give the same round as participants=None.
  config = runner.validate(runner.RunConfig(algorithm=algorithm, **extra))
  fed, _ = runner.load_federated(config)
  algo, params = runner.build_algorithm(config, fed, lambda s: None)
  state = jax.device_put(algo.init(params, fed.train.num_clients,
                                   jax.random.key(0)), jax.devices()[0])
  a, _ = algo.round(state, fed.train, None)
  b, _ = algo.round(state, fed.train, np.arange(fed.train.num_clients))
  for x, y in zip(_leaves(a), _leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


# Every registered algorithm; FedIT/FedOA/FedPCL adapt or encode with the
# PM (here an mlp) and are as quick as the rest on digits.
PARTIAL = {name: {} for name in algorithms.ALGORITHMS}
PARTIAL["augfl"] = {"lam": 0.0}
for _name in ("kt_only", "fedpcl", "fedit", "fedoa"):
  PARTIAL[_name] = dict(PM_RUN, lam=5.0)
PARTIAL["fedlp"] = {"pm_model": "mlp"}


@pytest.mark.parametrize("algorithm", sorted(PARTIAL))
def test_partial_participation_touches_only_participants(pm_dir, algorithm):
  """One round with 5 of 32 clients: finite, and every client-stacked state
  row of a non-participant is unchanged."""
  extra = PARTIAL[algorithm]
  if "pm_model" in extra:
    extra = {**extra, "pm_dir": pm_dir}
  config = runner.validate(runner.RunConfig(algorithm=algorithm,
                                            clients_per_round=5, **extra))
  fed, _ = runner.load_federated(config)
  algo, params = runner.build_algorithm(config, fed, lambda s: None)
  n = fed.train.num_clients
  state = jax.device_put(algo.init(params, n, jax.random.key(1)),
                         jax.devices()[0])
  ids = runner.sample_participants(config.seed, 1, n, 5)
  new, metrics = algo.round(state, fed.train, ids)
  assert np.isfinite(float(metrics["loss"]))
  if "client_loss" in metrics:
    assert metrics["client_loss"].shape == (5,)
  others = np.setdiff1d(np.arange(n), ids)
  participants_changed = False
  for before, after in zip(_leaves(state), _leaves(new)):
    assert after.dtype.kind in "iu" or np.all(np.isfinite(after))
    if before.ndim and before.shape[0] == n:  # client-stacked
      np.testing.assert_array_equal(after[others], before[others])
      participants_changed |= not np.array_equal(after[ids], before[ids])
  # Methods that keep per-client state update the participants' rows
  # (KT-only trains no client; FedAvg-like methods keep no client state).
  assert participants_changed == (algorithm not in (
      "fedavg", "fedlp", "per_fedavg", "fedit", "kt_only"))


# ----------------------------------------------------------------------------
# Numbered checkpoints.


def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path,
                                                        monkeypatch):
  root = tmp_path / "ckpt"
  checkpoint.save_step(root, 3, {"w": np.arange(3.0)}, {"round": 3})

  class Dying:
    def save(self, path, args):
      os.makedirs(f"{path}.orbax-checkpoint-tmp-1")  # half written
      raise KeyboardInterrupt

  real = checkpoint._checkpointer  # pylint: disable=protected-access
  monkeypatch.setattr(checkpoint, "_checkpointer", Dying)
  with pytest.raises(KeyboardInterrupt):
    checkpoint.save_step(root, 6, {"w": np.ones(3)}, {"round": 6})
  monkeypatch.setattr(checkpoint, "_checkpointer", real)
  assert checkpoint.latest_step(root) == 3
  tree, meta = checkpoint.restore(checkpoint.step_path(root, 3))
  assert meta == {"round": 3} and np.array_equal(tree["w"], np.arange(3.0))
  # The next save completes, then removes the older one and the debris.
  checkpoint.save_step(root, 9, {"w": np.ones(3)}, {"round": 9})
  assert sorted(os.listdir(root)) == ["step_00000009"]
  checkpoint.save_step(root, 12, {"w": np.ones(3)}, {"round": 12}, keep=2)
  assert checkpoint.all_steps(root) == [9, 12]
