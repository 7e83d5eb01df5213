"""What a run directory holds, read as the tests read it, and the one line
that a command prints when it refuses."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Iterator

from augfl_jax.training import checkpoints


def records(path: str) -> list[dict]:
  """The records of ``path/metrics.jsonl``, every line parsed."""
  with open(os.path.join(path, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def steps(path: str) -> list[int]:
  """The finished checkpoint steps of the run in ``path``."""
  manager = checkpoints.RunCheckpoints(os.path.join(path, "checkpoints"))
  try:
    return manager.steps()
  finally:
    manager.close()


def one_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
  """The one ``error: ...`` line of a command that exited with ``code``."""
  lines = result.stderr.strip().splitlines()
  assert result.returncode == code, result.stderr
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  return lines[0]


@contextlib.contextmanager
def lock_held_by_another_process(path: str) -> Iterator[int]:
  """Another process holds the lock file ``path`` (``storage.locks``) for
  the block; yields its process id. It is killed on leaving, which drops
  the lock."""
  holder = subprocess.Popen(
      [sys.executable, "-c",
       "import sys, time\n"
       "from augfl_jax.storage import locks\n"
       "fd, _ = locks.try_lock(sys.argv[1])\n"
       "print('held', flush=True)\n"
       "time.sleep(60)\n", path],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    yield holder.pid
  finally:
    holder.kill()
    holder.wait()
