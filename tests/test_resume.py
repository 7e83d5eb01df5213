"""Checkpoint / resume of runs, TensorBoard events, partial participation.

Runs are tiny (digits, mlp, a few rounds) and share a persistent compilation
cache in the session's temporary directory, so each program compiles once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zlib

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from augfl_jax import algorithms, models, training
from augfl_jax.storage import checkpoint
from augfl_jax.core import client_axis as clients, fields
from augfl_jax.training import checkpoints, loop, rounds
from tests import fake_pm, run_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PM_RUN = {"augfl.lam": 5.0, "pm.model": "mlp"}


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
  fake_pm.save(path, mlp, "mlp", params=params)
  return path


def _config(**changes):
  """A ``RunConfig`` with dotted fields changed."""
  return fields.replace(training.RunConfig(), **changes)


class Crash(Exception):
  pass


def _crash_at(round_, monkeypatch):
  """A log that raises in ``round_`` (every round logs a line)."""
  monkeypatch.setattr(rounds, "LOG_SECONDS", 0.0)
  def log(line):
    if line.startswith(f"round {round_:4d}/"):
      raise Crash(line)
  return log


def _without_seconds(records):
  return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def _leaves(tree):
  """Host arrays of every leaf (PRNG keys as their key data)."""
  return [np.asarray(jax.random.key_data(x)
                     if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                     else x) for x in jax.tree.leaves(tree)]


def _restore(path, step):
  """``(state, meta)`` of checkpoint ``step`` of the run in ``path``, as
  saved (dicts of arrays; no template)."""
  manager = ocp.CheckpointManager(
      os.path.abspath(os.path.join(path, "checkpoints")),
      item_names=("state", "meta"),
      options=ocp.CheckpointManagerOptions(step_prefix="step", create=False,
                                           read_only=True))
  item = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
  manager.close()
  assert item["meta"]["round"] == step
  return item["state"], item["meta"]


def _state(path, step):
  return _restore(path, step)[0]


def _assert_same_state(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert len(la) == len(lb) and la
  for x, y in zip(la, lb):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)  # bit for bit


@pytest.mark.parametrize("algorithm,extra", [
    ("augfl", {"augfl.lam": 0.0}),
    ("fedavg", {}),
    pytest.param("augfl", PM_RUN, marks=pytest.mark.slow),
], ids=["augfl", "fedavg", "augfl_pm"])
def test_crash_then_resume_equals_straight_run(tmp_path, pm_dir, algorithm,
                                                extra, monkeypatch):
  extra = ({**extra, "pm.dir": pm_dir} if extra.get("augfl.lam")
           else extra)
  config = _config(algorithm=algorithm, rounds=6, eval_every=2, **extra)
  quiet = lambda s: None
  training.run(config, str(tmp_path / "straight"), log=quiet,
               checkpoint_every=3)
  # Checkpoint at 3; the run dies in round 5, after round 4's evaluation
  # was written: resuming must drop that record and recompute it.
  with pytest.raises(Crash):
    training.run(config, str(tmp_path / "split"),
                 log=_crash_at(5, monkeypatch), checkpoint_every=3)
  assert [r["round"] for r in run_files.records(tmp_path / "split")] == [2, 4]
  assert run_files.steps(tmp_path / "split") == [3]
  summary = training.run(config, str(tmp_path / "split"), log=quiet,
                         checkpoint_every=3, resume=True)
  assert summary["resumed_from_round"] == 3
  straight = run_files.records(tmp_path / "straight")
  split = run_files.records(tmp_path / "split")
  assert [r["round"] for r in split] == [2, 4, 6]
  assert _without_seconds(split) == _without_seconds(straight)
  _assert_same_state(_state(tmp_path / "straight", 6),
                     _state(tmp_path / "split", 6))
  # The newest two checkpoints are kept.
  assert run_files.steps(tmp_path / "split") == [3, 6]
  # TensorBoard shows every round once: the crashed session's rounds 4-5
  # are dropped at the resumed session's start and written again.
  straight_tb, split_tb = (_events(tmp_path / name / "tb")
                           for name in ("straight", "split"))
  assert sorted(split_tb["train/loss"]) == [1, 2, 3, 4, 5, 6]
  assert sorted(split_tb["eval/accuracy"]) == [2, 4, 6]
  for tag in ("train/loss", "eval/accuracy"):
    for step, value in straight_tb[tag].items():
      assert split_tb[tag][step] == pytest.approx(value, rel=1e-6)
  if extra.get("augfl.lam"):  # the CRD state (heads, optimiser, banks)
    state = _state(tmp_path / "split", 6)
    assert "transfer" in state and int(state["transfer"]["step"]) == 6


def test_larger_rounds_continue_a_finished_run(tmp_path):
  base = _config(algorithm="fedavg", rounds=6, eval_every=2)
  quiet = lambda s: None
  training.run(base, str(tmp_path / "a"), log=quiet, checkpoint_every=3)
  short = _config(algorithm="fedavg", rounds=4, eval_every=2)
  training.run(short, str(tmp_path / "b"), log=quiet, checkpoint_every=3)
  assert run_files.steps(tmp_path / "b") == [3, 4]
  assert json.load(open(tmp_path / "b" / "config.json"))["rounds"] == 4
  training.run(base, str(tmp_path / "b"), log=quiet, checkpoint_every=3,
               resume=True)
  assert run_files.steps(tmp_path / "b") == [4, 6]
  # The same records, but for the test-split scoring that ended the 4-round
  # run, which is kept.
  extended = run_files.records(tmp_path / "b")
  straight = run_files.records(tmp_path / "a")
  assert "test_split" in extended[1] and "test_split" not in straight[1]
  del extended[1]["test_split"]
  assert _without_seconds(extended) == _without_seconds(straight)
  _assert_same_state(_state(tmp_path / "a", 6), _state(tmp_path / "b", 6))
  assert json.load(open(tmp_path / "b" / "config.json"))["rounds"] == 6
  # A finished run resumed with the same rounds has nothing to do.
  lines = []
  summary = training.run(base, str(tmp_path / "b"), log=lines.append,
                         resume=True)
  assert summary["rounds"] == 6 and "larger --rounds" in lines[-1]


def test_resume_refuses_another_config_naming_the_fields(tmp_path):
  config = _config(algorithm="fedavg", rounds=2, **{"augfl.lam": 0.0})
  training.run(config, str(tmp_path), log=lambda s: None,
               checkpoint_every=1)
  other = _config(algorithm="fedavg", rounds=2, seed=1,
                  **{"augfl.lam": 0.0, "fedavg.lr": 0.5})
  with pytest.raises(ValueError) as e:
    training.run(other, str(tmp_path), log=lambda s: None, resume=True)
  message = str(e.value)
  assert "seed: 0 -> 1" in message and "fedavg.lr: " in message
  assert "-> 0.5" in message and "\n" not in message
  assert "rounds" in message  # says what may change
  with pytest.raises(ValueError, match="beyond --rounds=1"):
    training.run(_config(algorithm="fedavg", rounds=1,
                         **{"augfl.lam": 0.0}),
                 str(tmp_path), log=lambda s: None, resume=True)


@pytest.mark.slow
def test_a_run_started_under_vmap_resumes_under_the_defaults(tmp_path):
  """A checkpoint of a run from before the defaults followed the backend
  (strategy "vmap", no conv_impl in its config) resumes without flags;
  config.json then records what runs."""
  quiet = lambda s: None
  training.run(_config(algorithm="fedavg", rounds=2, eval_every=2,
                       strategy="vmap"),
               str(tmp_path), log=quiet, checkpoint_every=2)
  path = os.path.join(tmp_path, "checkpoints", "step_2", "meta", "metadata")
  meta = json.load(open(path))
  del meta["config"]["conv_impl"], meta[checkpoint.SEAL]
  # That version sealed its metadata with a CRC-32 (still checked).
  meta[checkpoint.OLD_SEAL] = zlib.crc32(json.dumps(
      meta, sort_keys=True).encode())
  json.dump(meta, open(path, "w"))
  summary = training.run(_config(algorithm="fedavg", rounds=4, eval_every=2),
                         str(tmp_path), log=quiet, resume=True)
  assert summary["resumed_from_round"] == 2
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["strategy"] == clients.default_strategy().name
  assert saved["conv_impl"] == models.default_conv_impl()


def _events(logdir):
  """``{tag: {step: value}}`` as TensorBoard reads the event files (its
  ``EventAccumulator``, which also drops the events a resumed session
  rewrites); every step of a tag appears once."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(str(logdir))
  accumulator.Reload()
  out = {}
  for tag in accumulator.Tags()["scalars"]:
    events = accumulator.Scalars(tag)
    out[tag] = {e.step: e.value for e in events}
    assert len(out[tag]) == len(events), f"{tag}: a step twice"
  return out


def test_tensorboard_events_match_metrics(tmp_path):
  training.run(_config(algorithm="augfl", rounds=4, eval_every=2,
                       **{"augfl.lam": 0.0}),
               str(tmp_path), log=lambda s: None)
  events = _events(tmp_path / "tb")
  assert sorted(events["train/loss"]) == [1, 2, 3, 4]
  records = run_files.records(tmp_path)
  assert sorted(events["eval/accuracy"]) == [2, 4]
  for r in records:
    assert events["eval/accuracy"][r["round"]] == pytest.approx(r["accuracy"])
    assert events["eval/loss"][r["round"]] == pytest.approx(r["test_loss"])
    low, high = r["accuracy_ci"]
    assert events["eval/accuracy_ci_low"][r["round"]] == pytest.approx(low)
    assert events["eval/accuracy_ci_high"][r["round"]] == pytest.approx(high)
  assert events["eval/test_split_accuracy"] == {
      4: pytest.approx(records[1]["test_split"]["accuracy"])}
  # mean_train_loss of a record is the mean of the rounds' losses since the
  # last.
  assert records[0]["mean_train_loss"] == pytest.approx(
      np.mean([events["train/loss"][1], events["train/loss"][2]]), rel=1e-6)


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_resume_finishes(tmp_path,
                                                       compile_cache):
  env = {**os.environ, "XDG_CACHE_HOME": compile_cache,
         "PYTHONUNBUFFERED": "1"}
  args = ["--augfl.lam=0", "--rounds=200", "--eval_every=50",
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
  steps = run_files.steps(tmp_path)
  assert len(steps) == 1 and 1 <= steps[0] < 200
  step = steps[0]
  state, meta = _restore(tmp_path, step)
  assert meta["round"] == step and meta["config"]["rounds"] == 200
  assert int(state["augfl"]["round"]) == step
  # --resume (in-process: the same code as the CLI's, without its start-up).
  lines = []
  config = _config(rounds=200, eval_every=50, **{"augfl.lam": 0.0})
  training.run(config, str(tmp_path), log=lines.append, checkpoint_every=0,
               resume=True)
  assert f"resuming from round {step}" in " ".join(lines)
  rounds = [r["round"] for r in run_files.records(tmp_path)]
  assert rounds == [50, 100, 150, 200]
  # --checkpoint_every=0: nothing saved but the interrupted round and the
  # end.
  assert run_files.steps(tmp_path) == [step, 200]


# ----------------------------------------------------------------------------
# Partial participation.


def test_sampled_participants_are_reproducible_and_uniform():
  n, k = 32, 8
  draws = [loop.sample_participants(7, r, n, k) for r in range(1, 2001)]
  again = [loop.sample_participants(7, r, n, k) for r in range(1, 2001)]
  assert all(np.array_equal(a, b) for a, b in zip(draws, again))
  for d in draws[:50]:
    assert d.shape == (k,) and np.all(np.diff(d) > 0)
    assert d.min() >= 0 and d.max() < n
  assert len({tuple(d) for d in draws}) > 1900  # rounds differ
  other_seed = loop.sample_participants(8, 1, n, k)
  assert not np.array_equal(other_seed, draws[0]) or not np.array_equal(
      loop.sample_participants(8, 2, n, k), draws[1])
  counts = np.bincount(np.concatenate(draws), minlength=n)
  expected = len(draws) * k / n  # 500; binomial std ~19.4
  assert np.all(np.abs(counts - expected) < 6 * 19.4)
  assert loop.sample_participants(7, 1, n, n) is None
  assert loop.sample_participants(7, 1, n, 0) is None  # 0: all


@pytest.mark.parametrize("algorithm", [
    "augfl", pytest.param("fedavg", marks=pytest.mark.slow)])
def test_all_clients_per_round_is_full_participation(tmp_path, algorithm):
  extra = {"augfl.lam": 0.0} if algorithm == "augfl" else {}
  full = training.run(_config(algorithm=algorithm, rounds=2, eval_every=2,
                              **extra),
                      str(tmp_path / "full"), log=lambda s: None,
                      checkpoint_every=2)
  every = training.run(_config(algorithm=algorithm, rounds=2, eval_every=2,
                               clients_per_round=32, **extra),
                       str(tmp_path / "every"), log=lambda s: None,
                       checkpoint_every=2)
  assert full["final_accuracy"] == every["final_accuracy"]
  _assert_same_state(_state(tmp_path / "full", 2),
                     _state(tmp_path / "every", 2))
  # The explicit participant list of everyone takes the gather/scatter path
  # and must give the same round as participants=None.
  built = training.build(training.prepare(_config(algorithm=algorithm,
                                                  **extra)))
  algo, fed, state = built.algorithm, built.data, built.start()
  a, _ = algo.round(state, fed.train, None)
  b, _ = algo.round(state, fed.train, np.arange(fed.train.num_clients))
  for x, y in zip(_leaves(a), _leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


# Every registered algorithm; FedIT/FedOA/FedPCL adapt or encode with the
# PM (here an mlp) and are as quick as the rest on digits.
PARTIAL = {name: {} for name in algorithms.REGISTRY}
PARTIAL["augfl"] = {"augfl.lam": 0.0}
for _name in ("kt_only", "fedpcl", "fedit", "fedoa"):
  PARTIAL[_name] = dict(PM_RUN)
PARTIAL["fedlp"] = {"pm.model": "mlp"}


@pytest.mark.parametrize("algorithm", sorted(PARTIAL))
def test_partial_participation_touches_only_participants(pm_dir, algorithm):
  """One round with 5 of 32 clients: finite, and every client-stacked state
  row of a non-participant is unchanged."""
  extra = PARTIAL[algorithm]
  if "pm.model" in extra:
    extra = {**extra, "pm.dir": pm_dir}
  built = training.build(training.prepare(_config(
      algorithm=algorithm, clients_per_round=5, **extra)))
  algo, fed, state = built.algorithm, built.data, built.start()
  n = fed.train.num_clients
  ids = built.participants(1)
  assert len(ids) == 5
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
      "fedavg", "fedlp", "fedavgm", "fedadam", "fedyogi", "per_fedavg",
      "fedit", "kt_only"))


# ----------------------------------------------------------------------------
# Numbered checkpoints.


def _tree(value):
  return {"w": np.full(3, value, np.float32), "key": jax.random.key(7)}


def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path):
  root = str(tmp_path / "ckpt")
  manager = checkpoints.RunCheckpoints(root)
  manager.save(3, _tree(3.0), {"round": 3})
  manager.close()
  # A save of step 6 that died half-way: orbax's temporary directory.
  debris = os.path.join(root, "step_6.orbax-checkpoint-tmp-1234567890")
  os.makedirs(os.path.join(debris, "state"))
  manager = checkpoints.RunCheckpoints(root)
  manager.remove_unfinished_saves()  # as training.run does, under its lock
  assert manager.steps() == [3]
  step, tree, meta = manager.restore(_tree(0.0), lambda s: None)
  assert step == 3 and meta["round"] == 3
  np.testing.assert_array_equal(tree["w"], np.full(3, 3.0))
  np.testing.assert_array_equal(jax.random.key_data(tree["key"]),
                                jax.random.key_data(jax.random.key(7)))
  # The next saves complete; the newest two are kept, the debris is gone.
  manager.save(9, _tree(9.0), {"round": 9})
  manager.save(12, _tree(12.0), {"round": 12})
  manager.close()
  assert checkpoints.RunCheckpoints(root).steps() == [9, 12]
  assert sorted(os.listdir(root)) == ["step_12", "step_9"]


def test_a_save_keeps_the_metadata_as_it_was_when_saved(tmp_path):
  """Saves run in the background: a list the caller changes after save()
  returned (the loop's pending training losses) is saved as it was."""
  manager = checkpoints.RunCheckpoints(str(tmp_path / "ckpt"))
  pending = [1.0]
  for step in range(1, 4):
    manager.save(step, _tree(float(step)), {"pending": pending})
    pending.append(2.0)
  manager.wait()
  assert [manager.read_meta(s)["pending"] for s in (2, 3)] == [
      [1.0, 2.0], [1.0, 2.0, 2.0]]
  manager.close()


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(
    tmp_path, damage):
  root = str(tmp_path / "ckpt")
  manager = checkpoints.RunCheckpoints(root)
  manager.save(3, _tree(3.0), {"round": 3})
  manager.save(6, _tree(6.0), {"round": 6})
  manager.close()
  state_dir = os.path.join(root, "step_6", "state")
  if damage == "truncated":  # the arrays' files cut short (a full disk)
    for dirpath, _, names in os.walk(os.path.join(state_dir, "d")):
      for name in names:
        os.truncate(os.path.join(dirpath, name), 0)
  else:  # the recorded checksums do not match the arrays read back
    path = os.path.join(root, "step_6", "meta", "metadata")
    meta = json.load(open(path))
    meta["checksums"] = {k: v ^ 1 for k, v in meta["checksums"].items()}
    json.dump(meta, open(path, "w"))
  lines = []
  step, tree, _ = checkpoints.RunCheckpoints(root).restore(_tree(0.0),
                                                           lines.append)
  assert step == 3
  np.testing.assert_array_equal(tree["w"], np.full(3, 3.0))
  assert len(lines) == 2 and "step_6 is damaged" in lines[0]
  # ... and set aside, so that the resumed run can save round 6 again.
  assert lines[1].startswith(f"kept the damaged checkpoint as {root}/"
                             "step_6.damaged")
  assert sorted(os.listdir(root)) == ["step_3", "step_6.damaged"]
  # Every step damaged: one line naming each, and the way out.
  manager = checkpoints.RunCheckpoints(root)
  manager.save(9, _tree(9.0), {"round": 9})
  manager.close()
  for step in (3, 9):
    path = os.path.join(root, f"step_{step}", "meta", "metadata")
    meta = json.load(open(path))
    meta["checksums"] = {k: v ^ 1 for k, v in meta["checksums"].items()}
    json.dump(meta, open(path, "w"))
  with pytest.raises(checkpoints.CheckpointError) as e:
    checkpoints.RunCheckpoints(root).restore(_tree(0.0), lambda s: None)
  assert "step 9" in str(e.value) and "step 3" in str(e.value)
  assert "--overwrite" in str(e.value) and "\n" not in str(e.value)
