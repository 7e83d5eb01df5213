"""What a run directory holds, read as the tests read it, and the one line
that a command prints when it refuses."""

from __future__ import annotations

import json
import os
import subprocess

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
