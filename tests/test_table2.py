"""experiments.table2 on a tiny grid: two methods, one seed, 2 rounds."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

from augfl_jax.core import fields
from augfl_jax import training
from experiments import scores, table2
from tests import run_files
from tests.test_scores import _write_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


def _counted_prepare(monkeypatch) -> list[training.RunConfig]:
  """The configurations ``training.prepare`` is given from now on, where
  any module calls it."""
  calls, prepare = [], training.prepare
  def counted(config):
    calls.append(config)
    return prepare(config)
  for module in list(sys.modules.values()):
    if getattr(module, "prepare", None) is prepare:
      monkeypatch.setattr(module, "prepare", counted)
  return calls


def test_table_has_its_rows_and_a_rerun_reuses_every_cell(tmp_path,
                                                          monkeypatch):
  out, results = str(tmp_path / "table2"), str(tmp_path / "results")
  base = training.RunConfig(rounds=2)
  args = (base, ["digits"], ["fedavg", "augfl_wo_pm"], [0], out)
  lines, prepared = [], _counted_prepare(monkeypatch)
  text = table2.run_table(*args, results_dir=results, log=lines.append)
  # Each run's plan is prepared once, and travels to its run and checks.
  assert [c.algorithm for c in prepared] == ["fedavg", "augfl"]
  assert open(os.path.join(results, "digits", "table2.md")).read() == text
  assert any(line.startswith("[2/2] augfl_wo_pm seed 0: round    2/2")
             for line in lines)  # each cell shows its progress
  assert any("1/2 runs in" in line and "left for 1 more" in line
             for line in lines)  # and the table its own
  assert text.splitlines()[0] == "# Table II on digits"
  assert "Configuration shared by every run: dataset=digits" in text
  assert "data.server_size=400" in text and "rounds=2" in text
  assert "data.partition=pathological, data.server_overlap=False" in text
  assert "* FedAvg: fedavg: lr=0.05" in text
  assert "* AugFL w/o PM: augfl: alpha=0.03, rho=0.7, lam=0.0" in text
  assert "left unused (digits has no test split)" in text
  assert "95% confidence interval" in text and "Student's t" in text
  summary = [line for line in text.splitlines()
             if line.startswith("| FedAvg | ")][0].split(" | ")
  assert "[" not in summary[1]  # one seed: no interval across seeds
  assert ("An interval across seeds needs at least 3 seeds (--seeds=0,1,2): "
          "with 1 seed there is none") in text  # and it says why
  assert summary[-2:] == ["1", "– |"]  # seeds; no Table II value for digits
  rows = list(csv.DictReader(open(os.path.join(results, "digits",
                                               "table2.csv"))))
  assert [(r["method"], r["seed"], r["interval"]) for r in rows] == [
      ("fedavg", "all", "seeds"), ("augfl_wo_pm", "all", "seeds"),
      ("fedavg", "0", "clients"), ("augfl_wo_pm", "0", "clients")]
  # A run's row: the test-split accuracy with its interval across clients,
  # as its metrics.jsonl recorded it.
  run = run_files.records(os.path.join(out, "digits", "fedavg", "seed0"))[-1]
  split = run["test_split"]
  assert rows[2]["scored_on"] == "test_split"
  assert float(rows[2]["accuracy"]) == pytest.approx(
      100 * split["accuracy"], abs=0.006)
  assert float(rows[2]["accuracy_ci_low"]) == pytest.approx(
      100 * split["accuracy_ci"][0], abs=0.006)
  assert float(rows[2]["heldout_accuracy"]) == pytest.approx(
      100 * run["accuracy"], abs=0.006)
  # the run's wall seconds as its last checkpoint sealed them (its
  # summary.json, written after the final scoring, counts more), rounded to
  # whole seconds (a fast run reads 0)
  _, sealed = scores.sealed(os.path.join(out, "digits", "fedavg", "seed0"))
  assert sealed["seconds"] > 0 and float(rows[2]["seconds"]) == (
      pytest.approx(sealed["seconds"], abs=0.5))
  recorded = json.load(open(os.path.join(results, "digits", "table2.json")))
  assert recorded["seeds"] == [0]
  # Each run's phases, as its summary.json has them, and their sums under
  # the table: per method and over it, in seconds and %.
  spent = {m: json.load(open(os.path.join(out, "digits", m, "seed0",
                                          "summary.json")))["phase_seconds"]
           for m in ("fedavg", "augfl_wo_pm")}
  assert recorded["runs"] == [
      {"method": m, "seed": 0, "phase_seconds": spent[m]} for m in spent]
  phase_rows = text.split("Where the runs' wall time went")[1].splitlines()
  head = [c.strip() for c in next(line for line in phase_rows
                                  if line.startswith("| method |")).split("|")]
  assert head[1:5] == ["method", "runs", "total", "setup"]
  assert "first round" in head and "first test-split scoring" in head
  total = sum(sum(p.values()) for p in spent.values())
  fedavg = [line for line in phase_rows if line.startswith("| FedAvg | 1 |")]
  assert len(fedavg) == 1 and fedavg[0].split(" | ")[2] == (
      f"{sum(spent['fedavg'].values()):.1f} "
      f"({100 * sum(spent['fedavg'].values()) / total:.1f}%)")
  assert any(line.startswith(f"| all methods | 2 | {total:.1f} (100.0%) |")
             for line in phase_rows)

  def fail(*a, **k):
    raise AssertionError("recomputed a finished cell")
  monkeypatch.setattr(training, "run", fail)
  assert table2.run_table(*args, results_dir=results,
                          log=lambda s: None) == text
  assert len(prepared) == 4  # the finished runs, checked against theirs
  # --finished_only runs nothing: seed 1 is named as missing, not run.
  lines = []
  partial = table2.run_table(*args[:3], [0, 1], out, results_dir=str(
      tmp_path / "partial"), log=lines.append, finished_only=True)
  assert ("Not in the table (no finished run): FedAvg seed 1; AugFL w/o PM "
          "seed 1.") in partial
  assert "[2/4] fedavg seed 1: no finished run in " in "\n".join(lines)
  assert partial.split("Not in the table")[0] == text.split(
      "An interval across seeds")[0]
  with pytest.raises(ValueError, match="no finished run of fedavg"):
    table2.run_table(base, ["digits"], ["fedavg"], [5], out,
                     results_dir=str(tmp_path / "none"), finished_only=True)
  # The same directory with another configuration is refused, not reused.
  with pytest.raises(ValueError, match="another configuration") as e:
    table2.run_table(fields.replace(training.RunConfig(rounds=2),
                                    **{"fedavg.lr": 0.5}), *args[1:],
                     results_dir=str(tmp_path / "elsewhere"))
  assert "fedavg.lr: 0.05 -> 0.5" in str(e.value)


def test_augfl_with_pm_takes_lam_from_the_flags(tmp_path, monkeypatch):
  """AugFL w/ PM runs at the configured lam (the preset's 5.0, a flag
  file's 1.0); lam 0 is AugFL w/o PM and is refused before any run."""
  seen = []

  def run(plan, run_dir, **k):
    seen.append(plan.config.augfl.lam)
    raise RuntimeError("stop after the first cell's config")
  monkeypatch.setattr(training, "run", run)
  table = lambda lam: table2.run_table(
      fields.replace(training.RunConfig(rounds=1), **{"augfl.lam": lam}),
      ["digits"], ["augfl"], [0], str(tmp_path / f"runs{lam}"),
      results_dir=str(tmp_path / "results"), replace_results=True,
      log=lambda s: None)
  for lam in (5.0, 1.0):
    with pytest.raises(RuntimeError, match="stop after"):
      table(lam)
  assert seen == [5.0, 1.0]
  with pytest.raises(ValueError, match="augfl.lam > 0"):
    table(0.0)
  assert seen == [5.0, 1.0]


@pytest.mark.slow
def test_a_table_of_another_configuration_is_not_overwritten(tmp_path):
  results = str(tmp_path / "results")
  table = os.path.join(results, "digits", "table2.md")
  run = lambda rounds, seeds, **k: table2.run_table(
      training.RunConfig(rounds=rounds), ["digits"], ["fedavg"], seeds,
      str(tmp_path / "runs"), results_dir=results, log=lambda s: None, **k)
  run(1, [0, 1])
  before = open(table).read()
  for rounds, seeds, says in ((2, [0, 1], "rounds: 1 -> 2"),
                              (1, [0], "seeds 0,1 -> 0")):
    with pytest.raises(ValueError, match="another configuration") as e:
      run(rounds, seeds)
    assert says in str(e.value) and "--replace_results" in str(e.value)
    assert open(table).read() == before  # refused before any run
  assert not os.path.exists(str(tmp_path / "runs" / "digits" / "fedavg" /
                                "seed0" / "checkpoints" / "step_2"))
  run(1, [0, 1, 2])  # more seeds of the same configuration: allowed
  assert "| FedAvg | 2 | " in open(table).read()
  os.remove(os.path.join(results, "digits", "table2.json"))
  with pytest.raises(ValueError, match="not recorded"):
    run(1, [0, 1, 2])
  run(2, [0], replace_results=True)  # asked for
  assert "rounds=2" in open(table).read()


def test_more_rounds_continue_the_finished_cells(tmp_path):
  out = str(tmp_path / "table2")
  resumed, lines = [], []
  results = str(tmp_path / "results")
  table2.run_table(training.RunConfig(rounds=1), ["digits"], ["fedavg"], [0],
                   out, results_dir=results, log=lambda s: None)
  real_run = training.run

  def run(*a, **k):
    resumed.append(k["resume"])
    return real_run(*a, **k)
  with pytest.MonkeyPatch.context() as m:
    m.setattr(training, "run", run)
    table2.run_table(training.RunConfig(rounds=2), ["digits"], ["fedavg"],
                     [0], out, results_dir=results, replace_results=True,
                     log=lines.append)
  assert resumed == [True]  # resumed from its round-1 checkpoint, saying so
  assert lines[0].endswith("extending the finished 1-round run in "
                           f"{out}/digits/fedavg/seed0 to 2 rounds")
  rows = list(csv.DictReader(open(os.path.join(results, "digits",
                                               "table2.csv"))))
  assert [r["seed"] for r in rows] == ["all", "0"]
  assert rows[1]["rounds"] == "2"


def test_a_table2_json_without_phases_still_reads(tmp_path):
  """A table of a version before the runs' phases (the committed
  Fashion-MNIST table's table2.json, without ``runs``) is checked against a
  new table's configuration as before: the same one passes, another is
  refused."""
  directory = tmp_path / "fashion_mnist"
  shutil.copytree(os.path.join(ROOT, "results", "fashion_mnist"), directory)
  old = json.load(open(directory / "table2.json"))
  old.pop("runs", None)  # as a version before them wrote it
  (directory / "table2.json").write_text(json.dumps(old))
  key = {"cells": old["cells"], "seeds": old["seeds"]}
  table2.check_results(str(directory), key, replace=False)
  other = json.loads(json.dumps(key))
  other["cells"]["fedavg"]["fedavg.lr"] = 0.5
  with pytest.raises(ValueError, match="another configuration"):
    table2.check_results(str(directory), other, replace=False)


def test_unknown_method_is_one_line_on_the_cli(tmp_path, compile_cache):
  result = subprocess.run(
      [sys.executable, "-m", "experiments.table2", "--methods=fedsgd",
       f"--output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
      timeout=300, env={**os.environ, "XDG_CACHE_HOME": compile_cache})
  assert result.returncode == 2
  assert result.stderr.splitlines()[-1].startswith(
      "error: unknown --methods fedsgd")
  assert "Traceback" not in result.stderr


def _snapshot(root):
  """Every file under ``root`` with its bytes: what ``git status`` sees."""
  return {os.path.relpath(os.path.join(d, f), root):
          open(os.path.join(d, f), "rb").read()
          for d, _, files in os.walk(root) for f in files}


def test_tables_go_beside_the_runs_unless_results_is_named(tmp_path,
                                                           monkeypatch):
  """From a checkout's root (here a copy of its committed results/), a
  table without --results_dir goes to <output_dir>/tables and leaves the
  committed tables as they were; naming results/ writes there."""
  shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "results")
  monkeypatch.chdir(tmp_path)
  committed = _snapshot("results")
  args = (training.RunConfig(rounds=1), ["digits"], ["fedavg"], [0],
          os.path.join("runs", "table2"))
  text = table2.run_table(*args, log=lambda s: None)
  assert _snapshot("results") == committed
  assert open(os.path.join("runs", "table2", "tables", "digits",
                           "table2.md")).read() == text
  assert table2.default_results_dir("runs/x") == "runs/x/tables"
  # Named, the committed table is written (replaced: it is of another
  # configuration).
  assert table2.run_table(*args, results_dir="results", replace_results=True,
                          log=lambda s: None) == text
  assert open(os.path.join("results", "digits", "table2.md")).read() == text


@pytest.mark.slow
def test_the_command_with_default_flags_leaves_the_committed_tables(
    tmp_path, compile_cache):
  """``python -m experiments.table2`` run where the committed results/
  lies, --results_dir not given: exit 0, results/ unchanged, and the
  command says where the tables went (its --help says so too)."""
  shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "results")
  committed = _snapshot(tmp_path / "results")
  env = {**os.environ, "XDG_CACHE_HOME": compile_cache,
         "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  command = lambda *a: subprocess.run(
      [sys.executable, "-m", "experiments.table2", *a], cwd=tmp_path,
      capture_output=True, text=True, timeout=300, env=env)
  result = command("--datasets=digits", "--methods=fedavg", "--seeds=0",
                   "--rounds=1")
  assert result.returncode == 0, result.stderr
  assert _snapshot(tmp_path / "results") == committed
  assert result.stdout.splitlines()[-1] == (
      "runs in runs/table2; tables in runs/table2/tables/<dataset>/")
  assert (tmp_path / "runs" / "table2" / "tables" / "digits" /
          "table2.md").is_file()
  assert "(default <output_dir>/tables, beside the runs;" in " ".join(
      command("--help").stdout.split())


def test_fewer_than_three_seeds_are_said_to_give_no_useful_interval(
    tmp_path):
  """A method of 2 seeds gets its t-interval (1 degree of freedom) and a
  line saying an interval across seeds needs 3; one of 1 seed none."""
  test = {("augfl", 0): [18, 17, 19, 15, 20],
          ("augfl", 1): [16, 18, 19, 17, 18],
          ("fedavg", 0): [14, 17, 15, 12, 19]}
  runs = [scores.load_run_score(_write_run(
      tmp_path / f"{m}{s}", [9, 8, 10, 7], c, seed=s, algorithm=m), m, s)
          for (m, s), c in test.items()]
  configs = {m: training.validate(fields.replace(training.RunConfig(),
                                                 algorithm=m))
             for m in ("fedavg", "augfl")}
  text = table2.write_table(runs, "digits", ["fedavg", "augfl"], configs,
                            str(tmp_path / "out"), "test clients", [0, 1])
  augfl = scores.across_seeds(runs, "augfl", True)
  assert augfl.n == 2 and f"| AugFL w/ PM | {augfl.format()} | " in text
  assert "[" in augfl.format()  # shown, and said to be of little use
  note = [line for line in text.splitlines()
          if line.startswith("An interval across seeds")]
  assert note == [
      "An interval across seeds needs at least 3 seeds (--seeds=0,1,2): "
      "FedAvg has 1 seed, so no interval; AugFL w/ PM has 2 seeds, so a "
      "t-interval with 1 degree of freedom, ± 12.71 standard errors (± 4.30 "
      "with 3 seeds)."]
  assert "| FedAvg | 77.00 | " in text  # one seed: the mean alone
  # Runs of a version without phases: said so under the table.
  assert ("No run records where its time went (runs of a version without "
          "`phase_seconds`).") in text
  # Three seeds each: no such line.
  runs += [scores.load_run_score(_write_run(
      tmp_path / f"{m}{s}", [9, 8, 10, 7], [15, 15, 15, 15, 15], seed=s,
      algorithm=m), m, s) for m, s in (("augfl", 2), ("fedavg", 1),
                                       ("fedavg", 2))]
  assert "An interval across seeds" not in table2.write_table(
      runs, "digits", ["fedavg", "augfl"], configs, str(tmp_path / "out"),
      "test clients", [0, 1, 2])
