"""An interrupted PM pretraining continues from its checkpoint to the PM an
uninterrupted one gives, bit for bit: stopped (the stop a signal asks for),
crashed between two checkpoints, with its newest checkpoint damaged, and
through the command killed with SIGKILL or stopped with Ctrl-C; a checkpoint
of another pretraining is refused."""

import glob
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from augfl_jax import data, models
from augfl_jax.pm import pretrain as pt
from augfl_jax.pm import store
from augfl_jax.storage import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 200 server examples, 20 held out: 3 steps of 64 an epoch, 9 in all. A
# batch-norm mlp, so that its running statistics are continued too.
CONFIG = pt.PretrainConfig(model="mlp", epochs=3)


@pytest.fixture(scope="module")
def server():
  dataset = data.load_dataset("digits")
  idx, _ = data.server_split(dataset.num_examples, 200)
  return {"x": dataset.x[idx], "y": dataset.y[idx]}


def _model(hidden=(16,)):
  return models.create_model("mlp", 10, hidden=hidden, norm="batch")


def _pretrain(path, server, *, stop_at=None, crash_at=None, config=CONFIG,
              model=None, lines=None):
  """``store.pretrain_and_save`` into ``path``; ``stop_at``: the stop is asked
  for after that many steps of this call, ``crash_at``: the process
  "dies" there (an exception, no checkpoint saved: what kill -9 leaves)."""
  calls = []

  def should_stop():
    calls.append(1)
    if len(calls) == crash_at:
      raise RuntimeError("crash")
    return len(calls) == stop_at

  return store.pretrain_and_save(
      str(path), model=model or _model(), model_name="mlp",
      dataset_name="digits", server=server, server_size=200, split_seed=0,
      config=config, log=(lines if lines is not None else []).append,
      should_stop=should_stop)


def _assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def straight(server, tmp_path_factory):
  """The PM pretrained without interruption, and its metadata."""
  return _pretrain(tmp_path_factory.mktemp("straight") / "pm", server)


def test_a_stopped_pretraining_continues_to_the_uninterrupted_pm(
    tmp_path, server, straight):
  path = tmp_path / "pm"
  kept = f"{path}.pretraining"
  with pytest.raises(pt.Stopped) as e:  # in the middle of epoch 2
    _pretrain(path, server, stop_at=4)
  assert str(e.value) == (
      "PM pretraining stopped at epoch 2/3, step 1/3; its checkpoint "
      f"(epoch 2, step 1) is kept in {kept}; the same command continues it")
  assert not path.exists()
  assert sorted(os.listdir(kept)) == ["step_3", "step_4"]  # epoch 1, stop
  lines = []
  with pytest.raises(pt.Stopped) as e:  # at the end of epoch 2
    _pretrain(path, server, stop_at=2, lines=lines)
  assert lines[0] == ("continuing PM pretraining from epoch 2/3, step 1/3 "
                      f"({kept})")
  assert str(e.value) == (
      "PM pretraining stopped at epoch 2/3; its checkpoint (epoch 2) is "
      f"kept in {kept}; the same command continues it")
  assert sorted(os.listdir(kept)) == ["step_4", "step_6"]
  lines = []
  variables, meta = _pretrain(path, server, lines=lines)
  assert lines[0] == f"continuing PM pretraining from epoch 2/3 ({kept})"
  assert lines[-1].startswith(f"saved the PM to {path}")
  assert not os.path.exists(kept)  # removed once the PM is saved
  _assert_same(variables, straight[0])
  _assert_same(store.load_pm(str(path), {})[0], straight[0])
  for key in ("train_loss", "train_accuracy", "heldout_accuracy",
              "heldout_accuracy_running", "epochs"):
    assert meta[key] == straight[1][key], key
  # ... which is the PM of pretraining without checkpoints at all.
  _assert_same(pt.pretrain(_model(), server, CONFIG)[0], straight[0])


def test_a_crash_between_checkpoints_continues_from_the_last_one(
    tmp_path, server, straight):
  """Every 7 steps, and a crash after step 8: step 7 is kept, and the
  pretraining goes on from there, in its last epoch, whose running loss
  it continues too (another checkpoint interval is the same
  pretraining)."""
  path = tmp_path / "pm"
  every_7 = pt.PretrainConfig(model="mlp", epochs=3, checkpoint_every_steps=7)
  with pytest.raises(RuntimeError, match="crash"):
    _pretrain(path, server, crash_at=8, config=every_7)
  assert os.listdir(f"{path}.pretraining") == ["step_7"]
  lines = []
  variables, meta = _pretrain(path, server, lines=lines)
  assert lines[0] == ("continuing PM pretraining from epoch 3/3, step 1/3 "
                      f"({path}.pretraining)")
  _assert_same(variables, straight[0])
  assert meta["train_loss"] == straight[1]["train_loss"]
  assert meta["train_accuracy"] == straight[1]["train_accuracy"]


def _array_files(step_dir):
  return [f for f in glob.glob(os.path.join(step_dir, "state", "**"),
                               recursive=True)
          if os.path.isfile(f) and f"{os.sep}d{os.sep}" in f]


def test_a_damaged_checkpoint_is_set_aside_and_the_one_before_used(
    tmp_path, server, straight):
  path = tmp_path / "pm"
  kept = f"{path}.pretraining"
  with pytest.raises(pt.Stopped):
    _pretrain(path, server, stop_at=4)
  for f in _array_files(os.path.join(kept, "step_4")):
    os.truncate(f, os.path.getsize(f) // 2)
  lines = []
  with pytest.raises(pt.Stopped):
    _pretrain(path, server, stop_at=4, lines=lines)
  assert lines[0].startswith(
      f"the PM pretraining checkpoint {kept}/step_4 is damaged (")
  assert lines[0].endswith(f"); set aside as {kept}/step_4.damaged, trying "
                           "the one before it")
  assert lines[1] == f"continuing PM pretraining from epoch 1/3 ({kept})"
  assert sorted(os.listdir(kept)) == ["step_4.damaged", "step_6", "step_7"]
  # Both damaged: from the beginning, saying so.
  for step in (6, 7):
    for f in _array_files(os.path.join(kept, f"step_{step}")):
      os.truncate(f, 0)
  lines = []
  variables, _ = _pretrain(path, server, lines=lines)
  assert lines[0].endswith("trying the one before it")
  assert lines[1].endswith(f"set aside as {kept}/step_6.damaged, "
                           "pretraining from the beginning")
  assert not any(l.startswith("continuing") for l in lines)
  _assert_same(variables, straight[0])
  assert not os.path.exists(kept)


@pytest.mark.parametrize("change,message", [
    (dict(config=pt.PretrainConfig(model="mlp", epochs=4)), "epochs=3"),
    (dict(config=pt.PretrainConfig(model="mlp", epochs=3, seed=1)),
     "seed=0"),
    (dict(model=_model(hidden=(8,))), "hidden=[16]"),
    (dict(labels=True), "on other server data"),
])
def test_a_checkpoint_of_another_pretraining_is_refused(
    tmp_path, server, change, message):
  """Other epochs, seed, architecture or server data: one line naming
  what differs; the checkpoint is left as it was."""
  path = tmp_path / "pm"
  with pytest.raises(pt.Stopped):
    _pretrain(path, server, stop_at=2)
  if change.pop("labels", False):
    server = {**server, "y": np.roll(server["y"], 1)}
  with pytest.raises(store.PMCheckpointMismatch) as e:
    _pretrain(path, server, **change)
  text = str(e.value)
  assert text.startswith("the PM pretraining checkpoint at "
                         f"{path}.pretraining/step_2 ")
  assert message in text and "\n" not in text
  assert text.endswith(f"remove {path}.pretraining to pretrain from the "
                       "beginning, or pass another --pm.dir")
  assert os.listdir(f"{path}.pretraining") == ["step_2"]
  assert not path.exists()


# ----------------------------------------------------------------------------
# The command.

# experiments.pretrain_pm, its checkpoint saves wrapped: after saving step
# AT it prints so, then ACTION (sleep: to be killed; SIGINT to itself).
_WRAPPER = """
import os, runpy, signal, sys, time
from augfl_jax.pm import checkpoints
save = checkpoints.PretrainingCheckpoints.save
def wrapped(self, state, *, steps_done, seconds):
  save(self, state, steps_done=steps_done, seconds=seconds)
  if steps_done == {at}:
    print("saved step", steps_done, flush=True)
    {action}
checkpoints.PretrainingCheckpoints.save = wrapped
sys.argv = ["pretrain_pm"] + sys.argv[1:]
runpy.run_module("experiments.pretrain_pm", run_name="__main__")
"""

_ARGS = ["--pm.model=mlp", '--pm.kwargs={"hidden": [16]}', "--pm.epochs=3",
         "--data.server_size=200"]


def _command(pm_dir, at=None, action=None):
  code = (["-c", _WRAPPER.format(at=at, action=action)] if at else
          ["-m", "experiments.pretrain_pm"])
  return subprocess.Popen(
      [sys.executable, *code, *_ARGS, f"--pm.dir={pm_dir}"], cwd=ROOT,
      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.slow
def test_the_command_continues_after_ctrl_c_and_kill_9(tmp_path):
  """Ctrl-C after step 3 stops at step 4, keeping it; the same command,
  killed with SIGKILL after saving step 6, then once more to the end: the
  PM of the command run once."""
  straight, path = str(tmp_path / "straight"), str(tmp_path / "pm")
  kept = f"{path}.pretraining"
  proc = _command(straight)
  assert proc.wait(timeout=300) == 0, proc.stderr.read()
  proc = _command(path, 3, "os.kill(os.getpid(), signal.SIGINT)")
  assert proc.wait(timeout=300) == 130
  assert proc.stderr.read().strip().splitlines()[-1] == (
      "interrupted: SIGINT: PM pretraining stopped at epoch 2/3, step 1/3; "
      f"its checkpoint (epoch 2, step 1) is kept in {kept}; the same "
      "command continues it")
  proc = _command(path, 6, "time.sleep(300)")
  try:
    lines = []
    for line in proc.stdout:
      lines.append(line.rstrip("\n"))
      if line.startswith("saved step 6"):
        break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    proc.kill()
  assert (f"continuing PM pretraining from epoch 2/3, step 1/3 ({kept})"
          in lines)
  assert sorted(os.listdir(kept)) == ["step_4", "step_6"]
  proc = _command(path)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  assert f"continuing PM pretraining from epoch 2/3 ({kept})" in out
  assert f"PM saved to {path}" in out and not os.path.exists(kept)
  _assert_same(checkpoint.restore(path)[0], checkpoint.restore(straight)[0])
