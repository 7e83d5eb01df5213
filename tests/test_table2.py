"""experiments.table2 on a tiny grid: two methods, one seed, 2 rounds."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from augfl_jax import fields, training
from experiments import table2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


def test_table_has_its_rows_and_a_rerun_reuses_every_cell(tmp_path,
                                                          monkeypatch):
  out, results = str(tmp_path / "table2"), str(tmp_path / "results")
  base = training.RunConfig(rounds=2)
  args = (base, ["digits"], ["fedavg", "augfl_wo_pm"], [0], out)
  text = table2.run_table(*args, results_dir=results)
  assert open(os.path.join(results, "digits", "table2.md")).read() == (
      text + "\n" if not text.endswith("\n") else text)
  lines = text.splitlines()
  assert lines[0] == "# Table II on digits"
  assert "Configuration shared by every run: dataset=digits" in text
  assert "data.server_size=400" in text and "rounds=2" in text
  assert "* FedAvg: fedavg: lr=0.05" in text
  assert "* AugFL w/o PM: augfl: alpha=0.03, rho=0.7, lam=0.0" in text
  summary = [line for line in lines if line.startswith("| FedAvg |")]
  mean, std = (float(v) for v in summary[0].split(" | ")[1].split("±"))
  assert 0.0 <= mean <= 100.0 and std == 0.0  # one seed
  assert summary[0].endswith("| 1 | – |")  # no Table II value for digits
  rows = list(csv.DictReader(open(os.path.join(results, "digits",
                                               "table2.csv"))))
  assert [(r["method"], r["seed"]) for r in rows] == [
      ("fedavg", "0"), ("augfl_wo_pm", "0")]
  assert list(rows[0]) == ["method", "seed", "final_accuracy",
                           "best_accuracy", "seconds"]
  assert 0.0 <= float(rows[0]["final_accuracy"]) <= 100.0  # in %
  assert float(rows[0]["seconds"]) > 0
  assert os.path.exists(os.path.join(out, "digits", "fedavg", "seed0",
                                     "summary.json"))

  def fail(*a, **k):
    raise AssertionError("recomputed a finished cell")
  monkeypatch.setattr(training, "run", fail)
  assert table2.run_table(*args, results_dir=results) == text
  # The same directory with another configuration is refused, not reused.
  with pytest.raises(ValueError, match="another configuration") as e:
    table2.run_table(fields.replace(training.RunConfig(rounds=2),
                                    **{"fedavg.lr": 0.5}), *args[1:],
                     results_dir=results)
  assert "fedavg.lr: 0.05 -> 0.5" in str(e.value)


def test_more_rounds_continue_the_finished_cells(tmp_path):
  out = str(tmp_path / "table2")
  lines = []
  results = str(tmp_path / "results")
  table2.run_table(training.RunConfig(rounds=1), ["digits"], ["fedavg"], [0],
                   out, results_dir=results)
  real_run = training.run

  def run(*a, **k):
    lines.append(k["resume"])
    return real_run(*a, **k)
  with pytest.MonkeyPatch.context() as m:
    m.setattr(training, "run", run)
    table2.run_table(training.RunConfig(rounds=2), ["digits"], ["fedavg"],
                     [0], out, results_dir=results)
  assert lines == [True]  # resumed from its round-1 checkpoint
  rows = list(csv.DictReader(open(os.path.join(results, "digits",
                                               "table2.csv"))))
  assert len(rows) == 1


def test_unknown_method_is_one_line_on_the_cli(tmp_path, compile_cache):
  result = subprocess.run(
      [sys.executable, "-m", "experiments.table2", "--methods=fedsgd",
       f"--output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
      timeout=300, env={**os.environ, "XDG_CACHE_HOME": compile_cache})
  assert result.returncode == 2
  assert result.stderr.splitlines()[-1].startswith(
      "error: unknown --methods fedsgd")
  assert "Traceback" not in result.stderr
