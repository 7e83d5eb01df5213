"""Stopping and stopped runs say what was kept: a signal during PM
pretraining stops it at its next step, keeping a checkpoint that the same
run continues from, a second Ctrl-C ends the command even inside a long XLA
call, two runs needing the same new PM pretrain it once, and a round made
non-finite by a huge lam names lam, which a resume may then change.
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

from augfl_jax import data, models, training
from augfl_jax.core import fields
from augfl_jax.storage import locks
from augfl_jax.pm import pretrain, store
from tests import fake_pm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = lambda s: None  # noqa: E731

pytestmark = pytest.mark.usefixtures("compile_cache")

MAIN_THREAD = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="the run takes signals in the main thread only")


def _pm_config(path, **changes):
  """A digits run whose PM is an mlp at ``path`` under the l2
  regulariser."""
  return fields.replace(training.RunConfig(), **{
      "augfl.lam": 1.0, "regularizer": "l2", "pm.model": "mlp",
      "pm.dir": str(path), "eval.test_split": "off", **changes})


def _signal_at(prefix, lines):
  """A log that keeps its lines and sends SIGTERM at the first starting
  with ``prefix``."""
  def log(line):
    lines.append(line)
    if line.startswith(prefix) and not any(
        l.startswith(prefix) for l in lines[:-1]):
      os.kill(os.getpid(), signal.SIGTERM)
  return log


@pytest.mark.slow
@MAIN_THREAD
def test_a_signal_during_pm_pretraining_stops_it_and_says_what_was_kept(
    tmp_path):
  path = tmp_path / "pm"
  config = _pm_config(path, **{"pm.epochs": 3, "rounds": 2})
  lines = []
  with pytest.raises(training.RunInterrupted) as e:
    training.run(config, str(tmp_path / "run"), log=_signal_at("no PM at",
                                                              lines))
  assert str(e.value) == (
      "SIGTERM: PM pretraining stopped at epoch 1/3, step 1/6; its "
      f"checkpoint (epoch 1, step 1) is kept in {path}.pretraining; the same "
      "command continues it; no round was trained")
  assert e.value.checkpoint is None and not path.exists()
  # The same run continues the pretraining; once the PM is saved, the stop
  # before the first round keeps it.
  lines = []
  with pytest.raises(training.RunInterrupted) as e:
    training.run(config, str(tmp_path / "run"),
                 log=_signal_at("saved the PM to", lines))
  assert ("continuing PM pretraining from epoch 1/3, step 1/6 "
          f"({path}.pretraining)") in lines
  assert str(e.value) == ("SIGTERM before the first round: nothing was "
                          f"trained; the PM it pretrained is saved in {path} "
                          "and is reused")
  assert not any(l.startswith("round") for l in lines)
  assert store.load_pm(str(path), {})[1]["epochs"] == 3


def _digits_server():
  fed = data.load_federated("digits", seed=0, server_size=400)
  return fed.server


def test_a_pm_another_process_pretrains_is_awaited_then_reused(tmp_path):
  """The lock beside the PM's directory is held, as by another process
  pretraining it: this one waits, saying so once, then reuses the PM the
  other saved, without pretraining one of its own."""
  path = str(tmp_path / "pm")
  module = models.create_model("mlp", 10, norm="group")
  fd, _ = locks.try_lock(str(tmp_path / ".pm.lock"))
  lines = []

  def log(line):
    lines.append(line)
    if line.startswith("waiting for process"):  # the other one finishes
      fake_pm.save(path, module, "mlp")
      os.close(fd)

  kwargs = dict(model=module, model_name="mlp", dataset_name="digits",
                server=_digits_server(), server_size=400, split_seed=0,
                config=pretrain.PretrainConfig(model="mlp", epochs=30),
                input_shape=(8, 8, 1))
  store.get_or_pretrain_pm(path, log=log, **kwargs)
  assert lines[0] == (f"waiting for process {os.getpid()}, which is "
                      f"pretraining the PM at {path}, to reuse it")
  assert lines[1].startswith(f"reusing the PM at {path}") and len(lines) == 2
  # A stop asked for while waiting ends the wait.
  fd, _ = locks.try_lock(str(tmp_path / ".other.lock"))
  with pytest.raises(pretrain.Stopped, match="while waiting for process"):
    store.get_or_pretrain_pm(str(tmp_path / "other"), log=QUIET,
                          should_stop=lambda: True, **kwargs)
  os.close(fd)


@pytest.mark.slow
def test_a_huge_lam_is_named_in_the_advice_and_may_change_on_resume(
    tmp_path):
  """lam 1e30 against a PM far from the model: the first round is
  non-finite; the advice names lam, and the resume that lowers it runs."""
  path = str(tmp_path / "pm")
  module = models.create_model("mlp", 10, norm="group")
  shapes = jax.eval_shape(
      lambda: models.init_params(module, jax.random.key(0), (8, 8, 1)))
  fake_pm.save(path, module, "mlp", params=jax.tree.map(
      lambda s: np.full(s.shape, 1e15, s.dtype), shapes))
  out = str(tmp_path / "run")
  config = _pm_config(path, **{"augfl.lam": 1e30, "rounds": 1,
                               "eval_every": 1})
  with pytest.raises(training.NonFiniteError) as e:
    training.run(config, out, log=QUIET)
  assert ("--augfl.alpha=<smaller> --augfl.lam=<smaller> "
          "--augfl.reg_max_norm=<smaller> "
          "--resume_changes=augfl.alpha,augfl.lam,augfl.reg_max_norm"
          ) in str(e.value)
  lower = fields.replace(config, **{"augfl.lam": 1e-15})
  with pytest.raises(ValueError, match=r"augfl.lam: 1e\+30 -> 1e-15\); to "
                     "continue with these values, add "
                     "--resume_changes=augfl.lam"):
    training.run(lower, out, log=QUIET, resume=True)
  with pytest.raises(ValueError, match="lam may change on resume, but not "
                     "to or from 0"):
    training.run(fields.replace(config, **{"augfl.lam": 0.0}), out,
                 log=QUIET, resume=True, resume_changes=("augfl.lam",))
  summary = training.run(lower, out, log=QUIET, resume=True,
                         resume_changes=("augfl.lam",))
  assert summary["resume_changes"][0]["changes"] == {
      "augfl.lam": [1e30, 1e-15]}


@pytest.mark.slow
def test_a_second_ctrl_c_ends_the_command_inside_a_long_xla_call(tmp_path):
  """The first Ctrl-C waits for the round, which here scores 1,000
  test-split clients with 10,000 adaptation steps each (minutes of XLA
  calls); the second ends the process at once, and --resume reads what
  it left."""
  out = tmp_path / "run"
  args = ["--augfl.lam=0", "--rounds=1", "--eval.steps=10000", "--model=cnn",
          f"--output_dir={out}", "--nocompilation_cache"]
  proc = subprocess.Popen([sys.executable, "-m", "experiments.run", *args],
                          cwd=ROOT, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
  for line in proc.stdout:
    if "compiling the round" in line:
      break
  time.sleep(15)  # well inside the evaluation's calls
  proc.send_signal(signal.SIGINT)
  time.sleep(1)
  proc.send_signal(signal.SIGINT)
  start = time.monotonic()
  try:
    proc.wait(timeout=30)
  finally:
    proc.kill()
  stderr = proc.stderr.read()
  assert time.monotonic() - start < 30
  assert proc.returncode == 130, stderr
  assert "interrupted at once (a second signal)" in stderr
  result = subprocess.run(
      [sys.executable, "-m", "experiments.run", *args[:2], "--eval.steps=1",
       f"--output_dir={out}", "--overwrite"], cwd=ROOT, capture_output=True,
      text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert json.load(open(out / "summary.json"))["rounds"] == 1


def test_a_non_finite_stop_names_a_handful_of_clients_and_leaves():
  """32 clients and 6 leaves non-finite: three of each by name, then how
  many others, and each non-finite value once."""
  from augfl_jax.training import guard  # pylint: disable=g-import-not-at-top
  bad = np.ones(32, bool)
  state_flags = {f"layer{i}": {"kernel": bad} for i in range(6)}
  loss = np.full(32, np.nan)
  loss[7] = np.inf
  sentence = guard.describe(
      (state_flags, {"client_loss": bad, "loss": np.array(True)}), None,
      {"client_loss": loss, "loss": np.nan})
  assert sentence == (
      "client_loss of training clients 0, 1, 2 and 29 others (nan, inf); "
      "loss = nan; parameters/state ['layer0']['kernel'], "
      "['layer1']['kernel'], ['layer2']['kernel'] and 3 others (rows of "
      "training clients 0, 1, 2 and 29 others)")
  one = guard.describe(({"w": bad[:4] & (np.arange(4) == 2)},
                         {"client_loss": np.arange(4) == 2}),
                        np.array([5, 9, 11, 20]),
                        {"client_loss": np.array([0.1, 0.2, np.nan, 0.3])})
  assert one == ("client_loss of training client 11 (nan); parameters/state "
                 "['w'] (rows of training client 2)")
