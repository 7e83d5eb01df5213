"""benchmarks.head_to_head: without the authors' code it says how to get it
(exit code 2); with a snapshot (``AUGFL_JAX_AUTHORS_SRC``, e.g. a clone of
https://github.com/zerui981105/AugFL) one round of their code and of ours,
in float64, give the same theta."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "benchmarks.head_to_head",
                         *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=900, check=False)


@pytest.mark.slow
def test_without_a_snapshot_it_says_how_to_get_one():
  result = _run()
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "error: no snapshot of the authors' code given; git clone "
      "https://github.com/zerui981105/AugFL /tmp/AugFL, then pass "
      "--authors_src=/tmp/AugFL")
  result = _run(f"--authors_src={ROOT}")
  assert result.returncode == 2
  assert "is not a snapshot of the authors' code" in result.stderr


@pytest.mark.slow
def test_one_round_of_both_codes_in_float64(tmp_path):
  src = os.environ.get("AUGFL_JAX_AUTHORS_SRC")
  if not src:
    pytest.skip("AUGFL_JAX_AUTHORS_SRC (a snapshot of the authors' code) "
                "is not set")
  pytest.importorskip("torch")
  out = tmp_path / "h2h.json"
  result = _run(f"--authors_src={src}", "--rounds=1", "--report_rounds=1",
                "--eval.test_clients=0", "--float64", f"--output={out}")
  assert result.returncode == 0, result.stderr[-2000:]
  results = json.loads(out.read_text())
  assert results["theta"]["1"]["relative"] < 1e-6
  assert results["heldout"][0]["ours"] == results["heldout"][0]["theirs"]
