"""The main job across processes (``augfl_jax.processes``): local processes
of ``experiments.run`` with 2 CPU devices each give the numbers of one
process (4 devices, and the default strategy) within float rounding, write
one run directory, resume with the same number of processes (another is
refused in one line) and stop together, in one line, when one is killed.
The processes of a run agree on their flags and data before round 1,
admit no other process, name a peer that does not start, and end on a
signal even when stuck in a collective; ``experiments.local_processes``
passes signals on and prints its own resume line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from augfl_jax import models, processes
from augfl_jax.core import client_axis
from augfl_jax.processes import gate, group, local
from augfl_jax.storage import checkpoint
from augfl_jax.training import outputs
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
  procs = local.launch(num_processes, devices, args, logs=logs, env=env,
                       cwd=ROOT)
  codes = local.wait(procs, timeout=timeout)
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


def test_launch_runs_the_command_it_is_given(tmp_path):
  """``program`` names the command the processes run (one's own script
  that reads the ``--distributed.*`` flags): each process gets its own
  flags, one coordinator, the flags given and its CPU devices."""
  script = tmp_path / "my_run.py"
  script.write_text("import os, sys\n"
                    "print(' '.join(sys.argv[1:]), os.environ['XLA_FLAGS'])\n")
  logs = [str(tmp_path / f"process{i}.log") for i in range(2)]
  procs = local.launch(2, 3, ["--rounds=1"], program=(str(script),),
                       logs=logs)
  assert local.wait(procs, timeout=60) == [0, 0]
  lines = [open(log).read().split() for log in logs]
  coordinator = lines[0][0]
  assert coordinator.startswith("--distributed.coordinator=localhost:")
  for i, line in enumerate(lines):
    assert line == [coordinator, "--distributed.num_processes=2",
                    f"--distributed.process_id={i}", "--rounds=1",
                    "--xla_force_host_platform_device_count=3"]
  assert local.command(1, 2, 80, ["--x"])[1:3] == ["-m", "experiments.run"]


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
    group.initialize(**given)


def test_one_process_given_as_flags_is_a_plain_run():
  assert not group.initialize("localhost:1", 1, 0)


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
from augfl_jax.processes import group
group.BEAT_SECONDS = 0.0005  # the client is called all the time
group.initialize(sys.argv[1], 2, int(sys.argv[2]))
group.finished()
"""


def test_processes_that_finish_exit_cleanly_while_their_watchdogs_beat():
  """The watchdog stops before the interpreter's exit: a thread ended by
  it inside a call of the coordinator's client aborts the process (exit
  -6, "FATAL: exception not rethrown"), most pairs without the stop."""
  for _ in range(2):
    address = f"localhost:{local.free_port()}"
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", _FINISH, address, str(i)],
                              env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs



@pytest.mark.parametrize("received, code", [(None, 1),
                                            (signal.SIGTERM, 143),
                                            (signal.SIGINT, 130)])
def test_a_peers_stop_ends_a_process_with_its_own_signals_code(
    monkeypatch, capsys, received, code):
  """Process 1 announced its stop. Process 0's watchdog ends process 0 with
  exit code 1, or, where process 0 received a signal that its main thread
  took (it was not stuck, and would stop after its round), 128 + that
  signal: on a loaded machine a SIGTERM to both processes ended process 0
  through process 1's stop, with code 1."""
  from augfl_jax.processes.signals import StopSignals

  class Client:  # the coordinator's store: process 1 has stopped

    def key_value_set(self, *args, **kwargs):
      pass

    def key_value_dir_get(self, prefix):
      return [(f"{prefix}1", "stopped interrupted (SIGTERM)")]

  dog = group.Watchdog.__new__(group.Watchdog)
  threading.Thread.__init__(dog, daemon=True)
  dog.client, dog.me, dog.n, dog.arrived = Client(), 0, 2, []
  dog.done = threading.Event()
  read, write = os.pipe()
  os.set_blocking(read, False)
  dog.signals, dog.taken_before = read, StopSignals.taken
  if received is not None:  # arrived, and taken by the main thread
    os.write(write, bytes([received]))
    monkeypatch.setattr(StopSignals, "taken", StopSignals.taken + 1)
  codes = []
  monkeypatch.setattr(group, "GRACE_SECONDS", 0.0)
  monkeypatch.setattr(group, "leave", lambda c: (codes.append(c),
                                                 dog.done.set()))
  try:
    dog.run()
  finally:
    os.close(read)
    os.close(write)
  assert codes == [code]
  assert capsys.readouterr().err.startswith(
      "error: process 1 stopped: interrupted (SIGTERM); process 0 stops too")

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
  procs = local.launch(
      2, devices, _flags(out, rounds=100000, checkpoint_every=5, **NO_PM,
                   **dict(args)),
      logs=logs, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
  deadline = time.monotonic() + 300
  while not os.path.isdir(out / "checkpoints" / "step_5"):
    if time.monotonic() > deadline or any(p.poll() is not None
                                           for p in procs):
      local.wait(procs, timeout=1)
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
    local.wait(procs, timeout=1)
  log = open(logs[survivor]).read()
  errors = [l for l in log.splitlines() if l.startswith("error:")]
  assert code == 1 and len(errors) == 1, log[-3000:]
  assert errors[0].startswith(
      f"error: process {killed} stopped answering (killed, or its machine "
      f"is gone); process {survivor} stops too; resume with: python -m "
      "experiments.run "), errors[0]
  assert seconds < group.STALE_SECONDS + 8, seconds
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
  codes = local.wait(procs, timeout=120)
  assert codes == [128 + signal.SIGTERM] * 2, open(logs[0]).read()[-3000:]
  lines = open(logs[0]).read().splitlines()
  said = [l for l in lines if l.startswith("interrupted:")]
  assert len(said) == 1 and "(received by another process): the run " \
      "state is saved in" in said[0], said
  assert not [l for l in lines if l.startswith("error:")]
  assert lines[-1].startswith("resume with: python -m experiments.run ")


# --- one run: its own processes, agreed before round 1 ---------------------


def test_differences_name_each_flag_and_its_processes():
  records = [{"--rounds": "3", "--seed": "0", "--model": "mlp"},
             {"--rounds": "5", "--seed": "0", "--model": "mlp"},
             {"--rounds": "3", "--seed": "0"}]
  assert group.differences(records) == [
      "--rounds: 3 on processes 0 and 2, 5 on process 1",
      "--model: mlp on processes 0 and 1, (absent) on process 2"]
  assert group.differences(records[:1] * 3) == []
  assert group.agree_on("flags", records[0]) == []  # one process


def _gate(num_processes):
  """A gate of ``num_processes`` in a thread of this process; its port."""
  listener = gate._listen(0)  # pylint: disable=protected-access
  server = gate.Gate(listener, num_processes, service_port=4321)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return listener.getsockname()[1]


def test_the_gate_admits_the_run_s_processes_and_refuses_others(
    monkeypatch):
  monkeypatch.setattr(gate, "FIRST_REPORT_SECONDS", 0.5)
  port, said = _gate(2), []
  joined = []
  first = threading.Thread(target=lambda: joined.append(gate.join(
      "localhost", port, 0, 2, 30, said.append)))
  first.start()
  assert gate.join("localhost", port, 1, 2, 30, said.append) == 4321
  first.join()
  assert joined == [4321]
  with pytest.raises(gate.StartupError) as refused:
    gate.join("localhost", port, 1, 2, 30, said.append)
  assert str(refused.value) == (
      f"--distributed.process_id=1: process 1 of the run at localhost:{port}"
      " has joined already (this is a second command with its process id, "
      "or another run's process on its coordinator); give each process of "
      "a run its own --distributed.process_id, and another run another "
      "--distributed.coordinator port")
  with pytest.raises(gate.StartupError, match=(
      "--distributed.num_processes=3: the run at localhost:[0-9]+ has 2 "
      "processes; give every process of a run the same")):
    gate.join("localhost", port, 2, 3, 30, said.append)
  # A process whose peers do not come names them, then gives up.
  port = _gate(3)
  with pytest.raises(gate.StartupError) as late:
    gate.join("localhost", port, 1, 3, 1.2, said.append)
  assert str(late.value).startswith(
      "process 0 (the coordinator) and process 2 of 3 did not join the run "
      f"at localhost:{port} within --distributed.startup_timeout=1.2 s: "
      "start every process of the run")
  assert said and all(line.startswith(
      "process 1: waiting for process 0 (the coordinator) and process 2 of "
      f"3 at localhost:{port} (") for line in said), said


def test_the_coordination_service_listens_on_the_port_it_is_given():
  """--distributed.service_port: the service behind the gate on a port a
  firewall can open, not one the system picks."""
  gate_port, service_port = local.free_port(), local.free_port()
  parent = subprocess.Popen([sys.executable, "-c",  # pylint: disable=consider-using-with
                             "import time; time.sleep(60)"])
  try:
    child = subprocess.Popen(  # pylint: disable=consider-using-with
        group._service_command(gate_port, 2, service_port, parent=parent.pid,  # pylint: disable=protected-access
                               linger=0),
        stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == f"serving {service_port}"
  finally:
    parent.kill()
    parent.wait()
  assert child.wait(timeout=30) == 0  # no process joined: it ends at once


def test_a_coordinator_whose_service_cannot_start_says_why(tmp_path,
                                                          monkeypatch):
  """Process 0's child that fails is reported as what it is: its exit code
  and its error's last line (an import error, a crash), a service port
  that is taken as taken; before, every failure read "no free port for
  it?"."""
  address = f"localhost:{local.free_port()}"
  with gate._listen(0) as taken:  # pylint: disable=protected-access
    port = taken.getsockname()[1]
    with pytest.raises(ValueError) as in_use:
      group.initialize(address, 2, 0, 5, service_port=port)
  assert str(in_use.value) == (
      f"--distributed.coordinator={address}: the coordination service could"
      f" not start: --distributed.service_port={port} is in use; choose "
      "another, or 0 for one the system picks")
  broken = tmp_path / "python"
  broken.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' "
                    ">&2\necho \"ModuleNotFoundError: No module named "
                    "'jax'\" >&2\nexit 3\n")
  broken.chmod(0o755)
  monkeypatch.setattr(sys, "executable", str(broken))
  with pytest.raises(ValueError) as crashed:
    group.initialize(address, 2, 0, 5)
  assert str(crashed.value) == (
      f"--distributed.coordinator={address}: the coordination service's "
      "process ended with exit code 3 before it served: "
      "ModuleNotFoundError: No module named 'jax'")


def test_the_gate_s_child_names_the_error_of_a_service_that_cannot_start(
    capsys):
  """Its one line says the error, not a port in use."""
  def start_service(address, num_processes, heartbeat):
    del address, heartbeat
    raise RuntimeError(f"UNAVAILABLE: cannot serve {num_processes} "
                       "processes\nthe rest of its message")
  gate.serve(start_service, "0", "2", "30", "1", "0", str(local.free_port()))
  assert capsys.readouterr().out == (
      "no service: RuntimeError: UNAVAILABLE: cannot serve 2 processes\n")


def test_without_a_coordinator_the_wait_names_it_and_ends_in_one_line(
    tmp_path):
  """Before, a process whose peer never started was silent for 300 s, then
  aborted with a C++ trace (exit 134)."""
  address = f"localhost:{local.free_port()}"
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run",
       f"--distributed.coordinator={address}",
       "--distributed.num_processes=2", "--distributed.process_id=1",
       "--distributed.startup_timeout=6", f"--output_dir={tmp_path / 'r'}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
      check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert lines[0].startswith(
      f"process 1: waiting for process 0 (the coordinator) of 2 at {address}"
      " (5 s of --distributed.startup_timeout=6) ..."), lines
  assert lines[1:] == [
      f"error: process 0 (the coordinator) of 2 did not join the run at "
      f"{address} within --distributed.startup_timeout=6 s: start it on the "
      "host of --distributed.coordinator (the same command with "
      "--distributed.process_id=0), or correct that flag, or give a larger "
      "--distributed.startup_timeout"]
  assert time.monotonic() - start < 60
  assert not os.path.exists(tmp_path / "r")


_HOLD = """
import os, sys, time
from augfl_jax import processes
from augfl_jax.processes import group
group.initialize(sys.argv[1], 2, int(sys.argv[2]))
print("joined", flush=True)
while not os.path.exists(sys.argv[3]):
  time.sleep(0.2)
processes.sync("after the intruder")  # the service still serves
group.finished()
print("finished", flush=True)
"""


@pytest.mark.slow
def test_an_intruder_is_refused_in_one_line_and_the_run_goes_on(tmp_path):
  """A second command with a process id of a running run (or another
  process count) is refused at the gate; before, it made the coordination
  service fail and JAX abort every process of the run."""
  address = f"localhost:{local.free_port()}"
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  done = tmp_path / "done"
  run = [subprocess.Popen([sys.executable, "-c", _HOLD, address, str(i),
                           str(done)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
         for i in range(2)]
  try:
    for p in run:
      assert p.stdout.readline().strip() == "joined"
    refusals = {
        (1, 2): "--distributed.process_id=1: process 1 of the run at "
                f"{address} has joined already",
        (1, 3): f"--distributed.num_processes=3: the run at {address} has 2 "
                "processes",
        (0, 2): f"--distributed.coordinator={address}: its port is in use "
                "(by another run's coordinator, or by a run's that ended "
                "less than 23 s ago); choose another port, or wait"}
    intruders = [subprocess.Popen(
        [sys.executable, "-m", "experiments.run",
         f"--distributed.coordinator={address}",
         f"--distributed.num_processes={num_processes}",
         f"--distributed.process_id={process_id}",
         f"--output_dir={tmp_path / 'intruder'}"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for process_id, num_processes in refusals]
    for intruder, refusal in zip(intruders, refusals.values()):
      stderr = intruder.communicate(timeout=120)[1]
      assert intruder.returncode == 2, stderr[-3000:]
      lines = stderr.strip().splitlines()
      assert len(lines) == 1 and lines[0].startswith(
          f"error: {refusal}"), lines
    done.touch()
    logs = [p.communicate(timeout=120)[0] for p in run]
  finally:
    local.wait(run, timeout=1)
  assert [p.returncode for p in run] == [0, 0], logs
  assert all(log.strip().endswith("finished") for log in logs), logs


def _launch_each(args_of, tmp_path, timeout=300):
  """Runs ``experiments.run`` as ``len(args_of)`` processes of one run,
  process ``i`` with its own flags ``args_of[i]``; ``(exit codes,
  logs)``."""
  port = local.free_port()
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=1")
  logs = [tmp_path / f"each{i}_{time.monotonic_ns()}.log"
          for i in range(len(args_of))]
  procs = []
  for i, args in enumerate(args_of):
    with open(logs[i], "w") as out:
      procs.append(subprocess.Popen(
          local.command(i, len(args_of), port, args), env=env,
          cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
  codes = local.wait(procs, timeout=timeout)
  return codes, [log.read_text() for log in logs]


def _errors(log):
  return [l for l in log.splitlines() if l.startswith("error:")]


def test_processes_given_different_flags_stop_in_one_line_naming_them(
    tmp_path):
  """Before, processes with another --rounds hung in a collective for
  ever, another --seed or --fedavg.lr finished with numbers of no
  configuration, another --output_dir failed on a missing file."""
  same = {"algorithm": "fedavg", "nocompilation_cache": None}
  codes, logs = _launch_each([
      _flags(tmp_path / "a", **same),
      _flags(tmp_path / "b", rounds=3, seed=1, eval_every=2,
             checkpoint_every=2, **{"fedavg.lr": 0.5}, **same)], tmp_path)
  assert codes == [2, 2], logs
  want = [
      "error: the 2 processes of the run were given different flags "
      "(--rounds: 2 on process 0, 3 on process 1; --eval_every: 1 on "
      "process 0, 2 on process 1; --seed: 0 on process 0, 1 on process 1; "
      "--fedavg.lr: 0.05 on process 0, 0.5 on process 1; --checkpoint_every:"
      " 50 on process 0, 2 on process 1; --output_dir: "
      f"{tmp_path / 'a'} on process 0, {tmp_path / 'b'} on process 1): give "
      "every process the same flags, each its own --distributed.process_id;"
      " nothing was written"]
  assert [_errors(log) for log in logs] == [want, want], logs
  assert "Traceback" not in logs[0] + logs[1]
  assert not os.path.exists(tmp_path / "a")
  assert not os.path.exists(tmp_path / "b")


def _idx_copy(directory, flipped_label=None):
  """A small Fashion-MNIST of IDX files in ``directory`` (600 examples);
  ``flipped_label``: the example whose label differs from the others'
  copies."""
  from augfl_jax.data import idx  # pylint: disable=g-import-not-at-top
  os.makedirs(directory)
  rng = np.random.default_rng(0)
  labels = (np.arange(600) % 10).astype(np.uint8)
  if flipped_label is not None:
    labels[flipped_label] = (labels[flipped_label] + 1) % 10
  idx.write_idx(os.path.join(directory, "train-images-idx3-ubyte"),
                rng.integers(0, 256, (600, 28, 28)).astype(np.uint8))
  idx.write_idx(os.path.join(directory, "train-labels-idx1-ubyte"), labels)
  return str(directory)


@pytest.mark.slow
def test_processes_that_read_different_data_stop_in_one_line(tmp_path):
  """Each host's copy of the dataset: the same flags (but
  --data.data_dir), one label differs."""
  out = tmp_path / "run"
  flags = _flags(out, dataset="fashion_mnist", **NO_PM, **{
      "data.num_clients": 10, "data.server_size": 100,
      "eval.test_split": "off"})
  copies = [_idx_copy(tmp_path / "copy0"),
            _idx_copy(tmp_path / "copy1", flipped_label=5)]
  codes, logs = _launch_each([flags + [f"--data.data_dir={c}"]
                              for c in copies], tmp_path)
  assert codes == [2, 2], logs
  for log, copy in zip(logs, copies):
    errors = _errors(log)
    assert len(errors) == 1, log
    assert errors[0].startswith(
        "error: the 2 processes of the run read different data (the server "
        "split's digest: "), errors
    assert errors[0].endswith(
        f"give every process the same dataset files (this process read IDX "
        f"files {copy}/train-images-idx3-ubyte, {copy}/train-labels-idx1-"
        "ubyte) and the same flags; nothing was written"), errors
  assert not os.path.exists(out)


@pytest.mark.slow
def test_a_signal_ends_processes_stuck_in_a_collective(tmp_path):
  """Process 1 waits in a call that never returns, process 0 for it in a
  collective: neither main thread can take a signal, and before, SIGTERM
  left both running for ever. Each ends within seconds, in one line with
  the resume command (``tests/stuck_collective.py``)."""
  logs = [str(tmp_path / f"p{i}.log") for i in range(2)]
  marker = tmp_path / "stuck"
  procs = local.launch(
      2, 1, ["--imports=tests.stuck_collective",
             *_flags(tmp_path / "run", rounds=50, **NO_PM)], logs=logs,
      env=dict(os.environ, PYTHONPATH=ROOT, STUCK_MARKER=str(marker)),
      cwd=ROOT)
  try:
    deadline = time.monotonic() + 300
    entered = tmp_path / "stuck.0"  # process 0 calls the collective
    while not (marker.exists() and entered.exists()):
      assert time.monotonic() < deadline and all(
          p.poll() is None for p in procs), open(logs[0]).read()[-3000:]
      time.sleep(0.3)
    time.sleep(2)  # process 0 waits in the collective by now
    start = time.monotonic()
    for p in procs:
      p.send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=60) for p in procs]
    seconds = time.monotonic() - start
  finally:
    local.wait(procs, timeout=1)
  assert codes == [128 + signal.SIGTERM] * 2, [open(l).read()[-2000:]
                                                for l in logs]
  assert seconds < 5 + 10, seconds
  own = ("interrupted: SIGTERM, which process {} has not taken within 5 s "
         "(it waits in a collective that another process does not join, or "
         "in one long computation): it stops now, without saving; resume "
         "with: python -m experiments.run ")
  # Process 0's main thread may still take the signal on its way into the
  # collective (a loaded machine): then process 1's stop ends it.
  peers = ("error: process 1 stopped: interrupted (SIGTERM); process 0 "
           "stops too; resume with: python -m experiments.run ")
  for i, log in enumerate(logs):
    lines = [l for l in open(log).read().splitlines()
             if l.startswith(("interrupted", "error"))]
    assert len(lines) == 1, lines
    assert lines[0].startswith(own.format(i)) or (
        i == 0 and lines[0].startswith(peers)), lines
    assert lines[0].endswith(" --resume"), lines


@pytest.mark.slow
def test_local_processes_passes_a_signal_on_and_prints_its_own_resume_line(
    tmp_path):
  """SIGTERM to the command (before, its processes went on, detached,
  holding the lock); an intruder on the running run's coordinator is
  refused meanwhile and the run goes on; the command's resume line resumes
  every process."""
  out = tmp_path / "run"
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("AUGFL_JAX_LAUNCHER", None)  # local_processes.LAUNCHER
  run = ["--checkpoint_every=5", "--nocompilation_cache", "--augfl.lam=0",
         f"--output_dir={out}"]
  with open(tmp_path / "console", "w") as console:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "experiments.local_processes",
         "--num_processes=2", "--", "--rounds=100000", *run], cwd=ROOT,
        env=env, stdout=console, stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / "step_5").is_dir():
      assert time.monotonic() < deadline and launcher.poll() is None, (
          (tmp_path / "console").read_text()[-3000:])
      time.sleep(0.5)
    coordinator = next(
        a for a in open(f"/proc/{_child_of(launcher.pid)}/cmdline").read()
        .split("\0") if a.startswith("--distributed.coordinator="))
    intruder = subprocess.run(
        [sys.executable, "-m", "experiments.run", coordinator,
         "--distributed.num_processes=2", "--distributed.process_id=1",
         "--rounds=100000", *run], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120, check=False)
    assert intruder.returncode == 2, intruder.stderr[-2000:]
    assert len(intruder.stderr.strip().splitlines()) == 1, intruder.stderr
    rounds_then = len(_records(out))
    time.sleep(3)
    assert len(_records(out)) > rounds_then  # the run goes on
    launcher.send_signal(signal.SIGTERM)
    code = launcher.wait(timeout=120)
  finally:
    if launcher.poll() is None:
      launcher.kill()
  console = (tmp_path / "console").read_text()
  assert code == 128 + signal.SIGTERM, console[-3000:]
  assert not _child_of(launcher.pid)  # none left running
  resume = [l for l in console.splitlines() if l.startswith("resume with:")]
  assert resume == [
      "resume with: python -m experiments.local_processes --num_processes=2 "
      f"-- --rounds=100000 {' '.join(run)} --resume"], console[-3000:]
  step = max(int(s[5:]) for s in os.listdir(out / "checkpoints")
             if s.startswith("step_") and s[5:].isdigit())
  args = resume[0][len("resume with: python -m "):].replace(
      "--rounds=100000", f"--rounds={step + 1}").split()
  proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert f"resuming from round {step}" in proc.stdout
  assert _records(out)[-1]["round"] == step + 1


def _child_of(pid):
  """The pid of a process that ``pid`` started and that still runs, or
  ``None``."""
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          fields = f.read().rpartition(")")[2].split()
      except OSError:
        continue
      if int(fields[1]) == pid and fields[0] != "Z":
        return int(entry)
  return None


def test_local_processes_help_lists_its_flags_and_exits_0():
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.local_processes", "--help"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
      text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith(
      "Runs ``experiments.run`` as several processes on this machine.")
  assert "the flags of python -m experiments.local_processes:\n" \
      "  --devices_per_process: CPU devices of each process (default: 1)\n" \
      "  --num_processes: how many processes run the command together " \
      "(default: 2)\n" in proc.stdout


def test_the_resume_line_of_a_process_of_local_processes_is_the_command_s(
    monkeypatch):
  from experiments import run  # pylint: disable=g-import-not-at-top
  argv = ["run.py", "--distributed.coordinator=localhost:1",
          "--distributed.num_processes=2", "--distributed.process_id=1",
          "--rounds=3", "--output_dir=runs/two", "--overwrite"]
  monkeypatch.setenv(local_processes.LAUNCHER, local_processes
                     .launcher_command(["lp", "--num_processes=2", "--",
                                        "--rounds=3"]))
  assert run.resume_command(argv) == (
      "python -m experiments.local_processes --num_processes=2 -- "
      "--rounds=3 --output_dir=runs/two --resume")
  monkeypatch.delenv(local_processes.LAUNCHER)
  assert run.resume_command(argv).startswith(
      "python -m experiments.run --distributed.coordinator=localhost:1 ")
