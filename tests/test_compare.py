"""experiments.compare: two configurations, seed by seed, on the same
clients."""

import subprocess
import sys

import numpy as np
import pytest

from augfl_jax.core import intervals
from experiments import compare
from tests.test_scores import _t_interval, _write_run

CHEAP = {0: [18, 17, 19, 15, 20], 1: [16, 18, 19, 17, 18]}
FULL = {0: [17, 17, 18, 16, 19], 1: [16, 17, 20, 15, 18]}


def _runs(tmp_path):
  for name, correct in (("cheap", CHEAP), ("full", FULL)):
    for seed, c in correct.items():
      _write_run(tmp_path / name / f"seed{seed}", [9, 8, 10, 7], c)
  return {"cheap": str(tmp_path / "cheap"), "full": str(tmp_path / "full")}


def test_the_table_holds_the_paired_differences(tmp_path):
  text = compare.compare(_runs(tmp_path), [0, 1])
  assert "Scored on test-split clients" in text
  # seed 0: 89/100 against 87/100, the difference's interval across the
  # five clients (equal counts: the t-interval of per-client differences)
  diff0 = np.subtract(CHEAP[0], FULL[0]) / 20
  low, high = _t_interval(diff0)
  assert (f"| 0 | 89.00 [" in text and
          f"2.00 [{100 * low:.2f}, {100 * high:.2f}]" in text)
  # over seeds: the t-interval of the two per-seed differences
  per_seed = [(sum(CHEAP[s]) - sum(FULL[s])) / 100 for s in (0, 1)]
  low, high = _t_interval(per_seed)
  assert f"{100 * np.mean(per_seed):.2f} [{100 * low:.2f}, {100 * high:.2f}]" in text
  assert intervals.mean_interval(per_seed).format() in text


def test_the_held_out_clients_on_request(tmp_path):
  """--clients=held_out pairs the protocol's held-out clients even where
  the runs have test-split clients; test_split is refused of a run
  without them."""
  heldout = {"a": [9, 8, 10, 7], "b": [7, 8, 9, 6]}
  for name, correct in heldout.items():
    _write_run(tmp_path / name / "seed0", correct, CHEAP[0])
  runs = {name: str(tmp_path / name) for name in heldout}
  text = compare.compare(runs, [0], "held_out")
  assert "Scored on the protocol's held-out clients" in text
  diff = np.subtract(heldout["a"], heldout["b"]) / 10
  low, high = _t_interval(diff)
  assert (f"| 0 | 85.00 [" in text and "| 75.00 [" in text and
          f"10.00 [{100 * low:.2f}, {100 * high:.2f}]" in text)
  # auto: the test-split clients, identical here
  assert "| 0 | 89.00 [" in compare.compare(runs, [0])
  _write_run(tmp_path / "c" / "seed0", heldout["a"], None)
  runs["c"] = str(tmp_path / "c")
  with pytest.raises(ValueError, match="no test-split clients"):
    compare.compare(runs, [0], "test_split")
  with pytest.raises(ValueError, match="clients must be one of"):
    compare.compare(runs, [0], "train")


def test_bad_input_stops_with_one_line(tmp_path):
  with pytest.raises(ValueError, match="NAME=DIR"):
    compare.parse_runs(["nodir"])
  with pytest.raises(ValueError, match="at least two"):
    compare.parse_runs(["a=x"])
  runs = _runs(tmp_path)
  with pytest.raises(ValueError, match="no finished run"):
    compare.compare(runs, [0, 7])


@pytest.mark.slow
def test_the_command_stops_with_one_line_and_exit_2(tmp_path):
  runs = _runs(tmp_path)
  result = subprocess.run(
      [sys.executable, "-m", "experiments.compare", f"--runs=a={runs['cheap']}",
       f"--runs=b={tmp_path}/missing", "--seeds=0"],
      capture_output=True, text=True)
  assert result.returncode == 2
  assert result.stderr.strip().startswith("error:")
  assert len(result.stderr.strip().splitlines()) == 1
