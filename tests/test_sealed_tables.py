"""A table scores only what its runs sealed, and is never replaced by less.

* table2, sweep and compare score a run from its newest checkpoint's
  sealed records: files copied from another run, edited or torn are
  refused in one line with the ``experiments.run ... --resume`` command,
  which writes them again from the checkpoint (``changes.jsonl`` too);
  a checkpoint without a seal is damaged everywhere.
* The seal is a SHA-256 of the metadata; an earlier version's CRC-32 seal
  is still checked, by its own rule.
* A list naming nothing is refused; a sweep with another grid does not
  replace its table; tables and figures are replaced whole or not at all,
  and a table stopped between its files is one its rerun writes again.
* ``table2 --finished_only`` reads runs another command holds; compare
  refuses one run under two names.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import zlib

import matplotlib.figure
import numpy as np
import pytest

from augfl_jax import training
from augfl_jax.core import fields
from augfl_jax.storage import checkpoint
from augfl_jax.training import checkpoints, outputs
from experiments import compare, curves, plot, scores, sweep, table2
from tests import run_files
from tests.test_harness_identity import QUIET, _base, _cell, _table
from tests.test_scores import _write_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.usefixtures("compile_cache")


def _env(compile_cache):
  return {**os.environ, "XDG_CACHE_HOME": compile_cache,
          "PYTHONUNBUFFERED": "1"}


def _command(compile_cache, module, *args, **kwargs):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                        env=_env(compile_cache), capture_output=True,
                        text=True, timeout=300, **kwargs)


def _meta_file(run_dir, step):
  return os.path.join(run_dir, "checkpoints", f"step_{step}", "meta",
                      "metadata")


# ----------------------------------------------------------------------------
# Scores come from what a run sealed.


@pytest.mark.slow
def test_files_copied_from_another_run_are_refused_until_resume_rewrites(
    tmp_path, compile_cache):
  """FedAvg seed 0 given AugFL w/o PM's metrics.jsonl and summary.json:
  table2 (running or --finished_only), sweep and compare refuse it in one
  line naming the file and the resume command; that command writes them
  again from the checkpoint, and the table reads FedAvg's own number."""
  methods = ("fedavg", "augfl_wo_pm")
  _table(tmp_path, methods=methods)
  fedavg, other = _cell(tmp_path), _cell(tmp_path, "augfl_wo_pm")
  own = scores.load_run_score(fedavg, "fedavg", 0).test_split.interval.mean
  theirs = scores.load_run_score(other, "x", 0).test_split.interval.mean
  assert own != theirs
  for name in ("metrics.jsonl", "summary.json"):
    shutil.copy(os.path.join(other, name), os.path.join(fedavg, name))
  messages = []
  for refuse in (
      lambda: _table(tmp_path, methods=methods, finished_only=True),
      lambda: _table(tmp_path, methods=methods),
      lambda: sweep.finished_run(fedavg, _base(), log=QUIET),
      lambda: compare.compare({"fedavg": fedavg, "other": other})):
    with pytest.raises(ValueError) as e:
      refuse()
    messages.append(str(e.value))
  for message in messages:
    assert "\n" not in message and "--overwrite" not in message
    assert message.startswith(
        f"{fedavg}: metrics.jsonl's record of round 1 is not the one the "
        "checkpoint sealed (and 1 more): not what its checkpoint "
        f"{fedavg}/checkpoints/step_2 sealed"), message
    assert message.endswith(" --resume"), message
  command = shlex.split(messages[0].partition(" with: ")[2])
  assert command[:3] == ["python", "-m", "experiments.run"]
  result = _command(compile_cache, *command[2:])
  assert result.returncode == 0, result.stderr
  assert "written again from" in result.stdout
  text = _table(tmp_path, methods=methods, finished_only=True)
  assert scores.load_run_score(fedavg, "fedavg", 0).test_split.interval.mean \
      == own
  assert f"| FedAvg | {100 * own:.2f}" in text


def test_a_checkpoint_without_a_seal_is_refused_as_damaged(tmp_path):
  """The seal removed and the configuration edited (fedavg.lr 0.05 ->
  0.5): table2 does not reuse the run as the edited configuration, the
  scores and --resume refuse it as damaged, each in one line."""
  _table(tmp_path)
  run_dir = _cell(tmp_path)
  path = _meta_file(run_dir, 2)
  meta = json.load(open(path))
  del meta[checkpoint.SEAL]
  meta["config"]["fedavg"]["lr"] = 0.5
  json.dump(meta, open(path, "w"))
  reason = "its metadata carries no seal: edited, or saved by a version"
  with pytest.raises(ValueError) as e:
    _table(tmp_path, _base(**{"fedavg.lr": 0.5}), replace_results=True)
  assert reason in str(e.value) and str(e.value).endswith(
      f"remove {run_dir} to run it again, or choose another --output_dir")
  with pytest.raises(ValueError, match=f"its newest checkpoint {path[:-14]} "
                     f"does not read back \\({reason}"):
    scores.load_run_score(run_dir, "fedavg", 0)
  with pytest.raises(checkpoints.CheckpointError, match=reason):
    training.run(_base(**{"fedavg.lr": 0.5}), run_dir, log=QUIET,
                 resume=True)


def test_an_unsealed_newest_checkpoint_is_trained_again_from_the_one_before(
    tmp_path):
  """With a checkpoint before it, table2 says the newest is damaged and
  continues from the one before, as --resume does; the table scores the
  run it sealed again."""
  _table(tmp_path, checkpoint_every=1)
  run_dir = _cell(tmp_path)
  path = _meta_file(run_dir, 2)
  meta = json.load(open(path))
  del meta[checkpoint.SEAL]
  json.dump(meta, open(path, "w"))
  lines = []
  table2.run_table(_base(), ["digits"], ["fedavg"], [0],
                   str(tmp_path / "runs"), checkpoint_every=1,
                   results_dir=str(tmp_path / "results"), log=lines.append)
  damaged = [l for l in lines if "step_2 is damaged (its metadata carries "
             "no seal" in l]
  assert damaged and any("continuing" in l for l in lines), lines
  assert any("resuming from round 1" in l for l in lines), lines
  assert run_files.steps(run_dir) == [1, 2]
  assert "metadata_sha256" in json.load(open(path))


# ----------------------------------------------------------------------------
# The seal.


def test_the_seal_is_a_sha256_and_an_earlier_crc32_seal_still_reads(
    tmp_path):
  body = {"round": 1, "checksums": {"['w']": 5}}
  sealed = checkpoint.seal(body)
  assert sealed[checkpoint.SEAL] == hashlib.sha256(
      json.dumps(body, sort_keys=True).encode()).hexdigest()
  assert checkpoint.check_seal(sealed, "x") == checkpoint.SEAL
  # A run's step sealed by the earlier version: read by its rule, saying so.
  root = str(tmp_path / "ckpt")
  manager = checkpoints.RunCheckpoints(root)
  manager.save(1, {"w": np.ones(3, np.float32)}, {"round": 1, "config": {}})
  manager.close()
  path = os.path.join(root, "step_1", "meta", "metadata")
  meta = json.load(open(path))
  del meta[checkpoint.SEAL]
  meta[checkpoint.OLD_SEAL] = zlib.crc32(json.dumps(
      meta, sort_keys=True).encode())
  json.dump(meta, open(path, "w"))
  lines = []
  step, tree, _ = checkpoints.RunCheckpoints(root).restore(
      {"w": np.zeros(3, np.float32)}, lines.append)
  assert step == 1 and np.all(tree["w"] == 1)
  assert lines == [f"checkpoint {root}/step_1 is sealed by an older version "
                   "(a CRC-32 of its metadata, checked by that rule)"]
  meta["round"] = 2  # an edit that does not recompute it
  json.dump(meta, open(path, "w"))
  with pytest.raises(checkpoint.DamagedCheckpointError,
                     match="does not match its checksum"):
    checkpoints.RunCheckpoints(root).read_meta(1)
  # A single checkpoint (a PM's): checksums without a seal are damaged; an
  # earlier CRC-32 seal reads, and its note says so.
  single = str(tmp_path / "pm")
  checkpoint.save(single, {"w": np.ones(2)}, {"epochs": 3})
  path = os.path.join(single, "metadata", "metadata")
  meta = json.load(open(path))
  del meta[checkpoint.SEAL]
  json.dump(meta, open(path, "w"))
  with pytest.raises(checkpoint.DamagedCheckpointError,
                     match="holds checksums but no seal"):
    checkpoint.restore_metadata(single)
  meta[checkpoint.OLD_SEAL] = zlib.crc32(json.dumps(
      meta, sort_keys=True).encode())
  json.dump(meta, open(path, "w"))
  assert checkpoint.restore_metadata(single) == {"epochs": 3}
  assert checkpoint.seal_note(single).startswith("sealed by an older version")


# ----------------------------------------------------------------------------
# Torn files: --resume writes them again, and every message says so.


def test_torn_files_name_resume_which_writes_them_again(tmp_path):
  """A torn summary.json, config.json or middle line of metrics.jsonl of a
  finished run: table2's scores, compare and plot name --resume (never
  --overwrite), and --resume writes the file again from the checkpoint."""
  _table(tmp_path)
  run_dir = _cell(tmp_path)
  before = {n: open(os.path.join(run_dir, n)).read()
            for n in ("summary.json", "config.json", "metrics.jsonl")}
  lines = before["metrics.jsonl"].splitlines()
  torn = {"summary.json": before["summary.json"][:30],
          "config.json": before["config.json"][:30],
          "metrics.jsonl": lines[0][:30] + "\n" + lines[1] + "\n"}
  for name, text in torn.items():
    with open(os.path.join(run_dir, name), "w") as f:
      f.write(text)
    refusals = [lambda: scores.load_run_score(run_dir, "fedavg", 0)]
    if name != "summary.json":
      refusals.append(lambda: curves.read_run(run_dir, QUIET))
    if name == "config.json":
      refusals.append(lambda: compare.run_dirs({"a": run_dir}, None))
    for refuse in refusals:
      with pytest.raises(ValueError) as e:
        refuse()
      message = str(e.value)
      assert name in message and "--resume" in message, message
      assert "--overwrite" not in message and "\n" not in message
    lines_logged = []
    training.run(_base(), run_dir, log=lines_logged.append, resume=True)
    assert any(f"{name}" in l and "written again from" in l
               for l in lines_logged), lines_logged
    if name == "summary.json":
      assert json.load(open(os.path.join(run_dir, name)))["rounds"] == 2
    else:
      assert open(os.path.join(run_dir, name)).read() == before[name]
    scores.load_run_score(run_dir, "fedavg", 0)


def test_a_torn_changes_jsonl_is_written_again_from_the_checkpoint(tmp_path):
  """The step size a resume changed is recorded in the checkpoint too: a
  torn changes.jsonl loses nothing."""
  out = str(tmp_path / "run")
  config = _base(rounds=1)
  training.run(config, out, log=QUIET)
  changed = _base(rounds=2, **{"fedavg.lr": 0.04})
  training.run(changed, out, log=QUIET, resume=True,
               resume_changes=("fedavg.lr",))
  path = os.path.join(out, "changes.jsonl")
  recorded = [json.loads(l) for l in open(path)]
  assert [r["changes"] for r in recorded] == [{"fedavg.lr": [0.05, 0.04]}]
  with open(path, "w") as f:
    f.write(json.dumps(recorded[0])[:25])  # a crash while it was written
  summary = training.run(fields.replace(changed, rounds=3), out, log=QUIET,
                         resume=True, resume_changes=("fedavg.lr",))
  assert [json.loads(l) for l in open(path)] == recorded
  assert summary["resume_changes"] == recorded


# ----------------------------------------------------------------------------
# Lists, grids and tables.


def test_lists_naming_nothing_and_a_seed_grid_are_refused(tmp_path):
  for flag, values in (("methods", ([], ["digits"], [0])),
                       ("datasets", (["fedavg"], [], [0])),
                       ("seeds", (["fedavg"], ["digits"], []))):
    methods, datasets, seeds = values
    with pytest.raises(ValueError, match=f"^--{flag} names nothing; name at "
                       "least one$"):
      table2.run_table(_base(), datasets, methods, seeds,
                       str(tmp_path / "runs"),
                       results_dir=str(tmp_path / "results"))
  assert not os.path.exists(tmp_path / "runs")
  with pytest.raises(ValueError, match="^--seeds names nothing"):
    sweep.parse_list([], int, "seeds")
  with pytest.raises(ValueError, match=r"^--grid: seed=0,1: every cell runs "
                     "every seed of --seeds; pass --seeds=0,1$"):
    sweep.parse_grid("augfl.rho=0.7;seed=0,1")


@pytest.mark.slow
def test_a_sweep_never_replaces_its_table_by_less(tmp_path, compile_cache):
  """Another grid, or seeds naming nothing, into a sweep's directory: one
  line, exit 2, the table as it was; --replace_results replaces it."""
  out = tmp_path / "sweep"

  def run(*args):
    return _command(compile_cache, "experiments.sweep", "--rounds=1",
                    "--augfl.lam=0", f"--output_dir={out}", *args)
  result = run("--grid=augfl.rho=0.7", "--seeds=0")
  assert result.returncode == 0, result.stderr
  table = (out / "results.md").read_text()
  for args, message in (
      (("--grid=augfl.rho=0.2", "--seeds=0"),
       f"error: {out}/results.md holds a table of another configuration "
       "(cell augfl.rho=0.7 missing); pass --output_dir=DIR to run the new "
       "sweep elsewhere, or --replace_results to replace its table"),
      (("--grid=augfl.rho=0.7", "--seeds="),
       "error: --seeds names nothing; name at least one"),
      (("--grid=seed=0,1",), "error: --grid: seed=0,1: every cell runs every "
       "seed of --seeds; pass --seeds=0,1")):
    line = run_files.one_line(run(*args))
    assert line.startswith(message), line
    assert (out / "results.md").read_text() == table
  assert json.load(open(out / "results.json"))["seeds"] == [0]
  result = run("--grid=augfl.rho=0.7,0.2", "--seeds=0")  # more: kept
  assert result.returncode == 0, result.stderr
  assert "| augfl.rho=0.7 |" in result.stdout
  result = run("--grid=augfl.rho=0.2", "--seeds=0", "--replace_results")
  assert result.returncode == 0, result.stderr
  assert "augfl.rho=0.7" not in (out / "results.md").read_text()
  line = run_files.one_line(_command(compile_cache, "experiments.table2",
                                     "--methods=", f"--output_dir={out}"))
  assert line == "error: --methods names nothing; name at least one"


def test_a_table_stopped_between_its_files_is_written_again(tmp_path,
                                                             monkeypatch):
  """A table2 killed at any of its three writes, or leaving a temporary
  file behind: its rerun writes the table, and removes the temporary."""
  _table(tmp_path)
  write = outputs.write_text_atomic
  for kill_at in (1, 2, 3):
    results = tmp_path / f"results{kill_at}"
    calls = []

    def killed(path, text, kill_at=kill_at, results=results, calls=calls):
      if str(path).startswith(str(results)):
        calls.append(path)
        if len(calls) == kill_at:
          raise KeyboardInterrupt  # the process dies here
      write(path, text)
    monkeypatch.setattr(outputs, "write_text_atomic", killed)
    table = lambda results=results: table2.run_table(
        _base(), ["digits"], ["fedavg"], [0], str(tmp_path / "runs"),
        results_dir=str(results), log=QUIET)
    with pytest.raises(KeyboardInterrupt):
      table()
    monkeypatch.setattr(outputs, "write_text_atomic", write)
    text = table()
    assert (results / "digits" / "table2.md").read_text() == text
  stale = results / "digits" / ".tmp-123-0123abcd-table2.md"
  stale.write_text("half a table")  # what a kill -9 mid-write leaves
  assert table() == text
  assert not stale.exists()


def test_compare_and_plot_replace_their_output_whole_or_not_at_all(
    tmp_path, monkeypatch):
  """A figure whose write fails half-way (a full disk): the figure there
  before is kept whole, and the one line names --output."""
  runs = tmp_path / "runs"
  (runs / "a").mkdir(parents=True)
  (runs / "a" / "config.json").write_text(json.dumps(
      {"algorithm": "fedavg", "dataset": "digits", "seed": 0}))
  (runs / "a" / "metrics.jsonl").write_text(json.dumps(
      {"round": 1, "accuracy": 0.5, "train_loss": 1.0}) + "\n")
  figure = tmp_path / "curves.png"
  plot.plot_curves(plot.group_curves(plot.find_runs([str(runs)])),
                   str(figure))
  before = figure.read_bytes()
  savefig = matplotlib.figure.Figure.savefig

  def full_disk(self, fname, **kwargs):
    savefig(self, fname, **kwargs)
    with open(fname, "r+b") as f:
      f.truncate(100)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
  with pytest.raises(plot.PlotError) as e:
    plot.plot_curves(plot.group_curves(plot.find_runs([str(runs)])),
                     str(figure), title="again")
  assert str(e.value) == (f"--output={figure} could not be written (No "
                          "space left on device); the file there before, if "
                          "any, is unchanged")
  assert figure.read_bytes() == before
  assert sorted(os.listdir(tmp_path)) == ["curves.png", "runs"]


@pytest.mark.slow
def test_compare_output_on_a_full_disk_keeps_the_table_before(tmp_path):
  a = _write_run(tmp_path / "a", [9, 8, 10, 7], [18, 17, 19, 15, 20])
  b = _write_run(tmp_path / "b", [7, 8, 9, 6], [16, 18, 19, 17, 18])
  out = tmp_path / "table.md"
  out.write_text("the table before\n")

  def small_files():  # a table of more than 100 bytes cannot be written
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
  result = subprocess.run(
      [sys.executable, "-m", "experiments.compare", f"--runs=a={a}",
       f"--runs=b={b}", f"--output={out}"], cwd=ROOT, capture_output=True,
      text=True, timeout=120, preexec_fn=small_files)
  line = run_files.one_line(result)
  assert line == (f"error: --output={out} could not be written (File too "
                  "large); the file there before, if any, is unchanged")
  assert out.read_text() == "the table before\n"
  assert sorted(os.listdir(tmp_path)) == ["a", "b", "table.md"]


# ----------------------------------------------------------------------------
# Reading without the lock; one run under two names.


def test_finished_only_reads_runs_another_command_holds(tmp_path):
  """The runs' directory held by another command (or one this process
  may not write): --finished_only tabulates them, taking no lock there."""
  _table(tmp_path)
  runs = tmp_path / "runs"
  with run_files.lock_held_by_another_process(str(runs / ".augfl_jax.lock")):
    text = _table(tmp_path, finished_only=True)
  assert "| FedAvg |" in text
  copy = tmp_path / "copy"
  shutil.copytree(runs, copy, ignore=shutil.ignore_patterns(".augfl_jax.lock"))
  table2.run_table(_base(), ["digits"], ["fedavg"], [0], str(copy),
                   results_dir=str(tmp_path / "results2"), log=QUIET,
                   finished_only=True)
  assert not os.path.exists(copy / ".augfl_jax.lock")


def test_compare_refuses_one_run_under_two_names(tmp_path):
  a = _write_run(tmp_path / "seeds" / "seed0", [9, 8, 10, 7], None)
  (tmp_path / "link").symlink_to(a)
  b = _write_run(tmp_path / "b", [7, 8, 9, 6], None)
  for runs in ({"x": a, "y": a}, {"x": a, "y": str(tmp_path / "link")},
               {"x": str(tmp_path / "seeds"), "y": a, "z": b}):
    with pytest.raises(ValueError, match="^--runs: x and y name the same "
                       "run"):
      compare.compare(runs, [0])
  assert "| 0 |" in compare.compare({"x": a, "y": b})
