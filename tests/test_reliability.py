"""Bad input and faults: nothing lost or mixed, every refusal one line.

The cases of the reliability audit: two runs into one directory, files the
tool did not write, torn and empty files, damaged checkpoints, write errors
during a run, signals at every stage, step sizes changed on resume, and the
library's input checks (participants, parameters' dtypes, labels, configs).

Runs are tiny (digits, mlp, lam 0) and share a persistent compilation cache
in the session's temporary directory with their CLI subprocesses.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax.algorithms import fedavg
from augfl_jax.algorithms import augfl
from augfl_jax import data, models, training
from augfl_jax.core import fields
from augfl_jax.training import checkpoints, experiment, outputs
from tests import run_files, tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = lambda s: None  # noqa: E731
TINY = {"augfl.lam": 0.0}

pytestmark = pytest.mark.usefixtures("compile_cache")


def _config(**changes):
  return fields.replace(training.RunConfig(), **{**TINY, **changes})


def _env(compile_cache):
  return {**os.environ, "XDG_CACHE_HOME": compile_cache,
          "PYTHONUNBUFFERED": "1"}


def _cli(compile_cache, *args, **kwargs):
  return subprocess.run([sys.executable, "-m", "experiments.run", *args],
                        cwd=ROOT, env=_env(compile_cache),
                        capture_output=True, text=True, timeout=300,
                        **kwargs)


def _start(compile_cache, *args):
  return subprocess.Popen([sys.executable, "-m", "experiments.run", *args],
                          cwd=ROOT, env=_env(compile_cache), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_round(proc, round_):
  for line in proc.stdout:
    if line.startswith("round") and int(
        line.split()[1].split("/")[0]) >= round_:
      return
  raise AssertionError(f"no round {round_}: {proc.stderr.read()}")


def _no_data_loaded(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("the data were loaded")
  monkeypatch.setattr(experiment, "load_federated", refuse)


# ----------------------------------------------------------------------------
# One writer per directory.


@pytest.mark.slow
def test_two_runs_and_a_resume_into_a_directory_in_use_get_one_line(
    tmp_path, compile_cache):
  """While a run trains, a second run and a --resume into its directory
  are refused in one line, exit 2, and leave its files alone."""
  out = str(tmp_path / "run")
  args = ["--augfl.lam=0", "--rounds=5000", "--eval_every=2",
          "--checkpoint_every=2", f"--output_dir={out}"]
  first = _start(compile_cache, *args)
  try:
    _wait_for_round(first, 3)
    others = [_start(compile_cache, "--algorithm=fedavg", "--rounds=20",
                     f"--output_dir={out}"),
              _start(compile_cache, *args, "--resume")]
    second, resumed = [
        subprocess.CompletedProcess(p.args, p.wait(timeout=300),
                                    p.stdout.read(), p.stderr.read())
        for p in others]
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
  finally:
    first.kill()
  for result in (second, resumed):
    assert ("is in use by another run (process "
            in run_files.one_line(result))
  assert first.returncode == 128 + signal.SIGINT, err
  config = json.load(open(os.path.join(out, "config.json")))
  assert config["algorithm"] == "augfl" and config["rounds"] == 5000
  rounds = [r["round"] for r in run_files.records(out)]
  assert rounds == list(range(2, rounds[-1] + 1, 2)) and rounds[-1] >= 4
  assert run_files.steps(out)[-1] >= rounds[-1]


def test_a_refused_run_never_removes_the_holders_new_directory(
    tmp_path, monkeypatch):
  """Two runs into a directory that did not exist: the one that loses the
  race fails, and its clean-up (of a directory it thinks it created, holding
  only the lock file) must not remove the winner's lock and directory."""
  out = str(tmp_path / "new")
  holder = outputs.OutputDir(out)
  held = []
  check = outputs.OutputDir.check_writable

  def check_then_lose_the_race(self):
    check(self)
    lock = holder.lock()
    lock.__enter__()  # the other run takes the lock first
    held.append(lock)
  monkeypatch.setattr(outputs.OutputDir, "check_writable",
                      check_then_lose_the_race)
  with pytest.raises(training.OutputDirError, match="in use by another run"):
    training.run(_config(rounds=1), out, log=QUIET)
  assert os.listdir(out) == [outputs.LOCK]
  with pytest.raises(training.OutputDirError, match="in use by another run"):
    with outputs.OutputDir(out).lock():
      pass
  held[0].__exit__(None, None, None)


def test_a_lock_taken_on_a_removed_lock_file_is_taken_again(
    tmp_path, monkeypatch):
  """The holder may remove the lock file (with its directory) between our
  open and our flock: the flock then holds a file nobody else sees, and
  the next run would lock a new one. The lock is taken again."""
  out = str(tmp_path / "run")
  os.makedirs(out)
  real_open = os.open
  calls = []

  def open_then_removed(path, flags, mode=0o777):
    fd = real_open(path, flags, mode)
    if path.endswith(outputs.LOCK) and not calls:
      calls.append(path)
      os.remove(path)  # the previous holder's clean-up
    return fd
  monkeypatch.setattr(outputs.os, "open", open_then_removed)
  with outputs.OutputDir(out).lock():
    monkeypatch.setattr(outputs.os, "open", real_open)
    assert calls and os.path.exists(os.path.join(out, outputs.LOCK))
    with pytest.raises(training.OutputDirError, match="in use"):
      with outputs.OutputDir(out).lock():
        pass


# ----------------------------------------------------------------------------
# Only its own files.


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_directory_of_user_files_is_refused_and_left_as_it_is(
    tmp_path, overwrite, monkeypatch):
  out = tmp_path / "mine"
  for sub in ("tb", "checkpoints"):
    (out / sub).mkdir(parents=True)
    (out / sub / "notes").write_text(sub)
  for name in ("metrics.jsonl", "summary.json"):
    (out / name).write_text("mine\n")
  _no_data_loaded(monkeypatch)
  with pytest.raises(training.OutputDirError) as e:
    training.run(_config(rounds=2), str(out), log=QUIET, overwrite=overwrite)
  assert "which augfl_jax did not write" in str(e.value)
  assert "\n" not in str(e.value)
  for name in ("metrics.jsonl", "summary.json"):
    assert (out / name).read_text() == "mine\n"
  for sub in ("tb", "checkpoints"):
    assert (out / sub / "notes").read_text() == sub
  assert sorted(os.listdir(out)) == [outputs.LOCK, "checkpoints",
                                     "metrics.jsonl", "summary.json", "tb"]


# ----------------------------------------------------------------------------
# Non-finite evaluations.


def test_a_non_finite_evaluation_stops_and_writes_strict_json(tmp_path):
  """--eval.alpha=1e30: training is finite, the held-out clients' adapted
  models are not; the run stops at the first evaluation, writes no NaN,
  and says which step size to lower and how."""
  config = _config(algorithm="fedavg", rounds=6, eval_every=3,
                   **{"eval.alpha": 1e30})
  with pytest.raises(training.NonFiniteError) as e:
    training.run(config, str(tmp_path), log=QUIET, checkpoint_every=0)
  message = str(e.value)
  assert message.startswith("round 3: non-finite evaluation")
  assert "--resume --eval.alpha=<smaller> --resume_changes=eval.alpha" in (
      message)
  text = open(tmp_path / "metrics.jsonl").read()
  assert "NaN" not in text and "Infinity" not in text
  assert not (tmp_path / "summary.json").exists()
  assert run_files.steps(tmp_path) == [3]
  # Resumed with a step size that works, round 3 is scored again.
  training.run(fields.replace(config, **{"eval.alpha": 0.03}),
               str(tmp_path), log=QUIET, checkpoint_every=0, resume=True,
               resume_changes=("eval.alpha",))
  assert [r["round"] for r in run_files.records(tmp_path)] == [3, 6]


# ----------------------------------------------------------------------------
# TensorBoard after kill -9.


def _event_steps(logdir):
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  acc = event_accumulator.EventAccumulator(str(logdir))
  acc.Reload()
  return {tag: [e.step for e in acc.Scalars(tag)]
          for tag in ("train/loss", "eval/accuracy")}


@pytest.mark.slow
def test_tensorboard_events_are_complete_after_kill_9_and_resume(
    tmp_path, compile_cache):
  out = str(tmp_path / "run")
  args = ["--augfl.lam=0", "--eval_every=2", "--checkpoint_every=3",
          f"--output_dir={out}"]
  proc = _start(compile_cache, "--rounds=5000", *args)
  try:
    _wait_for_round(proc, 8)
  finally:
    proc.kill()  # SIGKILL: no handler, no flush, no close
    proc.wait()
  # 3 or 6: the save of 6 may still be in flight
  saved = run_files.steps(out)[-1]
  # Up to the newest checkpoint the events are on disk already.
  before = _event_steps(os.path.join(out, "tb"))
  assert set(range(1, saved + 1)) <= set(before["train/loss"])
  rounds = saved + 4
  result = _cli(compile_cache, f"--rounds={rounds}", *args, "--resume")
  assert result.returncode == 0, result.stderr
  after = _event_steps(os.path.join(out, "tb"))
  assert after["train/loss"] == list(range(1, rounds + 1))  # each once
  assert after["eval/accuracy"] == [r for r in range(1, rounds + 1)
                                    if r % 2 == 0 or r == rounds]


# ----------------------------------------------------------------------------
# participants.


@pytest.mark.parametrize("participants,message", [
    ([0, 100], r"participants \[100\] are not client ids: the 32 clients"),
    ([-1, 2], r"participants \[-1\] are not client ids"),
    ([], "participants is empty"),
    ([3, 3, 5], r"participants \[3\] appear more than once"),
    ([[0, 1]], "must be a \\[K\\] array"),
    ([0.0, 1.0], "must be integer client ids"),
])
def test_bad_participants_are_refused_where_they_are_concrete(participants,
                                                              message):
  clients = tiny.client_data(num_clients=32)
  state = augfl.init_state(tiny.init(jax.random.key(0)), 32)
  round_fn = augfl.make_round(tiny.loss_fn, augfl.AugFLConfig(), "vmap")
  ids = jnp.asarray(participants)
  with pytest.raises(ValueError, match=message):
    round_fn(state, clients, participants=ids)
  with pytest.raises(ValueError, match=message):
    round_fn(state, clients, None, np.asarray(participants))  # positional
  fedavg_round = fedavg.make_round(tiny.loss_fn, fedavg.FedAvgConfig(),
                                  "vmap")  # every method's round
  with pytest.raises(ValueError, match=message):
    fedavg_round(fedavg.init_state(tiny.init(jax.random.key(0)),
                                   jax.random.key(1)), clients, ids)


@pytest.mark.parametrize("participants,message", [
    ([0, 100], r"participants \[100\] are not client ids: the 32 clients"),
    ([3, 3, 5], r"participants \[3\] appear more than once"),
])
def test_bad_participants_are_refused_where_a_run_draws_them(
    monkeypatch, tmp_path, participants, message):
  """The training path traces its round (the guard fuses it): the ids are
  checked as they are drawn, before the round runs."""
  monkeypatch.setattr(training.experiment, "sample_participants",
                      lambda *args: np.asarray(participants))
  with pytest.raises(ValueError, match=message):
    training.run(_config(algorithm="fedavg", rounds=1), str(tmp_path),
                 log=QUIET)
  assert not os.path.exists(tmp_path / "summary.json")


def test_good_participants_run_and_traced_ones_are_not_checked():
  clients = tiny.client_data(num_clients=32)
  state = augfl.init_state(tiny.init(jax.random.key(0)), 32)
  round_fn = augfl.make_round(tiny.loss_fn, augfl.AugFLConfig(), "vmap")
  new, metrics = round_fn(state, clients, participants=jnp.array([4, 0]))
  assert metrics["client_loss"].shape == (2,)
  np.testing.assert_array_equal(new.client_rounds[jnp.array([0, 4, 5])],
                                [1, 1, 0])
  round_fn(state, clients)  # everyone
  assert "lower" in dir(round_fn)  # still a jitted function to inspect
  # Inside another jit the ids are traced: documented, not checked.
  traced = jax.jit(lambda s, p: round_fn(s, clients, participants=p))
  _, metrics = traced(state, jnp.array([0, 100]))
  assert metrics["client_loss"].shape == (2,)


# ----------------------------------------------------------------------------
# Torn and empty files.


def test_write_json_atomic_keeps_the_old_file_when_a_write_fails(
    tmp_path, monkeypatch):
  """A write that fails half-way (a full disk at fsync) leaves the old
  file whole and no temporary behind; NaN is refused (strict JSON)."""
  path = str(tmp_path / "config.json")
  outputs.write_json_atomic(path, {"a": 1})
  with pytest.raises(ValueError):
    outputs.write_json_atomic(path, {"a": float("nan")})

  def full(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(outputs.os, "fsync", full)
  with pytest.raises(OSError):
    outputs.write_json_atomic(path, {"a": 2, "long": "x" * 10000})
  monkeypatch.undo()
  assert json.load(open(path)) == {"a": 1}
  assert os.listdir(tmp_path) == ["config.json"]  # no temporary left


def test_a_torn_metrics_line_is_restored_from_the_checkpoint(tmp_path):
  """A crash mid-write of the last record, whose round has a checkpoint:
  resume names the file and writes the record again from the checkpoint
  (metrics.jsonl alone cannot give it back)."""
  config = _config(rounds=4, eval_every=2)
  training.run(config, str(tmp_path), log=QUIET, checkpoint_every=2)
  whole = run_files.records(tmp_path)
  text = open(tmp_path / "metrics.jsonl").read()
  open(tmp_path / "metrics.jsonl", "w").write(text[:-25])
  lines = []
  training.run(fields.replace(config, rounds=6), str(tmp_path),
               log=lines.append, checkpoint_every=2, resume=True)
  assert any("metrics.jsonl: dropped its last line" in l for l in lines)
  records = run_files.records(tmp_path)
  assert [r["round"] for r in records] == [2, 4, 6]
  assert records[:2] == whole


@pytest.mark.slow
def test_an_empty_config_json_does_not_block_the_next_run(tmp_path):
  out = str(tmp_path / "run")
  config = _config(rounds=2, eval_every=1)
  training.run(config, out, log=QUIET, checkpoint_every=1)
  open(os.path.join(out, "config.json"), "w").close()  # a full disk
  # A plain rerun reads the configuration from the checkpoint instead: the
  # same run, finished, whose config.json is written again from it.
  before = json.load(open(os.path.join(out, "summary.json")))
  lines = []
  summary = training.run(config, out, log=lines.append)
  assert "config.json is empty or cut short" in lines[0]
  assert "config.json is not readable JSON" in lines[1]
  assert "written again from" in lines[1]
  assert json.load(open(os.path.join(out, "config.json")))["rounds"] == 2
  assert summary["rounds"] == 2
  assert summary["final_accuracy"] == before["final_accuracy"]
  lines = []
  training.run(config, out, log=lines.append)  # now as it sealed it
  assert "nothing to train" in lines[-1]
  with pytest.raises(training.OutputDirError,
                     match="holds a different run .*seed: 0 -> 1"):
    training.run(fields.replace(config, seed=1), out, log=QUIET)
  training.run(fields.replace(config, rounds=3), out, log=QUIET,
               resume=True)
  assert json.load(open(os.path.join(out, "config.json")))["rounds"] == 3
  # Without a checkpoint, it is ignored: the run starts again.
  other = str(tmp_path / "other")
  training.run(config, other, log=QUIET, checkpoint_every=1)
  for name in os.listdir(os.path.join(other, "checkpoints")):
    shutil.rmtree(os.path.join(other, "checkpoints", name))
  open(os.path.join(other, "config.json"), "w").write('{"algor')
  training.run(config, other, log=QUIET)
  assert [r["round"] for r in run_files.records(other)] == [1, 2]


def test_a_kill_during_the_first_save_leaves_clear_advice(tmp_path):
  """A run killed while saving its first checkpoint leaves orbax's
  temporary directory and no checkpoint: --resume says to run without
  it, and a plain rerun starts the run again (no advice loop)."""
  out = str(tmp_path / "run")
  config = _config(rounds=2, eval_every=1)
  training.run(config, out, log=QUIET, checkpoint_every=0)
  shutil.rmtree(os.path.join(out, "checkpoints"))
  os.makedirs(os.path.join(out, "checkpoints",
                           "step_2.orbax-checkpoint-tmp-1795000000",
                           "state"))
  os.remove(os.path.join(out, "summary.json"))
  with pytest.raises(ValueError, match="no checkpoint in .*; run without "
                     "--resume to start the run"):
    training.run(config, out, log=QUIET, resume=True)
  lines = []
  training.run(config, out, log=lines.append, checkpoint_every=0)
  assert any("without a checkpoint: starting it again" in l for l in lines)
  assert run_files.steps(out) == [2]


# ----------------------------------------------------------------------------
# Damaged checkpoints.


def _two_checkpoints(out):
  training.run(_config(rounds=4, eval_every=2), out, log=QUIET,
               checkpoint_every=2)
  assert run_files.steps(out) == [2, 4]


def _array_files(out, step):
  return sorted((f for f in glob.glob(os.path.join(
      out, "checkpoints", f"step_{step}", "state", "**"), recursive=True)
                 if os.path.isfile(f) and f"{os.sep}d{os.sep}" in f),
                key=os.path.getsize)


@pytest.mark.parametrize("damage", ["truncated", "bit_flip"])
def test_a_damaged_checkpoint_falls_back_and_the_run_goes_on(tmp_path,
                                                             damage):
  """Real damage to the newest checkpoint's array files: the run resumes
  from the one before, saying so, sets the damaged one aside and saves
  that round again."""
  out = str(tmp_path / "run")
  _two_checkpoints(out)
  files = _array_files(out, 4)
  if damage == "truncated":
    for f in files:
      os.truncate(f, os.path.getsize(f) // 2)
  else:
    with open(files[-1], "r+b") as f:
      f.seek(os.path.getsize(files[-1]) // 2)
      byte = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte[0] ^ 0x10]))
  lines = []
  training.run(_config(rounds=6, eval_every=2), out, log=lines.append,
               checkpoint_every=2, resume=True)
  text = "\n".join(lines)
  assert "step_4 is damaged (" in text
  assert "resuming from round 2" in text
  assert os.path.isdir(os.path.join(out, "checkpoints", "step_4.damaged"))
  assert run_files.steps(out) == [4, 6]
  assert [r["round"] for r in run_files.records(out)] == [2, 4, 6]


@pytest.mark.slow
def test_damaged_checkpoints_through_the_cli_print_no_tracebacks(
    tmp_path, compile_cache):
  """orbax gives up on a damaged step with an exception the run handles;
  TensorStore's callbacks then print one "Event loop is closed" traceback
  per array unless they are silenced. Every step damaged: one line."""
  out = str(tmp_path / "run")
  _two_checkpoints(out)
  for f in _array_files(out, 4):
    os.truncate(f, 0)
  args = ["--augfl.lam=0", "--rounds=6", "--eval_every=2",
          "--checkpoint_every=2", f"--output_dir={out}", "--resume"]
  result = _cli(compile_cache, *args)
  assert result.returncode == 0, result.stderr
  assert "Traceback" not in result.stderr and not result.stderr.strip()
  assert "step_4 is damaged" in result.stdout
  for step in (4, 6):
    for f in _array_files(out, step):
      os.truncate(f, 0)
  line = run_files.one_line(_cli(compile_cache, *args[:1], "--rounds=8",
                                 *args[2:]))
  assert "no checkpoint in" in line and "--overwrite" in line


# ----------------------------------------------------------------------------
# The file system: a file in the way, read-only, full.


def test_an_output_dir_that_is_a_file_is_one_line_before_loading(
    tmp_path, compile_cache):
  path = tmp_path / "file"
  path.write_text("mine")
  started = time.time()
  for out in (path, path / "below"):
    line = run_files.one_line(_cli(compile_cache, "--augfl.lam=0",
                                   f"--output_dir={out}"))
    assert line.startswith(f"error: --output_dir {out} cannot be written")
  assert path.read_text() == "mine"
  assert time.time() - started < 60  # no data, no model, no compilation


@pytest.mark.parametrize("error", [errno.EACCES, errno.EROFS, errno.ENOSPC])
def test_an_unwritable_output_dir_is_refused_before_loading(
    tmp_path, monkeypatch, error):
  """Root ignores permissions: the probe's failure is simulated."""
  def fail(*args, **kwargs):
    raise OSError(error, os.strerror(error))
  monkeypatch.setattr(outputs.tempfile, "NamedTemporaryFile", fail)
  _no_data_loaded(monkeypatch)
  with pytest.raises(training.OutputDirError) as e:
    training.run(_config(rounds=2), str(tmp_path / "out"), log=QUIET)
  assert str(e.value) == (f"--output_dir {tmp_path / 'out'} cannot be "
                          f"written: {os.strerror(error)}")


def test_a_write_error_during_the_run_is_one_line_naming_the_way_on(
    tmp_path, monkeypatch):
  out = str(tmp_path / "run")
  config = _config(rounds=4, eval_every=2)
  real_save = checkpoints.RunCheckpoints.save

  def full_at_round_4(self, step, state, meta):
    if step == 4:
      raise checkpoints.CheckpointError(
          f"saving a checkpoint in {self.directory} failed "
          "([Errno 28] No space left on device)")
    return real_save(self, step, state, meta)
  monkeypatch.setattr(checkpoints.RunCheckpoints, "save", full_at_round_4)
  with pytest.raises(training.OutputDirError) as e:
    training.run(config, out, log=QUIET, checkpoint_every=2)
  message = str(e.value)
  assert "\n" not in message and "No space left on device" in message
  assert message.endswith("the newest checkpoint is round 2 ("
                          f"{out}/checkpoints/step_2): make room (or fix "
                          "the directory) and continue with --resume")
  monkeypatch.undo()
  training.run(config, out, log=QUIET, checkpoint_every=2, resume=True)
  assert [r["round"] for r in run_files.records(out)] == [2, 4]


def _limit_file_size():
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_is_one_line_in_the_cli(
    tmp_path, compile_cache):
  """A real failure inside orbax's background save (files limited to 200
  kB, as a full disk would stop them): one line, exit 2, none of orbax's
  logs; the directory is then continued or restarted as usual."""
  out = str(tmp_path / "run")
  result = _cli(compile_cache, "--augfl.lam=0", "--rounds=4",
                "--eval_every=2", "--checkpoint_every=2",
                f"--output_dir={out}", "--nocompilation_cache",
                preexec_fn=_limit_file_size)
  line = run_files.one_line(result)
  assert re.match(rf"error: writing the run's files in {out} failed after "
                  r"round \d \(saving a checkpoint in .*\); no checkpoint "
                  r"was saved: make room \(or fix the directory\) and run "
                  "again$", line), line
  assert run_files.steps(out) == []
  training.run(_config(rounds=4, eval_every=2), out, log=QUIET,
               checkpoint_every=2)
  assert run_files.steps(out) == [2, 4]


# ----------------------------------------------------------------------------
# Flags: one line, exit 2, before anything is loaded.


@pytest.mark.parametrize("args,message", [
    (["--augfl.rho=inf"], "rho must be a finite number, got inf"),
    (["--augfl.lam=inf"], "lam must be a finite number, got inf"),
    (["--eval.alpha=inf"], "--eval.alpha must be a finite number, got inf"),
    (["--algorithm=fedavg", "--fedavg.lr=inf"],
     "--fedavg.lr must be a finite number, got inf"),
    (["--augfl.alpha=nan"], "alpha must be a finite number, got nan"),
    (["--data.server_size=-5"], "--data.server_size must be >= 0, got -5"),
    (["--clients_per_round=33"], "--clients_per_round=33 is more than the "
     "32 training clients"),
    (["--rounds=1.5"], "flag --rounds=1.5"),
    (["--augfl.rho=abc"], "flag --augfl.rho=abc"),
    (["--resume_changes=fedavg.lr"], "--resume_changes names step sizes a "
     "resumed run changes: it needs --resume"),
    (["--resume", "--resume_changes=seed"],
     "--resume_changes: seed is not a step size"),
])
def test_bad_flags_are_one_line_before_loading(tmp_path, compile_cache, args,
                                               message):
  out = tmp_path / "out"
  result = _cli(compile_cache, "--augfl.lam=0", "--rounds=2", *args,
                f"--output_dir={out}")
  line = run_files.one_line(result)
  assert message in line, line
  assert "dataset digits" not in result.stdout  # nothing loaded
  assert not out.exists()  # nothing written: the corrected run may start


def test_clients_per_round_is_checked_before_the_data_are_loaded(
    monkeypatch, tmp_path):
  _no_data_loaded(monkeypatch)
  with pytest.raises(ValueError, match="--clients_per_round=41 is more than "
                     "the 32 training clients"):
    training.run(_config(clients_per_round=41), str(tmp_path), log=QUIET)


def test_every_step_size_field_may_change_on_resume_when_named():
  config = training.RunConfig()
  names = {n for n, _, _, _ in fields.walk(config)}
  looks_like_one = {n for n in names
                    if re.fullmatch(r"(.*\.)?(lr|alpha|beta|\w+_lr|lr_\w+)",
                                    n) and not n.startswith("data.")}
  # The PM's lr shapes the PM (its checkpoint's key), not the run's steps;
  # AugFL's lambda, a weight, may change too, and with it its warm-up and
  # the bound on the server step it weighs.
  assert (looks_like_one - {"pm.lr"}) | {
      "augfl.lam", "augfl.lam_warmup", "augfl.reg_max_norm"} == set(
          training.resume_changes(config))


# ----------------------------------------------------------------------------
# Changing step sizes on resume, recorded.


@pytest.mark.slow
def test_step_sizes_change_on_resume_when_named_and_recorded(tmp_path):
  out = str(tmp_path)
  bad = _config(algorithm="fedavg", rounds=4, eval_every=2,
                **{"fedavg.lr": 1e30})
  with pytest.raises(training.NonFiniteError) as e:
    training.run(bad, out, log=QUIET, checkpoint_every=2)
  assert ("Continue it with --resume --fedavg.lr=<smaller> "
          "--resume_changes=fedavg.lr;") in str(e.value)
  good = fields.replace(bad, **{"fedavg.lr": 0.05})
  with pytest.raises(ValueError) as e:
    training.run(good, out, log=QUIET, resume=True)
  assert "fedavg.lr: 1e+30 -> 0.05" in str(e.value)
  assert str(e.value).endswith("add --resume_changes=fedavg.lr")
  with pytest.raises(ValueError, match=r"\(seed: 0 -> 1\); only conv_impl, "
                     "rounds, eval_every"):
    training.run(fields.replace(good, seed=1), out, log=QUIET, resume=True,
                 resume_changes=("fedavg.lr",))
  lines = []
  summary = training.run(good, out, log=lines.append, resume=True,
                         resume_changes=("fedavg.lr",), checkpoint_every=2)
  assert any("changed on resume from round 0" in l and
             "fedavg.lr 1e+30 -> 0.05" in l for l in lines)
  changes = [json.loads(l) for l in open(tmp_path / "changes.jsonl")]
  assert len(changes) == 1 and changes[0]["round"] == 0
  assert changes[0]["changes"] == {"fedavg.lr": [1e30, 0.05]}
  assert summary["resume_changes"] == changes
  assert json.load(open(tmp_path / "config.json"))["fedavg"]["lr"] == 0.05
  assert "changes.jsonl" in outputs.OutputDir(out).own_files()
  assert [r["round"] for r in run_files.records(out)] == [2, 4]
  # The same again: nothing changes, nothing more is recorded.
  training.run(fields.replace(good, rounds=6), out, log=QUIET, resume=True,
               resume_changes=("fedavg.lr",))
  assert len(open(tmp_path / "changes.jsonl").readlines()) == 1


# ----------------------------------------------------------------------------
# Signals before the first round.


def test_sigterm_while_the_command_starts_is_one_line(tmp_path,
                                                      compile_cache):
  proc = _start(compile_cache, "--augfl.lam=0",
                f"--output_dir={tmp_path / 'out'}")
  time.sleep(0.5)  # importing JAX (on a slow machine: loading the data)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 128 + signal.SIGTERM, err
  assert err.startswith("interrupted: SIGTERM ") and "Traceback" not in err
  assert "nothing was trained or saved" in err and "--resume" not in err
  assert not (tmp_path / "out").exists()


_SIGNAL_INSIDE_DEL = """
import os, signal
from experiments import run
signal.signal(signal.SIGTERM, run._stopped_while_starting)
class Dropped:
  def __del__(self):  # Python ignores what a __del__ raises
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # the handler runs here, inside __del__
      pass
Dropped()
print("went on")
"""


def test_a_starting_signal_inside_code_that_swallows_exceptions_still_ends():
  """A handler can run inside a __del__ or a gc callback (JAX's), where a
  SystemExit is printed and dropped: the command must end all the same."""
  result = subprocess.run([sys.executable, "-c", _SIGNAL_INSIDE_DEL],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 128 + signal.SIGTERM, result.stderr
  assert "went on" not in result.stdout
  assert result.stderr == ("interrupted: SIGTERM while the command was "
                           "starting: nothing was trained or saved\n")


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="the run takes signals in the main thread only")
def test_sigterm_before_the_first_round_says_nothing_was_saved(tmp_path):
  def signal_while_loading(fed):
    os.kill(os.getpid(), signal.SIGTERM)
    return fed
  with pytest.raises(training.RunInterrupted) as e:
    training.run(_config(rounds=2), str(tmp_path / "out"), log=QUIET,
                 transform_data=signal_while_loading)
  assert str(e.value) == ("SIGTERM before the first round: nothing was "
                          "trained or saved")
  assert e.value.checkpoint is None and e.value.signum == signal.SIGTERM
  assert not (tmp_path / "out").exists()  # it created it, left nothing


def test_an_interrupted_start_is_restarted_not_resumed():
  from experiments import run  # pylint: disable=g-import-not-at-top
  argv = ["run.py", "--rounds=9", "--overwrite"]
  assert run.resume_command(argv, resume=False) == (
      "python -m experiments.run --rounds=9")
  assert run.resume_command(argv) == (
      "python -m experiments.run --rounds=9 --resume")


# ----------------------------------------------------------------------------
# The library's inputs.


def _client_args():
  params = tiny.init(jax.random.key(0))
  batch = tiny.batch(np.random.default_rng(0), 6, 2)
  dual = jax.tree.map(jnp.zeros_like, params)
  return params, dual, batch


@pytest.mark.parametrize("rho", [0, 0.0, -1.0, float("nan"),
                                 np.float32(0.0)])
def test_client_update_refuses_a_rho_that_is_not_positive(rho):
  params, dual, batch = _client_args()
  with pytest.raises(ValueError, match="rho must be > 0"):
    augfl.client_update(tiny.loss_fn, params, dual, batch, batch, weight=1.0,
                        alpha=0.03, rho=rho, delta=0.01)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_client_update_refuses_16_bit_parameters(dtype):
  params, dual, batch = _client_args()
  half = jax.tree.map(lambda x: x.astype(dtype), params)
  with pytest.raises(ValueError, match=f"theta\\['b1'\\] is {jnp.dtype(dtype)}"
                     ": AugFL's client step needs float32"):
    augfl.client_update(tiny.loss_fn, half, jax.tree.map(jnp.zeros_like, half),
                        batch, batch, weight=1.0, alpha=0.03, rho=0.7,
                        delta=0.01)
  with pytest.raises(ValueError, match="dual must have theta's tree and "
                     "dtypes"):
    augfl.client_update(tiny.loss_fn, params, half, batch, batch, weight=1.0,
                        alpha=0.03, rho=0.7, delta=0.01)


@pytest.mark.parametrize("name", ["alpha", "rho", "lam", "delta_slope",
                                  "delta_offset"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"),
                                   float("-inf")])
def test_augfl_config_refuses_non_finite_values(name, value):
  with pytest.raises(ValueError, match=f"{name} must be a finite number"):
    augfl.AugFLConfig(**{name: value})


def test_labels_outside_the_classes_are_refused_where_data_are_built():
  dataset = data.load_dataset("digits", seed=0)
  partition = data.make_partition(dataset, seed=0)
  bad = dataclasses.replace(dataset, y=np.where(
      np.arange(dataset.num_examples) == 500, 12, dataset.y).astype(np.int32))
  with pytest.raises(ValueError, match=r"labels of dataset 'digits' must be "
                     r"integers in 0..9; got \[12\]"):
    data.build_federated(bad, partition)
  with pytest.raises(ValueError, match=r"got \[-1\]"):
    data.pad_stack(dataset.x, np.full_like(dataset.y, -1), [np.arange(3)],
                   num_classes=10)
  ok = data.pad_stack(dataset.x, dataset.y, [np.arange(3)], num_classes=10)
  assert ok["y"].shape == (1, 3)


def test_a_batch_without_mask_counts_every_row():
  """The documented rule: no mask, no padding (the plain mean of all
  rows); with a mask, the padded rows do not count."""
  model = models.create_model("mlp", 10, norm="none")
  params = models.init_params(model, jax.random.key(0), (8, 8, 1))
  loss_fn = models.make_loss_fn(model)
  x = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))
  y = jnp.array([1, 2, 3, 4])
  each = [float(loss_fn(params, {"x": x[i:i + 1], "y": y[i:i + 1]}))
          for i in range(4)]
  assert float(loss_fn(params, {"x": x, "y": y})) == pytest.approx(
      np.mean(each), rel=1e-5)
  masked = {"x": x, "y": y, "mask": jnp.array([1.0, 1.0, 0.0, 0.0])}
  assert float(loss_fn(params, masked)) == pytest.approx(np.mean(each[:2]),
                                                         rel=1e-5)
  assert "EVERY row counts" in models.make_loss_fn.__doc__
