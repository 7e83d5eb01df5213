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
  assert [(r["cell"], r["augfl.rho"]) for r in rows] == [
      ("augfl.rho=0.7", "0.7"), ("augfl.rho=0.2", "0.2")]
  for args, message in (
      (["--grid=rho=0.7"], "error: bad --grid entry 'rho=0.7'"),
      (["--grid=augfl.rho=0"], "error: --grid cell augfl.rho=0.0: augfl.rho "
       "must be > 0"),
      (["--overwrite"], "error: --overwrite: a comparison command"),
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
  monkeypatch.setattr(run.run_flags, "start_command", lambda: None)
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
