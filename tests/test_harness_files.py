"""What sits around a run touches no file it should not (issue 33).

* A lock never follows a symbolic link, never writes a file with other hard
  links, a directory, a FIFO or a file that is not a lock file, and never
  cuts a file short; a run (and a PM's pretraining) whose lock path holds
  such a thing is refused in one line, exit 2, the file untouched.
* Building ``RunCheckpoints`` touches nothing: only ``training.run``,
  holding the run's lock, removes what unfinished saves left.
* A checkpoint's round is its sealed metadata's, not its directory's name:
  a renamed step is damaged, and the resume starts where the state was
  saved.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from augfl_jax import training
from augfl_jax.core import fields
from augfl_jax.storage import locks
from augfl_jax.training import checkpoints, outputs
from tests import run_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = lambda s: None  # noqa: E731
MINE = "a user's own file\n"

pytestmark = pytest.mark.usefixtures("compile_cache")


def _fedavg(**changes):
  return fields.replace(training.RunConfig(),
                        **{"algorithm": "fedavg", **changes})


def _cli(compile_cache, *args):
  env = {**os.environ, "XDG_CACHE_HOME": compile_cache,
         "PYTHONUNBUFFERED": "1"}
  return subprocess.run([sys.executable, "-m", "experiments.run", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)


# ----------------------------------------------------------------------------
# Locks.


def test_a_lock_never_follows_a_symbolic_link(tmp_path):
  target = tmp_path / "mine.txt"
  target.write_text(MINE)
  lock = tmp_path / "run" / ".augfl_jax.lock"
  lock.parent.mkdir()
  lock.symlink_to(target)
  with pytest.raises(locks.LockFileError) as e:
    locks.try_lock(str(lock))
  assert str(e.value) == (
      f"the lock file {lock} is a symbolic link, which a lock never "
      "follows; it was left untouched: remove it or choose another "
      "directory")
  assert target.read_text() == MINE and os.path.islink(lock)
  # A link to nothing creates nothing.
  lock.unlink()
  lock.symlink_to(tmp_path / "absent")
  with pytest.raises(locks.LockFileError, match="is a symbolic link"):
    locks.try_lock(str(lock))
  assert not os.path.exists(tmp_path / "absent")
  # locks.hold (the PM's lock) refuses it too, without waiting.
  with pytest.raises(locks.LockFileError, match="is a symbolic link"):
    with locks.hold(str(lock), on_busy=pytest.fail):
      pass


def test_a_lock_refuses_what_is_not_its_own_file(tmp_path):
  """A second name of a user's file, a directory, a FIFO, a large file and
  one that holds text: each refused in one line, left as it was."""
  target = tmp_path / "mine.txt"
  target.write_text("12345\n")  # reads as a lock file, but has two names
  linked = tmp_path / "linked.lock"
  os.link(target, linked)
  with pytest.raises(locks.LockFileError,
                     match=f"^the lock file {linked} has 2 hard links"):
    locks.try_lock(str(linked))
  assert target.read_text() == "12345\n"
  directory = tmp_path / "dir.lock"
  directory.mkdir()
  fifo = tmp_path / "fifo.lock"
  os.mkfifo(fifo)  # opening it for writing would block: it must not
  big = tmp_path / "big.lock"
  big.write_text("1" * 100)
  text = tmp_path / "text.lock"
  text.write_text("notes\n")
  for path, what in ((directory, "is not a regular file"),
                     (fifo, "is not a regular file"),
                     (big, "holds 100 bytes, not a process id"),
                     (text, "holds something other than a process id")):
    with pytest.raises(OSError) as e:
      locks.try_lock(str(path))
    assert str(e.value).startswith(f"the lock file {path} {what};"), e.value
    assert "\n" not in str(e.value)
  assert big.read_text() == "1" * 100 and text.read_text() == "notes\n"
  assert os.listdir(directory) == []


def test_a_lock_left_by_a_run_is_taken_without_cutting_it(tmp_path):
  """A lock file an earlier run left is taken, the id written over the old
  one padded to its length; a new one is created; the holder is named; the
  kernel drops the lock of a killed holder."""
  old = tmp_path / "old.lock"
  old.write_text("4194303\n")
  fd, holder = locks.try_lock(str(old))
  assert holder == "" and fd is not None
  assert old.read_text() == f"{os.getpid()}".ljust(7) + "\n"
  # Another open file description is refused, naming this process.
  assert locks.try_lock(str(old)) == (None, str(os.getpid()))
  os.close(fd)
  for name, before in (("empty.lock", ""), ("spaces.lock", " \n")):
    (tmp_path / name).write_text(before)
    fd, _ = locks.try_lock(str(tmp_path / name))
    os.close(fd)
    assert (tmp_path / name).read_text().strip() == str(os.getpid())
  fresh = tmp_path / "new" / "dir" / ".lock"
  fd, _ = locks.try_lock(str(fresh))
  assert fresh.read_text() == f"{os.getpid()}\n"
  assert os.stat(fresh).st_mode & 0o777 == 0o644 & ~_umask()
  os.close(fd)
  # A holder killed with SIGKILL leaves a lock file, which is taken again.
  child = subprocess.Popen(
      [sys.executable, "-c", "import os, sys, time\n"
       "from augfl_jax.storage import locks\n"
       "fd, _ = locks.try_lock(sys.argv[1])\n"
       "print('held', flush=True)\ntime.sleep(300)\n", str(old)],
      cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline() == "held\n"
    assert locks.try_lock(str(old)) == (None, str(child.pid))
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
  fd, holder = locks.try_lock(str(old))
  assert fd is not None and holder == ""
  assert old.read_text().strip() == str(os.getpid())
  os.close(fd)


def _umask():
  mask = os.umask(0)
  os.umask(mask)
  return mask


def test_a_run_whose_lock_is_a_link_is_refused_in_one_line(
    tmp_path, compile_cache):
  """A run directory received with its lock a link to a user's file (or a
  second name of it): --resume is refused in one line, exit 2, and the
  file keeps its content."""
  out = tmp_path / "run"
  config = _fedavg(rounds=1)
  training.run(config, str(out), log=QUIET, checkpoint_every=1)
  target = tmp_path / "mine.txt"
  target.write_text(MINE)
  lock = out / outputs.LOCK
  lock.unlink()
  lock.symlink_to(target)
  line = run_files.one_line(_cli(compile_cache, "--algorithm=fedavg",
                                 "--rounds=2", f"--output_dir={out}",
                                 "--resume"))
  assert line == (f"error: the lock file {lock} is a symbolic link, which a "
                  "lock never follows; it was left untouched: remove it or "
                  "choose another directory")
  assert target.read_text() == MINE and os.path.islink(lock)
  # A hard link: the same, from the library.
  lock.unlink()
  os.link(target, lock)
  with pytest.raises(outputs.OutputDirError,
                     match=f"^the lock file {lock} has 2 hard links"):
    training.run(fields.replace(config, rounds=2), str(out), log=QUIET,
                 resume=True)
  assert target.read_text() == MINE
  # Its lock removed, the run resumes.
  lock.unlink()
  training.run(fields.replace(config, rounds=2), str(out), log=QUIET,
               resume=True, checkpoint_every=1)
  assert run_files.steps(str(out)) == [1, 2]


def test_a_pm_lock_that_is_a_link_is_refused_in_one_line(
    tmp_path, compile_cache):
  """The lock beside a PM to pretrain, a link to a user's file: the run is
  refused in one line, exit 2, before pretraining, the file untouched."""
  target = tmp_path / "mine.txt"
  target.write_text(MINE)
  lock = tmp_path / ".pm.lock"
  lock.symlink_to(target)
  line = run_files.one_line(_cli(compile_cache, "--augfl.lam=1",
                                 "--rounds=1", f"--pm.dir={tmp_path / 'pm'}",
                                 f"--output_dir={tmp_path / 'run'}"))
  assert line.startswith(f"error: the lock file {lock} is a symbolic link")
  assert target.read_text() == MINE
  assert not os.path.exists(tmp_path / "pm")


# ----------------------------------------------------------------------------
# Unfinished saves: removed only by the run that holds the lock.


def test_building_run_checkpoints_touches_nothing(tmp_path, monkeypatch):
  """Another process's save in flight is an orbax temporary directory:
  RunCheckpoints (as sweep.resumable builds it, without the lock) leaves
  it; training.run removes such debris when it starts, holding the lock."""
  out = str(tmp_path / "run")
  training.run(_fedavg(rounds=2), out, log=QUIET, checkpoint_every=1)
  root = os.path.join(out, "checkpoints")
  debris = os.path.join(root, "step_5.orbax-checkpoint-tmp-123")
  os.makedirs(os.path.join(debris, "state"))
  before = sorted(os.listdir(root))
  manager = checkpoints.RunCheckpoints(root)
  assert manager.steps() == [1, 2]
  manager.close()
  assert sorted(os.listdir(root)) == before and os.path.isdir(debris)
  empty = str(tmp_path / "none")
  checkpoints.RunCheckpoints(empty).close()
  assert not os.path.exists(empty)
  # training.run removes it, while it holds the lock.
  calls = []
  remove = checkpoints.RunCheckpoints.remove_unfinished_saves

  def spy(self):
    fd, holder = locks.try_lock(os.path.join(out, outputs.LOCK))
    calls.append(holder)
    assert fd is None, "removed without holding the run's lock"
    remove(self)

  monkeypatch.setattr(checkpoints.RunCheckpoints, "remove_unfinished_saves",
                      spy)
  training.run(_fedavg(rounds=3), out, log=QUIET, checkpoint_every=1,
               resume=True)
  assert calls == [str(os.getpid())]
  assert not os.path.exists(debris)
  assert sorted(os.listdir(root)) == ["step_2", "step_3"]


# ----------------------------------------------------------------------------
# The resume round: from the sealed metadata.


def test_a_renamed_step_is_not_resumed_from_its_name(tmp_path):
  """step_3 renamed step_7: it is damaged (its metadata says round 3),
  the resume starts from round 2, trains rounds 3 to 10, and the summary
  says so."""
  out = str(tmp_path / "run")
  training.run(_fedavg(rounds=3, eval_every=1), out, log=QUIET,
               checkpoint_every=1)
  root = os.path.join(out, "checkpoints")
  os.rename(os.path.join(root, "step_3"), os.path.join(root, "step_7"))
  manager = checkpoints.RunCheckpoints(root)
  try:
    assert manager.steps() == [2, 7]
    with pytest.raises(ValueError, match="records round 3, not round 7"):
      manager.read_meta(7)
    lines = []
    step, meta = manager.latest_meta(lines.append)
    assert step == 2 and meta["round"] == 2
    assert lines == [
        f"checkpoint {root}/step_7 is damaged (its metadata records round "
        "3, not round 7: the directory step_7 was renamed or copied from "
        "another step); trying the one before it"]
  finally:
    manager.close()
  lines = []
  summary = training.run(_fedavg(rounds=10, eval_every=1), out,
                         log=lines.append, checkpoint_every=1, resume=True)
  assert summary["resumed_from_round"] == 2 and summary["rounds"] == 10
  assert any("records round 3, not round 7" in l for l in lines), lines
  with open(os.path.join(out, "metrics.jsonl")) as f:
    assert [json.loads(l)["round"] for l in f] == list(range(1, 11))
  assert sorted(os.listdir(root)) == ["step_10", "step_7.damaged", "step_9"]


def test_a_copied_step_alone_is_refused_naming_both_rounds(tmp_path):
  """The only step, renamed: no checkpoint reads back, and the message
  names both rounds."""
  out = str(tmp_path / "run")
  training.run(_fedavg(rounds=1), out, log=QUIET, checkpoint_every=1)
  root = os.path.join(out, "checkpoints")
  os.rename(os.path.join(root, "step_1"), os.path.join(root, "step_4"))
  with pytest.raises(ValueError, match="no checkpoint in .* reads back "
                     r"\(step 4: its metadata records round 1, not round 4"):
    training.run(_fedavg(rounds=10), out, log=QUIET, resume=True)
