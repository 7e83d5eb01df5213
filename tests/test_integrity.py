"""Nothing read back is taken on trust: checkpoint metadata and PMs carry
checksums, a resumed run reads the data it started with, and the run's
directory, manifest, data directory and disk are checked before any work.

The replay of cases that once went through silently: an edited accuracy in
a checkpoint's metadata, a PM with a flipped bit, a resume on relabelled
data, an emptied manifest, both checkpoints damaged, a data directory that
does not exist, a full disk at start, a run into a PM's directory.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax.storage import checkpoint
from augfl_jax import data, models, training
from augfl_jax.core import fields
from augfl_jax.pm import store
from augfl_jax.training import checkpoints as run_checkpoints
from augfl_jax.training import experiment, outputs, pm_roles
from tests import fake_pm, run_files

QUIET = lambda s: None  # noqa: E731

pytestmark = pytest.mark.usefixtures("compile_cache")


def _config(**changes):
  return fields.replace(training.RunConfig(), **{
      "augfl.lam": 0.0, "eval.test_split": "off", **changes})


def _array_files(root):
  """The array files of the checkpoint under ``root``, smallest first."""
  return sorted((f for f in glob.glob(os.path.join(root, "**"),
                                      recursive=True)
                 if os.path.isfile(f) and f"{os.sep}d{os.sep}" in f),
                key=os.path.getsize)


def _flip_a_bit(path):
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x10]))


def _mlp_pm(path):
  """An mlp PM for digits (GroupNorm, the digits runs' norm)."""
  return fake_pm.save(str(path), models.create_model("mlp", 10, norm="group"),
                      "mlp")


# ----------------------------------------------------------------------------
# Checkpoint metadata and PMs carry checksums.


@pytest.mark.slow
def test_an_edited_accuracy_in_checkpoint_metadata_is_caught(tmp_path):
  """One digit of a record edited in the newest checkpoint's metadata: the
  resume falls back to the one before, saying why, and writes the record
  again as the run computed it."""
  out = str(tmp_path / "run")
  config = _config(rounds=4, eval_every=2)
  training.run(config, out, log=QUIET, checkpoint_every=2)
  whole = run_files.records(out)
  path = os.path.join(out, "checkpoints", "step_4", "meta", "metadata")
  text = open(path).read()
  accuracy = json.dumps(whole[-1]["accuracy"])
  edited = accuracy[:-1] + str((int(accuracy[-1]) + 1) % 10)
  assert text.count(accuracy) == 1
  open(path, "w").write(text.replace(accuracy, edited))
  lines = []
  training.run(fields.replace(config, rounds=6), out, log=lines.append,
               checkpoint_every=2, resume=True)
  damaged = [l for l in lines if "step_4 is damaged" in l]
  assert len(damaged) == 1 and "the metadata of step 4 does not match its " \
      "checksum" in damaged[0]
  assert any("resuming from round 2" in l for l in lines)
  key = lambda r: (r["round"], r["accuracy"], r["mean_train_loss"])
  assert ([key(r) for r in run_files.records(out)[:2]] ==
          [key(r) for r in whole])
  summary = json.load(open(os.path.join(out, "summary.json")))
  assert summary["best_accuracy"] == max(r["accuracy"]
                                         for r in run_files.records(out))


def test_a_pm_with_a_flipped_bit_or_an_edited_record_is_refused(tmp_path):
  path = _mlp_pm(tmp_path / "pm")
  store.load_pm(path, {})  # reads back whole
  assert checkpoint.has_checksums(path)
  _flip_a_bit(_array_files(os.path.join(path, "state"))[-1])
  with pytest.raises(checkpoint.DamagedCheckpointError,
                     match=r"the PM is damaged \(checksum mismatch in "
                     rf"\['params'\].*\): remove {path} to pretrain it "
                     "again, or pass another --pm.dir"):
    store.load_pm(path, {})
  # The run that passes it with --pm.dir stops before any round.
  config = _config(**{"augfl.lam": 1.0, "regularizer": "l2",
                      "pm.model": "mlp", "pm.dir": path, "rounds": 1})
  with pytest.raises(checkpoint.DamagedCheckpointError,
                     match="the PM is damaged"):
    training.run(config, str(tmp_path / "run"), log=QUIET)
  assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")

  other = _mlp_pm(tmp_path / "other")
  meta = os.path.join(other, "metadata", "metadata")
  text = open(meta).read()
  open(meta, "w").write(text.replace('"server_size": 400',
                                     '"server_size": 401'))
  with pytest.raises(checkpoint.DamagedCheckpointError,
                     match="the metadata of the checkpoint at .* does not "
                     "match its checksum"):
    store.load_pm(other, {})


def test_a_checkpoint_saved_without_checksums_reads_back_unverified(
    tmp_path):
  """A PM saved before the checksums were kept is reused, and the log says
  it is not verified."""
  path = _mlp_pm(tmp_path / "pm")
  meta = os.path.join(path, "metadata", "metadata")
  saved = json.load(open(meta))
  del saved[checkpoint.CHECKSUMS], saved[checkpoint.SEAL]
  json.dump(saved, open(meta, "w"))
  assert not checkpoint.has_checksums(path)
  lines = []
  config = _config(**{"augfl.lam": 1.0, "regularizer": "l2",
                      "pm.model": "mlp", "pm.dir": path})
  fed = experiment.load_federated(training.prepare(config))
  pm_roles.load_pm(training.validate(config), fed, lines.append)
  assert any("not verified" in l for l in lines)


# ----------------------------------------------------------------------------
# A resumed run reads the data it started with.


@pytest.mark.slow
def test_resume_refuses_data_other_than_the_run_started_with(tmp_path):
  out = str(tmp_path / "run")
  config = _config(rounds=2, eval_every=1)
  training.run(config, out, log=QUIET, checkpoint_every=1)

  def relabel(fed):
    support = fed.train.support
    return dataclasses.replace(fed, train=dataclasses.replace(
        fed.train, support={**support, "y": (support["y"] + 1) % 10}))

  with pytest.raises(ValueError, match=r"--resume: the data differ from "
                     r"those the run of .*step_2 started with \(digest "):
    training.run(fields.replace(config, rounds=3), out, log=QUIET,
                 resume=True, transform_data=relabel)
  training.run(fields.replace(config, rounds=3), out, log=QUIET,
               resume=True)
  assert [r["round"] for r in run_files.records(out)] == [1, 2, 3]


# ----------------------------------------------------------------------------
# Damaged checkpoints and manifests, directories of other files.


def test_both_checkpoints_damaged_say_to_start_again_not_to_resume(
    tmp_path):
  out = str(tmp_path / "run")
  config = _config(rounds=4, eval_every=2)
  training.run(config, out, log=QUIET, checkpoint_every=2)
  for step in (2, 4):
    for f in _array_files(os.path.join(out, "checkpoints", f"step_{step}")):
      os.truncate(f, 0)
  with pytest.raises(ValueError) as e:
    training.run(fields.replace(config, rounds=6), out, log=QUIET,
                 checkpoint_every=2, resume=True)
  message = str(e.value)
  assert message.startswith(f"no checkpoint in {out}/checkpoints reads "
                            "back whole (step 4: "), message
  assert message.endswith("pass --overwrite to start the run again")
  assert "continue with --resume" not in message and "\n" not in message


def _cut_short(path):
  """Truncates the file ``path`` to a third of its size."""
  os.truncate(path, os.path.getsize(path) // 3)


@pytest.mark.parametrize("cut", ["an array", "the metadata"])
def test_a_cut_short_file_is_named_and_its_checkpoint_set_aside(tmp_path,
                                                                cut):
  """An array file, or the metadata, of the newest checkpoint cut short:
  the resume names the file (an array's: its array and directory) in one
  line, without TensorStore's internals, sets the step aside and resumes
  from the one before."""
  out = str(tmp_path / "run")
  config = _config(rounds=4, eval_every=2)
  training.run(config, out, log=QUIET, checkpoint_every=2)
  step_4 = os.path.join(out, "checkpoints", "step_4")
  if cut == "an array":
    _cut_short(_array_files(step_4)[-1])
    what = (rf"the file of array (\['\w+'\])+ under {re.escape(step_4)}/state "
            "is cut short")
  else:
    _cut_short(os.path.join(step_4, "meta", "metadata"))
    what = f"{re.escape(step_4)}/meta/metadata is cut short or corrupt"
  lines = []
  training.run(fields.replace(config, rounds=6), out, log=lines.append,
               checkpoint_every=2, resume=True)
  damaged = [l for l in lines if "is damaged" in l]
  assert len(damaged) == 1, lines
  assert re.fullmatch(
      rf"checkpoint {re.escape(step_4)} is damaged \({what}\); trying the "
      "one before it", damaged[0]), damaged[0]
  assert not any("TensorStore" in l or "pybind" in l for l in lines)
  assert any(l.startswith("resuming from round 2") for l in lines)
  assert os.path.isdir(step_4 + ".damaged")
  assert [r["round"] for r in run_files.records(out)] == [2, 4, 6]


@pytest.mark.slow
def test_resuming_past_a_cut_short_checkpoint_prints_no_library_internals(
    tmp_path, compile_cache):
  out = str(tmp_path / "run")
  command = [sys.executable, "-m", "experiments.run", "--dataset=digits",
             "--algorithm=fedavg", "--eval_every=2", "--checkpoint_every=2",
             f"--output_dir={out}"]
  env = {**os.environ, "XDG_CACHE_HOME": compile_cache}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run(command + ["--rounds=4"], cwd=root, env=env, check=True,
                 capture_output=True)
  for path in _array_files(os.path.join(out, "checkpoints", "step_4")):
    _cut_short(path)
  result = subprocess.run(command + ["--rounds=6", "--resume"], cwd=root,
                          env=env, capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert result.stderr == ""  # no "Exception ignored in: <coroutine ...>"
  damaged = [l for l in result.stdout.splitlines() if "is damaged" in l]
  assert len(damaged) == 1 and "is cut short); trying the one before it" \
      in damaged[0] and "TensorStore" not in result.stdout, damaged


def test_reads_orbax_abandons_leave_no_traceback(tmp_path, monkeypatch):
  """When orbax gives up on a checkpoint, each of its reads still in
  flight raises its error again as it is closed ("Exception ignored in:
  <coroutine ...>", dozens of lines each, after the one line that reports
  the damage): a run's checkpoints drop those, and only those."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  run_checkpoints.RunCheckpoints(str(tmp_path / "checkpoints"))

  async def read():
    pass

  orbax_dir = os.path.dirname(ocp.__file__)
  read.__code__ = read.__code__.replace(
      co_filename=os.path.join(orbax_dir, "_src", "serialization.py"))
  coroutine = read()
  try:
    for owner in (coroutine, "another object"):
      sys.unraisablehook(types.SimpleNamespace(
          exc_type=Exception, exc_value=Exception("Encountered error while "
                                                  "reading array index"),
          exc_traceback=None, err_msg=None, object=owner))
  finally:
    coroutine.close()
  assert [u.object for u in seen] == ["another object"]


@pytest.mark.parametrize("damage", ["an array", "the metadata", "the arrays"])
def test_a_damaged_pm_file_is_named_with_how_to_replace_it(tmp_path,
                                                           damage):
  path = _mlp_pm(tmp_path / "pm")
  like = jax.eval_shape(lambda: store.load_pm(path, {})[0])
  if damage == "an array":
    _cut_short(_array_files(os.path.join(path, "state"))[-1])
    what = (r"the file of array \['params'\]\['\w+'\]\['\w+'\] under "
            rf"{re.escape(path)}/state is cut short")
  elif damage == "the metadata":
    _cut_short(os.path.join(path, "metadata", "metadata"))
    what = f"{re.escape(path)}/metadata/metadata is cut short or corrupt"
  else:
    shutil.rmtree(os.path.join(path, "state"))
    what = "its directory state is missing"
  with pytest.raises(checkpoint.DamagedCheckpointError) as e:
    store.load_pm(path, {}, like=like)
  assert re.fullmatch(
      rf"the PM is damaged \(in the checkpoint at {re.escape(path)}, {what}\): "
      rf"remove {re.escape(path)} to pretrain it again, or pass another "
      "--pm.dir",
      str(e.value)), str(e.value)


def test_an_emptied_manifest_is_named_with_the_command_that_restores_it(
    tmp_path):
  out = str(tmp_path / "run")
  config = _config(rounds=2, eval_every=1)
  training.run(config, out, log=QUIET, checkpoint_every=1)
  manifest = os.path.join(out, outputs.MANIFEST)
  open(manifest, "w").close()
  with pytest.raises(training.OutputDirError) as e:
    training.run(fields.replace(config, rounds=3), out, log=QUIET,
                 resume=True)
  message = str(e.value)
  assert message.startswith(f"{manifest}, the list of the files augfl_jax "
                            f"wrote in {out}, is damaged"), message
  command = message.split("restore it with: ")[1].split("; else")[0]
  subprocess.run(command, shell=True, check=True)
  training.run(fields.replace(config, rounds=3), out, log=QUIET,
               resume=True)
  assert [r["round"] for r in run_files.records(out)] == [1, 2, 3]


def test_a_directory_holding_a_pm_is_refused_as_an_output_dir(tmp_path):
  path = _mlp_pm(tmp_path / "pm")
  before = sorted(os.listdir(path))
  with pytest.raises(training.OutputDirError,
                     match=r"holds .*metadata, state, which augfl_jax did "
                     "not write"):
    training.run(_config(algorithm="fedavg", rounds=1), path, log=QUIET)
  assert sorted(os.listdir(path)) == sorted(before + [outputs.LOCK])
  store.load_pm(path, {})  # untouched


def test_a_data_dir_that_does_not_exist_is_one_line(tmp_path):
  missing = str(tmp_path / "missing")
  for dataset in ("digits", "fashion_mnist"):
    with pytest.raises(data.DatasetUnavailableError,
                       match=f"^--data.data_dir {missing} is not a "
                       "directory on this machine$"):
      training.run(_config(dataset=dataset,
                           **{"data.data_dir": missing}),
                   str(tmp_path / "run"), log=QUIET)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("call", ["pwrite", "fsync"])
def test_a_full_disk_at_start_names_the_output_dir(tmp_path, monkeypatch,
                                                    call):
  """A full disk still lets empty files be created: writing the probe's
  byte or the lock's process id is what fails."""
  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(os, call, full)
  out = str(tmp_path / "run")
  with pytest.raises(training.OutputDirError) as e:
    training.run(_config(rounds=1), out, log=QUIET)
  assert str(e.value) == (f"--output_dir {out} cannot be written: No space "
                          "left on device")
  monkeypatch.undo()
  shutil.rmtree(out, ignore_errors=True)


_SAVE_ON_THE_SECOND_DEVICE = """
import sys
import jax, jax.numpy as jnp
from augfl_jax.storage import checkpoint
tree = {"w": jax.device_put(jnp.arange(6.0).reshape(2, 3), jax.devices()[1])}
checkpoint.save(sys.argv[1], tree, {"saved_on": str(jax.devices()[1])})
"""


def test_a_checkpoint_saved_on_other_devices_restores_here(tmp_path):
  # Saved where this process has no such device (as a GPU's checkpoint read
  # on a CPU): orbax refuses an abstract target without a sharding.
  path = str(tmp_path / "ck")
  subprocess.run(
      [sys.executable, "-c", _SAVE_ON_THE_SECOND_DEVICE, path], check=True,
      timeout=300, env={**os.environ,
                        "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
  like = {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32)}
  tree, metadata = checkpoint.restore(path, like)
  assert metadata == {"saved_on": "cpu:1"}
  np.testing.assert_array_equal(tree["w"], np.arange(6.0).reshape(2, 3))
  assert tree["w"].devices() == {jax.devices()[0]}
