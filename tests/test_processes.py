"""The main job across processes (``training.processes``): local processes
of ``experiments.run`` with 2 CPU devices each give the numbers of one
process (4 devices, and the default strategy) within float rounding, write
one run directory, resume with the same number of processes (another is
refused in one line) and stop together, in one line, when one is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from augfl_jax import models
from augfl_jax.core import client_axis
from augfl_jax.storage import checkpoint
from augfl_jax.training import outputs, process_group, processes
from experiments import local_processes
from tests import fake_pm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
# A round's numbers across processes differ from one process's by the
# order of the server's sums (an all-reduce): float32 rounding.
RTOL = 2e-5
NO_PM = {"augfl.lam": 0.0}  # the runs that test the mechanics need no PM


@pytest.fixture(scope="module")
def pm_dir(tmp_path_factory):
  """An mlp PM as the digits runs expect one (not trained: fake_pm)."""
  return fake_pm.save(str(tmp_path_factory.mktemp("pm") / "digits_mlp"),
                      models.create_model("mlp", 10, norm="group"), "mlp")


def _flags(out, **changes):
  flags = {"rounds": 2, "eval_every": 1, "nocompilation_cache": None,
           "output_dir": str(out), **changes}
  return [f"--{k}" if v is None else f"--{k}={v}" for k, v in flags.items()]


def _launch(num_processes, devices, args, tmp_path, timeout=400):
  """Runs the processes; ``(exit codes, logs)``."""
  logs = [str(tmp_path / f"process{i}_{time.monotonic_ns()}.log")
          for i in range(num_processes)]
  env = dict(os.environ, PYTHONPATH=ROOT)
  procs = local_processes.launch(num_processes, devices, args, logs=logs,
                                 env=env, cwd=ROOT)
  codes = local_processes.wait(procs, timeout=timeout)
  return codes, [open(log).read() for log in logs]


def _records(out):
  with open(os.path.join(out, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _assert_same_numbers(got, want):
  assert [r["round"] for r in got] == [r["round"] for r in want]
  for g, w in zip(got, want):
    for key in ("mean_train_loss", "accuracy", "test_loss",
                "client_accuracy"):
      np.testing.assert_allclose(g[key], w[key], rtol=RTOL, atol=1e-6,
                                 err_msg=f"round {g['round']} {key}")
    if "test_split" in w:
      np.testing.assert_allclose(g["test_split"]["accuracy"],
                                 w["test_split"]["accuracy"], rtol=RTOL)


def _one_process(out, args):
  """``experiments.run`` in one process, its default device count."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-m", "experiments.run", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=400, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return _records(out)


# --- in one process: nothing changes -------------------------------------


def test_one_process_functions_are_the_identity():
  assert processes.count() == 1 and processes.is_writer()
  state = {"a": np.arange(6.0).reshape(3, 2), "b": np.float32(1)}
  strategy = client_axis.ClientStrategy("map")
  assert processes.place_state(state, 3, strategy) is state
  assert processes.place_clients(state, strategy) is state
  assert processes.run_strategy(strategy) is strategy
  assert processes.agree(3) == 3 and processes.agree(False) == 0
  np.testing.assert_array_equal(processes.gather(np.arange(2)),
                                [[0, 1]])
  assert processes.to_host(state)["b"] == 1
  processes.sync("nothing")  # returns at once


def test_sharded_in_one_process_places_clients_on_the_mesh():
  strategy = client_axis.ClientStrategy("sharded", inner="map")
  n = jax.device_count()
  state = {"duals": np.ones((2 * n, 3), np.float32),
           "params": np.zeros((5,), np.float32)}
  placed = processes.place_state(state, 2 * n, strategy)
  assert placed["params"].sharding.is_fully_replicated
  np.testing.assert_array_equal(placed["duals"], state["duals"])


@pytest.mark.parametrize("given, match", [
    (dict(num_processes=2), "go together"),
    (dict(coordinator="localhost:1", num_processes=2, process_id=2),
     "must be in 0 .. 1"),
])
def test_initialize_refuses_incomplete_or_bad_flags(given, match):
  with pytest.raises(ValueError, match=match):
    process_group.initialize(**given)


def test_one_process_given_as_flags_is_a_plain_run():
  assert not process_group.initialize("localhost:1", 1, 0)


def test_a_peer_directory_writes_nothing(tmp_path):
  out = outputs.PeerOutputDir(str(tmp_path / "run"))
  out.check_writable()
  with out.lock():
    out.claim()
    out.write_json("config.json", {"a": 1})
    out.write_text("partition.txt", "x")
    out.write_records("metrics.jsonl", [{"round": 1}])
  assert not os.path.exists(out.path)


def test_checksums_of_a_run_across_processes_are_per_process():
  tree = {"a": np.arange(4, dtype=np.float32)}
  mine = checkpoint.checksums(tree)["['a']"]
  checkpoint.check_checksums(tree, {"['a']": [0, mine]}, "here", process=1)
  with pytest.raises(checkpoint.DamagedCheckpointError, match="'a'"):
    checkpoint.check_checksums(tree, {"['a']": [mine, 0]}, "here",
                               process=1)


def test_partial_distributed_flags_are_one_line(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run",
       "--distributed.num_processes=2", f"--output_dir={tmp_path / 'r'}"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
      text=True, timeout=120, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      "error: --distributed.coordinator, --distributed.num_processes and "
      "--distributed.process_id go together: give all three (or none, on a "
      "cluster that jax.distributed detects)"]


# --- across processes ------------------------------------------------------


def test_across_processes_a_missing_pm_is_refused_in_one_line(tmp_path):
  """Saving a checkpoint is a collective of all processes: the run does
  not pretrain its PM, and says how to get one."""
  missing = tmp_path / "no_pm"
  codes, logs = _launch(2, 1, _flags(tmp_path / "run", **{
      "augfl.lam": 5.0, "pm.model": "mlp", "pm.dir": missing}), tmp_path,
                        timeout=200)
  assert codes == [2, 2], logs
  for log in logs:
    errors = [l for l in log.splitlines() if l.startswith("error:")]
    assert errors == [
        "error: a run across processes does not pretrain its PM, and "
        f"{missing} holds none: pretrain it first, in one process, with "
        "python -m experiments.pretrain_pm and the run's flags (or run the "
        "run once in one process)"], log[-2000:]
  assert not os.path.exists(missing)


_FINISH = """
import sys
from augfl_jax.training import process_group
process_group.BEAT_SECONDS = 0.0005  # the client is called all the time
process_group.initialize(sys.argv[1], 2, int(sys.argv[2]))
process_group.finished()
"""


def test_processes_that_finish_exit_cleanly_while_their_watchdogs_beat():
  """The watchdog stops before the interpreter's exit: a thread ended by
  it inside a call of the coordinator's client aborts the process (exit
  -6, "FATAL: exception not rethrown"), most pairs without the stop."""
  for _ in range(2):
    address = f"localhost:{local_processes.free_port()}"
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", _FINISH, address, str(i)],
                              env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs


@pytest.mark.slow
@pytest.mark.parametrize("name, changes", [
    ("augfl_without_pm", {"augfl.lam": 0.0}),
    ("fedavg", {"algorithm": "fedavg"}),
    ("augfl_with_pm", None),  # the PM run: pm_dir below
])
def test_two_processes_match_one_with_four_devices_and_the_default(
    tmp_path, pm_dir, name, changes):
  """On digits, 2 processes x 2 devices against 1 process x 4 devices and
  the default one-process run; one run directory, written by process 0."""
  changes = changes or {"augfl.lam": 5.0, "pm.model": "mlp",
                        "pm.dir": pm_dir}
  two, four, one = (tmp_path / n for n in ("two", "four", "one"))
  codes, logs = _launch(2, 2, _flags(two, rounds=3, **changes), tmp_path)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert "client axis: sharded:map over 4 devices of 2 processes" in logs[0]
  assert "final test-client accuracy" in logs[0]
  assert "round" not in logs[1].replace("Gloo", "")  # one console
  codes, logs4 = _launch(1, 4, _flags(four, rounds=3, strategy="sharded:map",
                                      **changes), tmp_path)
  assert codes == [0], logs4[0][-3000:]
  want = _one_process(one, _flags(one, rounds=3, **changes))
  _assert_same_numbers(_records(four), want)
  _assert_same_numbers(_records(two), want)
  assert sorted(os.listdir(two)) == sorted(os.listdir(one)), name
  steps = os.listdir(two / "checkpoints")
  assert steps == ["step_3"], steps


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FMNIST_DIR),
                    reason="Debian's Fashion-MNIST is not installed")
def test_two_processes_match_one_on_fashion_mnist_within_rounding(tmp_path):
  """3 rounds of AugFL w/o PM on Fashion-MNIST (the cnn, 40 training
  clients of the paper's protocol, 1,000 test-split clients). The
  finite-difference HVP (a difference of gradients over delta) and the
  held-out clients' fast adaptation carry float32 rounding into the
  numbers beyond 1e-5, so "within rounding" is measured: one process with
  --strategy=vmap instead of map (the same computation in another order)
  is the control, and 2 processes x 2 devices must differ from the default
  run by no more than 3 times as much."""
  changes = {"dataset": "fashion_mnist", "augfl.lam": 0.0, "rounds": 3}
  codes, logs = _launch(2, 2, _flags(tmp_path / "two", **changes), tmp_path,
                        timeout=900)
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  two = _records(tmp_path / "two")
  want = _one_process(tmp_path / "one", _flags(tmp_path / "one", **changes))
  control = _one_process(tmp_path / "vmap", _flags(
      tmp_path / "vmap", strategy="vmap", **changes))
  value = lambda r, k: (r["test_split"]["accuracy"] if k == "test_split"
                        else r[k])
  for g, w, c in zip(two, want, control):
    for key in ("mean_train_loss", "test_loss", "accuracy") + (
        ("test_split",) if "test_split" in w else ()):
      got, expected, other = (value(r, key) for r in (g, w, c))
      assert abs(got - expected) <= 3 * abs(other - expected) + 1e-5, (
          g["round"], key, got, expected, other)


@pytest.mark.slow
def test_resume_across_processes_is_exact_and_another_count_is_refused(
    tmp_path):
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  codes, logs = _launch(2, 2, _flags(straight, rounds=4, **NO_PM), tmp_path)
  assert codes == [0, 0], logs[0][-3000:]
  codes, logs = _launch(2, 2, _flags(resumed, rounds=2, **NO_PM), tmp_path)
  assert codes == [0, 0], logs[0][-3000:]
  codes, logs = _launch(2, 2, _flags(resumed, rounds=4, resume=None,
                                     **NO_PM), tmp_path)
  assert codes == [0, 0], logs[0][-3000:]
  assert "resuming from round 2" in logs[0]
  # (A run of 2 rounds scores its test-split clients after its last.)
  strip = lambda rs: [{k: v for k, v in r.items()
                       if k not in ("seconds", "test_split")} for r in rs]
  assert strip(_records(resumed)) == strip(_records(straight))
  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run",
       *_flags(resumed, rounds=5, resume=None, **NO_PM)], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f"error: --resume: {resumed}/checkpoints/step_4 was saved by a run "
      "of 2 processes and this one has 1; resume it with "
      "--distributed.num_processes=2 (each process holds its own part of "
      "the state)"]


def _start_and_wait_for_step_5(out, logs, args=(), devices=2):
  procs = local_processes.launch(
      2, devices, _flags(out, rounds=100000, checkpoint_every=5, **NO_PM,
                   **dict(args)),
      logs=logs, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
  deadline = time.monotonic() + 300
  while not os.path.isdir(out / "checkpoints" / "step_5"):
    if time.monotonic() > deadline or any(p.poll() is not None
                                           for p in procs):
      local_processes.wait(procs, timeout=1)
      raise AssertionError(open(logs[0]).read()[-3000:])
    time.sleep(0.5)
  return procs


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])  # 0: the writer, coordinator's
def test_a_killed_process_stops_the_others_in_one_line(tmp_path, killed):
  """One CPU device per process: with several, Gloo itself may abort the
  survivor at once (``gloo::EnforceNotMet``, "Received data size doesn't
  match expected size") before any line of ours (README)."""
  out = tmp_path / "killed"
  logs = [str(tmp_path / f"p{i}.log") for i in range(2)]
  procs = _start_and_wait_for_step_5(out, logs, devices=1)
  survivor = 1 - killed
  try:
    procs[killed].send_signal(signal.SIGKILL)
    start = time.monotonic()
    code = procs[survivor].wait(timeout=60)
    seconds = time.monotonic() - start
  finally:
    local_processes.wait(procs, timeout=1)
  log = open(logs[survivor]).read()
  errors = [l for l in log.splitlines() if l.startswith("error:")]
  assert code == 1 and len(errors) == 1, log[-3000:]
  assert errors[0].startswith(
      f"error: process {killed} stopped answering (killed, or its machine "
      f"is gone); process {survivor} stops too; resume with: python -m "
      "experiments.run "), errors[0]
  assert seconds < process_group.STALE_SECONDS + 8, seconds
  assert "Traceback" not in log and "Check failure" not in log
  steps = [s for s in os.listdir(out / "checkpoints")
           if s.startswith("step_") and s[5:].isdigit()]
  # What the kill left is resumable, with the same number of processes.
  newest = max(int(s[5:]) for s in steps)
  codes, logs = _launch(2, 1, _flags(out, rounds=newest + 2, resume=None,
                                     checkpoint_every=5, **NO_PM), tmp_path)
  assert codes == [0, 0], logs[0][-3000:]
  assert f"resuming from round {newest}" in logs[0]


@pytest.mark.slow
def test_a_signal_to_one_process_stops_all_after_the_round(tmp_path):
  out = tmp_path / "signalled"
  logs = [str(tmp_path / f"p{i}.log") for i in range(2)]
  procs = _start_and_wait_for_step_5(out, logs)
  procs[1].send_signal(signal.SIGTERM)
  codes = local_processes.wait(procs, timeout=120)
  assert codes == [128 + signal.SIGTERM] * 2, open(logs[0]).read()[-3000:]
  lines = open(logs[0]).read().splitlines()
  said = [l for l in lines if l.startswith("interrupted:")]
  assert len(said) == 1 and "(received by another process): the run " \
      "state is saved in" in said[0], said
  assert not [l for l in lines if l.startswith("error:")]
  assert lines[-1].startswith("resume with: python -m experiments.run ")
