"""The commands around a run reuse, score and compare a run by what it is
(its sealed checkpoint, its last round, the identity of the clients it
scored), not by what its files say; one command writes a results
directory at a time; lists that name something twice are refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from augfl_jax import training
from augfl_jax.core import fields
from augfl_jax.storage import checkpoint
from experiments import scores, sweep, table2
from tests import run_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = lambda line: None  # noqa: E731

pytestmark = pytest.mark.usefixtures("compile_cache")


def _base(**changes):
  """FedAvg on digits, two rounds, 50 test-split clients: seconds."""
  return fields.replace(training.RunConfig(
      algorithm="fedavg", rounds=2, eval_every=1), **{
          "eval.test_clients": 50, **changes})


def _table(tmp_path, base=None, methods=("fedavg",), seeds=(0,), **kwargs):
  return table2.run_table(base or _base(), ["digits"], list(methods),
                          list(seeds), str(tmp_path / "runs"),
                          results_dir=str(tmp_path / "results"), log=QUIET,
                          **kwargs)


def _cell(tmp_path, method="fedavg", seed=0):
  return str(tmp_path / "runs" / "digits" / method / f"seed{seed}")


def test_a_cell_is_reused_by_its_sealed_configuration(tmp_path):
  """An edited config.json does not make a run of another configuration
  reusable: its checkpoint says what it was trained with; nor is the run
  reused with a config.json that is not what it sealed, until a resume
  writes it again."""
  _table(tmp_path)
  path = os.path.join(_cell(tmp_path), "config.json")
  config = json.load(open(path))
  config["fedavg"]["lr"] = 0.5
  with open(path, "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match=r"holds a run of another "
                     r"configuration \(fedavg.lr: 0.05 -> 0.5\)"):
    _table(tmp_path, _base(**{"fedavg.lr": 0.5}), replace_results=True)
  with pytest.raises(ValueError, match=r"config.json is of another "
                     r"configuration than the checkpoint's \(fedavg.lr: "
                     r"0.05 -> 0.5\)"):
    _table(tmp_path)
  training.run(_base(), _cell(tmp_path), log=QUIET, resume=True)
  assert json.load(open(path))["fedavg"]["lr"] == 0.05
  _table(tmp_path)  # what it is: reused


def test_a_run_that_went_on_after_it_finished_is_not_scored_as_finished(
    tmp_path):
  """A finished 2-round cell resumed to 4 rounds and stopped (its summary
  still of 2 rounds, its records and checkpoints of 4) is neither reused
  nor scored as a 2-round run."""
  _table(tmp_path)
  run_dir = _cell(tmp_path)
  summary = open(os.path.join(run_dir, "summary.json")).read()
  training.run(_base(rounds=4), run_dir, log=QUIET, resume=True,
               checkpoint_every=1)
  with open(os.path.join(run_dir, "summary.json"), "w") as f:
    f.write(summary)  # as a stopped resume leaves it
  with pytest.raises(ValueError, match="holds a run at round 4, beyond "
                     "--rounds=2"):
    _table(tmp_path)
  with pytest.raises(ValueError, match="its last evaluation is of round 4, "
                     "but its summary.json of a 2-round run"):
    scores.load_run_score(run_dir, "fedavg", 0)


def _rewrite_records(run_dir, records):
  """``records`` in the run's metrics.jsonl and in its newest checkpoint,
  sealed again: an edit by someone who recomputes the seal."""
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
  step = max(int(n.partition("_")[2]) for n in os.listdir(
      os.path.join(run_dir, "checkpoints")) if n.startswith("step_"))
  path = os.path.join(run_dir, "checkpoints", f"step_{step}", "meta",
                      "metadata")
  with open(path) as f:
    meta = json.load(f)
  with open(path, "w") as f:
    json.dump(checkpoint.seal({**meta, "records": records}), f)


def test_edited_or_torn_scores_are_refused_or_dropped(tmp_path):
  _table(tmp_path)
  run_dir = _cell(tmp_path)
  path = os.path.join(run_dir, "metrics.jsonl")
  lines = open(path).read().splitlines()
  # A torn last line (a run stopped mid-write): dropped, saying so.
  with open(path, "w") as f:
    f.write("\n".join(lines) + '\n{"round": 3, "accu')
  notes = []
  score = scores.load_run_score(run_dir, "fedavg", 0, notes.append)
  assert score.rounds == 2 and "dropped its last line" in notes[0]
  # Edited in metrics.jsonl: not what the checkpoint sealed.
  record = json.loads(lines[-1])
  record["test_split"]["client_correct"][0] += 1
  with open(path, "w") as f:
    f.write("\n".join(lines[:-1] + [json.dumps(record)]) + "\n")
  with pytest.raises(ValueError, match="metrics.jsonl's record of round 2 "
                     "is not the one the checkpoint sealed"):
    scores.load_run_score(run_dir, "fedavg", 0)
  # Edited in both, the seal recomputed: scores no run writes are refused.
  for key, value in (("client_correct", -5), ("client_count", float("nan"))):
    record = json.loads(lines[-1])
    record["test_split"][key] = [value] * len(record["test_split"][key])
    _rewrite_records(run_dir, [json.loads(l) for l in lines[:-1]] + [record])
    with pytest.raises(ValueError, match="test-split scores"):
      scores.load_run_score(run_dir, "fedavg", 0)
  for section, key in (("test_split", "client_correct"),
                       (None, "client_accuracy")):
    record = json.loads(lines[-1])
    scored = record[section] if section else record
    scored[key] = scored[key][:-1]  # a list cut short
    _rewrite_records(run_dir, [json.loads(l) for l in lines[:-1]] + [record])
    with pytest.raises(ValueError, match=rf"{path}: the .* scores are not a "
                       r"run's \(\d+ per-client scores for \d+ query sizes"):
      scores.load_run_score(run_dir, "fedavg", 0)


def test_a_table_scores_every_run_on_the_same_clients(tmp_path):
  _table(tmp_path, methods=("fedavg", "augfl_wo_pm"))
  run_dir = _cell(tmp_path, "augfl_wo_pm")
  records = run_files.records(run_dir)
  del records[-1]["test_split"]
  _rewrite_records(run_dir, records)
  with pytest.raises(ValueError, match="scored no test-split clients where "
                     "the table's other runs did"):
    _table(tmp_path, methods=("fedavg", "augfl_wo_pm"), finished_only=True)


def _score(run_dir, digest, **protocol):
  counts = np.full(4, 10)
  return scores.RunScore(
      "m", 0, run_dir, 2, scores.ClientScores(counts - 1, counts, digest),
      None, 0.9, 1.0, {"dataset": "fashion_mnist", "seed": 0,
                       "data.server_size": 10000, **protocol})


def test_a_paired_difference_needs_the_same_clients():
  """Equal query sizes are not enough: the identities of the clients (or,
  for runs without one, their protocols) must be equal."""
  a = _score("a", "d1")
  scores.check_same_clients(a, _score("b", "d1"), False)
  for other, what in ((_score("b", "d1", dataset="mnist"),
                       "dataset 'fashion_mnist' against 'mnist'"),
                      (_score("b", "d1", **{"data.server_size": 5000}),
                       "data.server_size 10000 against 5000"),
                      (_score("b", "d2"), "the clients' examples differ")):
    with pytest.raises(ValueError, match="not scored on the same clients: "
                       rf".*{what}"):
      scores.check_same_clients(a, other, False)
    with pytest.raises(ValueError):
      scores.paired([a, dataclasses_replace(other, method="n")], "m", "n",
                    False)


def dataclasses_replace(score, **changes):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(score, **changes)


def test_runs_record_the_identity_of_the_clients_they_scored(tmp_path):
  _table(tmp_path, methods=("fedavg", "augfl_wo_pm"))
  a = scores.load_run_score(_cell(tmp_path), "fedavg", 0)
  b = scores.load_run_score(_cell(tmp_path, "augfl_wo_pm"), "augfl_wo_pm", 0)
  assert a.test_split.digest and a.test_split.digest == b.test_split.digest
  assert a.heldout.digest == b.heldout.digest != a.test_split.digest


@pytest.mark.parametrize("flag,values", [("methods", ["fedavg", "fedavg"]),
                                         ("seeds", [0, 0, 1])])
def test_a_list_naming_something_twice_is_refused(tmp_path, flag, values):
  kwargs = {"methods": ["fedavg"], "seeds": [0], flag: values}
  with pytest.raises(ValueError, match=f"--{flag} names {values[0]} more "
                     "than once"):
    _table(tmp_path, **kwargs)
  assert not os.path.exists(tmp_path / "runs" / "digits")  # nothing ran


def test_one_command_writes_a_results_directory_at_a_time(tmp_path):
  """A second table2 into the directories another is writing stops at
  once, before it touches a run or a table."""
  results = tmp_path / "results" / "digits"
  results.mkdir(parents=True)
  with run_files.lock_held_by_another_process(
      str(results / ".augfl_jax.lock")) as holder:
    with pytest.raises(ValueError, match=rf"{results} is in use by another "
                       rf"command \(process {holder}\)"):
      _table(tmp_path)
    assert not os.path.exists(tmp_path / "runs" / "digits")
  _table(tmp_path)  # the lock dies with its holder


def test_an_interrupted_comparison_prints_the_command_that_continues(
    monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["table2.py", "--datasets=digits",
                                    "--seeds=0,1"])

  def body():
    raise training.RunInterrupted("SIGINT after round 3/10: the run state "
                                  "is saved in X", 2, 3, "X")

  with pytest.raises(SystemExit) as e:
    sweep.run_comparison(body)
  assert e.value.code == 130
  err = capsys.readouterr().err.splitlines()
  assert err[0].startswith("interrupted: SIGINT after round 3/10")
  assert err[1].startswith("continue with: python -m ")
  assert err[1].endswith(" --datasets=digits --seeds=0,1")
  assert "--resume" not in "".join(err)


@pytest.mark.slow
def test_table2_refuses_a_seed_it_would_ignore(tmp_path, compile_cache):
  result = subprocess.run(
      [sys.executable, "-m", "experiments.table2", "--seed=3",
       f"--output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
      timeout=300, env={**os.environ, "XDG_CACHE_HOME": compile_cache})
  assert result.returncode == 2
  assert result.stderr.strip() == ("error: --seed=3: this command runs every "
                                   "seed of --seeds; pass --seeds=3")


def test_copy_of_a_finished_table_cell_reads_back(tmp_path):
  """A finished cell copied elsewhere (its checkpoints with it) is reused
  there too: what it is travels with it."""
  _table(tmp_path)
  shutil.copytree(tmp_path / "runs", tmp_path / "copy")
  lines = []
  table2.run_table(_base(), ["digits"], ["fedavg"], [0],
                   str(tmp_path / "copy"),
                   results_dir=str(tmp_path / "results2"), log=lines.append)
  assert any("reusing" in line for line in lines)
