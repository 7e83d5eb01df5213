"""experiments.sweep: grids over dotted fields, reuse of finished runs."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys

import pytest

from augfl_jax import fields, training
from experiments import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


def test_grid_names_dotted_fields_typed_by_the_field():
  cells = sweep.parse_grid("augfl.rho=0.7,0.2; data.M=5 ;"
                           "augfl.uniform_weights=true;algorithm=fedavg")
  assert cells == [
      {"augfl.rho": 0.7, "data.M": 5, "augfl.uniform_weights": True,
       "algorithm": "fedavg"},
      {"augfl.rho": 0.2, "data.M": 5, "augfl.uniform_weights": True,
       "algorithm": "fedavg"}]
  assert type(cells[0]["data.M"]) is int  # pylint: disable=unidiomatic-typecheck
  assert sweep.parse_grid("eval.alpha=1") == [{"eval.alpha": 1.0}]
  assert type(sweep.parse_grid("eval.alpha=1")[0]["eval.alpha"]) is float  # pylint: disable=unidiomatic-typecheck
  assert sweep.parse_grid("") == [{}]
  assert sweep.cell_name({"augfl.rho": 0.7, "dataset": "emnist/letters"}) == (
      "augfl.rho=0.7_dataset=emnist-letters")
  for text, message in (("rho=0.7", "bad --grid entry 'rho=0.7'"),
                        ("augfl=1", "bad --grid entry"),
                        ("augfl.rho=", "bad --grid entry"),
                        ("augfl.rho=x", "augfl.rho takes float values"),
                        ("data.M=1.5", "data.M takes int values"),
                        ("augfl.uniform_weights=2", "true or false"),
                        ("fedit.targets=a", "list field")):
    with pytest.raises(ValueError, match=message):
      sweep.parse_grid(text)


def test_finished_runs_are_reused_continued_or_refused(tmp_path):
  config = fields.replace(training.RunConfig(rounds=2),
                          **{"augfl.lam": 0.0})
  run_dir = str(tmp_path / "cell" / "seed0")
  assert sweep.finished_run(run_dir, config) is None  # nothing there
  rows = sweep.run_cells(config, [{"augfl.rho": 0.2}], [0],
                         str(tmp_path), names=["cell"])
  assert rows[0]["augfl.rho"] == 0.2 and rows[0]["run_dir"] == run_dir
  cell = fields.replace(config, **{"augfl.rho": 0.2})
  assert sweep.finished_run(run_dir, cell)["final_accuracy"] == (
      rows[0]["final_accuracy"])
  # More rounds: not finished (it continues); a resumable field may change.
  assert sweep.finished_run(run_dir, fields.replace(cell, rounds=3)) is None
  assert sweep.finished_run(run_dir, fields.replace(cell, strategy="vmap"))
  # Another algorithm's section is not part of this run's configuration.
  assert sweep.finished_run(run_dir, fields.replace(
      cell, **{"fedoa.distance": "squared_l2", "fedavg.lr": 0.5}))
  assert sweep.resumable(run_dir)
  with pytest.raises(ValueError, match="another configuration") as e:
    sweep.finished_run(run_dir, fields.replace(cell, **{"augfl.rho": 0.3}))
  assert "augfl.rho: 0.2 -> 0.3" in str(e.value)
  # A summary.json this tool did not write is not a finished run.
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "summary.json").write_text(json.dumps({"rounds": 2}))
  assert sweep.finished_run(str(foreign), cell) is None
  assert not sweep.resumable(str(foreign))


def test_cli_writes_its_tables_and_bad_grids_are_one_line(tmp_path,
                                                          compile_cache):
  def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "experiments.sweep", *args,
         f"--output_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
        text=True, timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": compile_cache})
  result = cli("--grid=augfl.rho=0.7,0.2", "--seeds=0", "--rounds=1",
               "--augfl.lam=0")
  assert result.returncode == 0, result.stderr
  assert "| augfl.rho=0.2 |" in result.stdout
  rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
  assert [(r["cell"], r["augfl.rho"]) for r in rows] == [
      ("augfl.rho=0.7", "0.7"), ("augfl.rho=0.2", "0.2")]
  for args, message in (
      (["--grid=rho=0.7"], "error: bad --grid entry 'rho=0.7'"),
      (["--grid=augfl.rho=0"], "error: --grid cell augfl.rho=0.0: rho must "
       "be > 0"),
      (["--overwrite"], "error: --overwrite: a comparison command"),
      (["--seeds=a"], "error: --seeds takes int values"),
      (["--rounds=x"], "error: flag --rounds=x")):
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


def test_sigint_stops_a_sweep_in_one_line_and_a_rerun_continues(
    tmp_path, compile_cache):
  args = [sys.executable, "-m", "experiments.sweep", "--grid=augfl.rho=0.7",
          "--seeds=0", "--rounds=100", "--eval_every=100", "--augfl.lam=0",
          f"--output_dir={tmp_path}"]
  env = {**os.environ, "XDG_CACHE_HOME": compile_cache,
         "PYTHONUNBUFFERED": "1"}
  proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    for line in proc.stdout:
      if line.startswith("[1/1]"):
        break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 128 + signal.SIGINT, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("interrupted"), lines
  assert "run the same command again to continue" in lines[0]
  result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "| augfl.rho=0.7 |" in result.stdout
