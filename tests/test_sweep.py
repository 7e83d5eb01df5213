"""experiments.sweep: grids over dotted fields, reuse of finished runs."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from augfl_jax.core import fields
from augfl_jax import training
from experiments import scores, sweep
from tests.test_scores import _write_run

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
                        ("fedit.targets=a", "list field"),
                        ("augfl.rho=0.7,0.70", "augfl.rho names 0.7 more "
                         "than once"),
                        ("augfl.rho=0.7;augfl.rho=0.5", "--grid names "
                         "augfl.rho more than once")):
    with pytest.raises(ValueError, match=message):
      sweep.parse_grid(text)


def test_finished_runs_are_reused_continued_or_refused(tmp_path):
  config = fields.replace(training.RunConfig(rounds=2),
                          **{"augfl.lam": 0.0})
  run_dir = str(tmp_path / "cell" / "seed0")
  assert sweep.finished_run(run_dir, config) is None  # nothing there
  rows = sweep.run_cells(sweep.plan_runs(config, [{"augfl.rho": 0.2}], [0],
                                         names=["cell"]), str(tmp_path))
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


def _rows(tmp_path, correct, test_counts=None):
  """Finished runs of ``correct`` ((cell, seed) -> test-split clients'
  correct predictions, or None for a run without them), as run_cells
  gives them: one row per run."""
  rows = []
  for (cell, seed), test in correct.items():
    run_dir = _write_run(tmp_path / cell / f"seed{seed}", [9, 8, 10, 7],
                         test, seed=seed, test_counts=(test_counts or {}).get(
                             cell, (20,) * 5))
    rows.append({"cell": cell, "seed": seed,
                 "augfl.rho": float(cell.partition("=")[2]),
                 "final_accuracy": 0.85, "best_accuracy": 0.85,
                 "seconds": 3.0, "run_dir": run_dir})
  return rows


SWEPT = {("rho=0.7", 0): [18, 17, 19, 15, 20],
         ("rho=0.7", 1): [16, 18, 19, 17, 18],
         ("rho=0.7", 2): [17, 17, 18, 16, 19],
         ("rho=0.2", 0): [14, 17, 15, 12, 19],
         ("rho=0.2", 1): [15, 12, 18, 16, 17],
         ("rho=0.2", 2): [16, 17, 20, 15, 18]}


def test_the_table_scores_as_table2_does(tmp_path, capsys):
  """Per cell the mean of its seeds with the t-interval across seeds and
  the paired difference to the first cell; per run, intervals across its
  clients; the CSV file the same figures in %."""
  rows = _rows(tmp_path, SWEPT)
  runs = [scores.load_run_score(r["run_dir"], r["cell"], r["seed"])
          for r in rows]
  text = sweep.write_tables(rows, str(tmp_path), "augfl on digits")
  assert capsys.readouterr().out == text + "\n"  # printed
  assert (tmp_path / "results.md").read_text() == text
  lines = text.splitlines()
  assert lines[0] == "# augfl on digits"
  assert "on test-split clients" in lines[2]
  acc = {c: scores.across_seeds(runs, c, True) for c in ("rho=0.7",
                                                         "rho=0.2")}
  diff = scores.paired(runs, "rho=0.2", "rho=0.7", True)
  held = scores.across_seeds(runs, "rho=0.2", False)
  assert lines[4] == ("| cell | accuracy, 95% CI across seeds | minus "
                      "rho=0.7, 95% CI across seeds | held-out clients, 95% "
                      "CI across seeds | seeds |")
  assert f"| rho=0.7 | {acc['rho=0.7'].format()} | – | " in text
  assert (f"| rho=0.2 | {acc['rho=0.2'].format()} | {diff[1].format()} | "
          f"{held.format()} | 3 |") in text
  assert "[" in diff[1].format() and acc["rho=0.2"].n == 3
  for seed, d in diff[0].items():  # each run against the first cell's
    run = next(r for r in runs if (r.method, r.seed) == ("rho=0.2", seed))
    assert (f"| rho=0.2 | {seed} | {run.test_split.interval.format()} | "
            f"{d.format()} | {run.heldout.interval.format()} | 85.00 | 5 | "
            "3 |") in text
  assert "An interval across seeds" not in text  # 3 seeds
  table = list(csv.DictReader(open(tmp_path / "results.csv")))
  assert [(r["cell"], r["seed"], r["interval"]) for r in table] == [
      ("rho=0.7", "all", "seeds"), ("rho=0.2", "all", "seeds")] + [
          (c, str(s), "clients") for c, s in SWEPT]
  assert (table[1]["accuracy"], table[1]["accuracy_ci_low"],
          table[1]["minus_reference_ci_high"], table[1]["reference"],
          table[1]["augfl.rho"], table[1]["scored_on"]) == (
              f"{100 * acc['rho=0.2'].mean:.2f}",
              f"{100 * acc['rho=0.2'].low:.2f}",
              f"{100 * diff[1].high:.2f}", "rho=0.7", "0.2", "test_split")
  assert table[5]["run_dir"] == rows[3]["run_dir"]
  # Another reference; one that names no cell is refused.
  other = sweep.write_tables(rows, str(tmp_path), "t", reference="rho=0.2")
  assert (f"| rho=0.7 | {acc['rho=0.7'].format()} | "
          f"{scores.paired(runs, 'rho=0.7', 'rho=0.2', True)[1].format()} | "
          ) in other
  with pytest.raises(ValueError, match=r"^--reference=rho=0.5 names no cell; "
                     "name one of rho=0.7, rho=0.2$"):
    sweep.write_tables(rows, str(tmp_path), "t", reference="rho=0.5")


def test_cells_on_other_clients_or_few_seeds_are_said_so(tmp_path):
  """A cell scored on other clients than the reference's is not paired
  (the line says why); a run without test-split clients makes every cell
  scored on the held-out clients; 2 seeds are said to give a t-interval
  of little use."""
  two = {k: v for k, v in SWEPT.items() if k[1] < 2}
  text = sweep.write_tables(
      _rows(tmp_path / "a", two, {"rho=0.2": (20, 20, 20, 20, 21)}),
      str(tmp_path / "a"), "t")
  assert "| rho=0.2 | " in text and " | – | " in text.split("| rho=0.2 |")[1]
  assert ("rho=0.2 is not paired with rho=0.7: " in text and
          "were not scored on the same clients" in text)
  assert ("An interval across seeds needs at least 3 seeds (--seeds=0,1,2): "
          "with 2 seeds it is a t-interval") in text
  text = sweep.write_tables(_rows(tmp_path / "b", {**two, ("rho=0.2", 1):
                                                   None}),
                            str(tmp_path / "b"), "t")
  assert "on the protocol's held-out clients" in text
  assert "held-out clients, 95% CI across seeds" not in text  # the headline
  one = sweep.write_tables(_rows(tmp_path / "c", {("rho=0.7", 0): [1] * 5}),
                           str(tmp_path / "c"), "t").splitlines()
  assert one[4:7] == ["| cell | accuracy, 95% CI across seeds | held-out "
                      "clients, 95% CI across seeds | seeds |",
                      "|---|---|---|---|", "| rho=0.7 | 5.00 | 85.00 | 1 |"]


@pytest.mark.slow
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
  assert [(r["cell"], r["seed"], r["augfl.rho"]) for r in rows] == [
      ("augfl.rho=0.7", "all", "0.7"), ("augfl.rho=0.2", "all", "0.2"),
      ("augfl.rho=0.7", "0", "0.7"), ("augfl.rho=0.2", "0", "0.2")]
  assert rows[1]["reference"] == "augfl.rho=0.7" and rows[1]["minus_reference"]
  for args, message in (
      (["--grid=rho=0.7"], "error: bad --grid entry 'rho=0.7'"),
      (["--grid=augfl.rho=0"], "error: --grid cell augfl.rho=0.0: augfl.rho "
       "must be > 0"),
      (["--overwrite"], "error: --overwrite: a comparison command"),
      (["--grid=augfl.rho=0.7,0.2", "--reference=augfl.rho=0.5"],
       "error: --reference=augfl.rho=0.5 names no cell; name one of "
       "augfl.rho=0.7, augfl.rho=0.2"),
      (["--seeds=a"], "error: --seeds takes int values"),
      (["--rounds=x"], "error: flag --rounds=x")):
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


def _raise_sigint_and_wait(stop):
  os.kill(os.getpid(), signal.SIGINT)
  while stop.signum is None:  # the handler runs between bytecodes
    pass


def test_a_signal_pending_at_the_end_of_a_block_reaches_the_handler_before():
  received = []
  def handler(signum, frame):
    del frame
    received.append(signum)
  before = signal.signal(signal.SIGINT, handler)  # whatever the worker had
  try:
    with training.StopSignals() as outer:
      with training.StopSignals() as inner:
        _raise_sigint_and_wait(inner)
        assert outer.signum is None
      assert outer.signum == signal.SIGINT  # handed out, not dropped
      assert not received
    assert received == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is handler
  finally:
    signal.signal(signal.SIGINT, before)


def test_a_block_takes_over_the_pending_signal_of_the_one_around_it():
  with training.StopSignals() as outer:
    _raise_sigint_and_wait(outer)
    with pytest.raises(training.RunInterrupted):
      with training.StopSignals() as inner:
        assert inner.signum == signal.SIGINT and outer.signum is None
        raise training.RunInterrupted("stopped", inner.signum, 0, None)
    assert outer.signum is None  # the exception consumed it


def test_a_signal_in_the_last_round_of_a_run_stops_the_sweep_after_it(
    tmp_path, monkeypatch):
  started = []
  def run_whose_last_round_gets_a_signal(plan, run_dir, **kwargs):
    del kwargs
    started.append(run_dir)
    with training.StopSignals() as stop:  # as training.run's
      _raise_sigint_and_wait(stop)
    return {"final_accuracy": 0.5, "best_accuracy": 0.5, "seconds": 1.0,
            "rounds": plan.config.rounds}
  monkeypatch.setattr(training, "run", run_whose_last_round_gets_a_signal)
  cells = sweep.parse_grid("augfl.rho=0.7,0.2")
  with pytest.raises(training.RunInterrupted, match="SIGINT after run 1/2 "):
    sweep.run_cells(sweep.plan_runs(training.RunConfig(rounds=2), cells,
                                    [0]), str(tmp_path))
  assert len(started) == 1


def test_a_signal_in_the_last_round_ends_the_cli_run_with_128_plus_it(
    tmp_path, monkeypatch, capsys):
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from experiments import run  # pylint: disable=g-import-not-at-top
  def run_whose_last_round_gets_a_signal(config, output_dir, **kwargs):
    del config, output_dir, kwargs
    with training.StopSignals() as stop:  # as training.run's
      _raise_sigint_and_wait(stop)
    return {}
  monkeypatch.setattr(training, "run", run_whose_last_round_gets_a_signal)
  monkeypatch.setattr(run.cli, "start_command", lambda: None)
  with flagsaver.flagsaver():
    run.FLAGS(["run.py", f"--output_dir={tmp_path}", "--rounds=2"])
    with pytest.raises(SystemExit) as e:
      run.main(["run.py"])
  assert e.value.code == 128 + signal.SIGINT
  assert capsys.readouterr().err == (
      "interrupted: SIGINT in the last round: the run finished and saved its "
      "results\n")


@pytest.mark.slow
def test_sigint_stops_a_sweep_with_the_command_that_continues_it(
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
  assert len(lines) == 2 and lines[0].startswith("interrupted"), lines
  prefix = "continue with: python -m "
  assert lines[1].startswith(prefix), lines
  printed = shlex.split(lines[1][len(prefix):])
  assert printed == args[2:], printed  # the command that was interrupted
  result = subprocess.run([sys.executable, "-m"] + printed, cwd=ROOT,
                          env=env, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr
  assert "| augfl.rho=0.7 |" in result.stdout
