"""The run's TensorBoard event files: read back by TensorBoard, written
without TensorFlow."""

import glob
import os
import subprocess
import sys

from augfl_jax.training.events import EventWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scalars(logdir):
  """``{tag: {step: value}}`` as TensorBoard's ``EventAccumulator`` reads
  the directory (a resumed session's ``SessionLog(START)`` drops the older
  events of its step and later)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(str(logdir))
  accumulator.Reload()
  return {tag: {e.step: e.value for e in accumulator.Scalars(tag)}
          for tag in accumulator.Tags()["scalars"]}


def test_scalars_read_back_and_a_resumed_session_replaces_later_steps(
    tmp_path):
  with EventWriter(str(tmp_path)) as first:
    for step in (1, 2, 3, 4):
      first.scalars({"loss": step / 4, "accuracy": 1 - step / 4}, step,
                    "train/")
  with EventWriter(str(tmp_path), resume_from=3) as resumed:
    for step in (3, 4, 5):
      resumed.scalars({"loss": step}, step, "train/")
  assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 2
  scalars = _scalars(tmp_path)
  assert scalars["train/loss"] == {1: 0.25, 2: 0.5, 3: 3.0, 4: 4.0, 5: 5.0}
  assert set(scalars["train/accuracy"]) == {1, 2}


def test_a_file_cut_short_keeps_its_whole_events(tmp_path):
  writer = EventWriter(str(tmp_path))
  for step in (1, 2, 3):
    writer.scalars({"loss": float(step)}, step)
  writer.flush()  # what a crash leaves: every event added, on disk
  (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
  assert _scalars(tmp_path)["loss"] == {1: 1.0, 2: 2.0, 3: 3.0}
  with open(path, "r+b") as f:  # the last event cut short
    f.truncate(os.path.getsize(path) - 5)
  assert _scalars(tmp_path)["loss"] == {1: 1.0, 2: 2.0}
  writer.close()


def test_writing_events_does_not_import_tensorflow(tmp_path):
  """TensorFlow is an extra (tfds copies only): a run that writes events
  neither needs nor imports it, where it is installed too."""
  code = ("import sys\n"
          "from augfl_jax.training.events import EventWriter\n"
          f"with EventWriter({str(tmp_path)!r}, resume_from=2) as w:\n"
          "  w.scalars({'a': 1.0}, 2)\n"
          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
          "('tensorflow', 'tensorflow_datasets', 'torch')))\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          check=True)
  assert result.stdout.strip() == "[]"
  err = result.stderr.lower()  # no notice of TensorFlow's (oneDNN, CPU)
  assert "tensorflow" not in err and "onednn" not in err, result.stderr
  assert _scalars(tmp_path)["a"] == {2: 1.0}
