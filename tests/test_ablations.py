"""experiments.ablations: each study on a tiny grid (1 seed, 2 rounds, one
CRD minibatch per round), its tables and plots; the PMs are mlps with fresh
weights in tmp_path."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import jax
import pytest

from augfl_jax.core import fields
from augfl_jax import models, training
from augfl_jax.pm import pretrain
from augfl_jax.storage import checkpoint
from augfl_jax.training import defaults
from experiments import ablations, plot
from tests import fake_pm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.fixture(scope="module")
def pm_dir(tmp_path_factory):
  """An mlp PM checkpoint for digits (fresh weights)."""
  path = str(tmp_path_factory.mktemp("pm") / "digits_mlp")
  norm = training.validate(training.RunConfig()).norm  # the runs' default
  mlp = models.create_model("mlp", 10, norm=norm)
  params = models.init_params(mlp, jax.random.key(0), (8, 8, 1))
  fake_pm.save(path, mlp, "mlp", params=params)
  return path


def _base(**changes):
  """2 rounds, one CRD minibatch of 64 negatives per round."""
  return fields.replace(training.RunConfig(rounds=2), **{
      "crd.kt_steps": 1, "crd.nce_k": 64, **changes})


def _cells(out):
  """The cells of the study's table, in order (its rows across seeds)."""
  return [r["cell"] for r in csv.DictReader(
      open(os.path.join(out, "results.csv"))) if r["seed"] == "all"]


@pytest.mark.slow
def test_kt_study(tmp_path, pm_dir):
  out = str(tmp_path / "kt")
  base = _base(**{"pm.model": "mlp", "pm.dir": pm_dir})
  rows = ablations.run_study("kt", base, [0], out)
  assert [(r["algorithm"], r["augfl.lam"]) for r in rows] == [
      ("augfl", 0.0), ("augfl", 5.0), ("kt_only", 5.0)]
  assert _cells(out) == ["algorithm=augfl_augfl.lam=0.0",
                         "algorithm=augfl_augfl.lam=5.0",
                         "algorithm=kt_only_augfl.lam=5.0"]
  text = open(os.path.join(out, "results.md")).read()
  assert text.count("| algorithm=") == 6  # a row per cell, then per run
  assert "| minus algorithm=augfl_augfl.lam=0.0, 95% CI across seeds |" in (
      text)  # paired with the study's first cell
  assert os.path.getsize(os.path.join(out, "curves.png")) > 0
  # The curves are told apart by the cells' fields, named by their last part.
  curves = plot.group_curves(plot.find_runs([out]),
                             ["algorithm", "augfl.lam"])
  assert [c.label for c in curves] == ["AugFL w/o PM, lam=0",
                                       "AugFL w/ PM, lam=5",
                                       "KT-only, lam=5"]


@pytest.mark.slow
def test_lam_study_on_a_grid_of_its_own(tmp_path, pm_dir):
  out = str(tmp_path / "lam")
  base = _base(**{"pm.model": "mlp", "pm.dir": pm_dir})
  rows = ablations.run_study("lam", base, [0], out, lams=(0.0, 10.0))
  assert [r["augfl.lam"] for r in rows] == [0.0, 10.0]
  assert _cells(out) == ["algorithm=augfl_augfl.lam=0.0",
                         "algorithm=augfl_augfl.lam=10.0"]
  for name in ("results.md", "curves.png", "accuracy_vs_lambda.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0


@pytest.mark.slow
def test_pm_size_study_uses_one_pm_per_size(tmp_path, monkeypatch):
  # Three small mlp PMs instead of the digits sizes (cnns take longer), with
  # fresh weights in the default directories of a temporary PM root
  # (pretraining has its own tests).
  sizes = [("mlp", '{"hidden": [8]}'), ("mlp", '{"hidden": [16]}'),
           ("mlp", None)]
  monkeypatch.setitem(ablations.PM_SIZES, "digits", sizes)
  monkeypatch.setattr(defaults, "PM_ROOT", str(tmp_path / "root"))
  base = _base()
  dirs = []
  for name, kwargs in sizes:
    config = training.validate(fields.replace(
        base, **{"pm.model": name, "pm.kwargs": kwargs or ""}))
    mlp = models.create_model(name, 10, **defaults.model_kwargs(
        name, config.norm, kwargs or ""))
    fake_pm.save(config.pm.dir, mlp, name,
                 params=models.init_params(mlp, jax.random.key(0), (8, 8, 1)))
    dirs.append(config.pm.dir)
  out = str(tmp_path / "pm_size")
  rows = ablations.run_study("pm_size", base, [0], out)
  assert [(r["pm.model"], r.get("pm.kwargs")) for r in rows] == sizes
  assert len(set(dirs)) == 3  # one PM per size
  assert sorted(os.listdir(tmp_path / "root" / "pm")) == sorted(
      os.path.basename(d) for d in dirs)
  assert len(_cells(out)) == 3
  assert os.path.getsize(os.path.join(out, "curves.png")) > 0


def test_bad_lams_are_one_line_on_the_cli(tmp_path, compile_cache):
  result = subprocess.run(
      [sys.executable, "-m", "experiments.ablations", "--study=lam",
       "--lams=0,x", f"--output_dir={tmp_path}"], cwd=ROOT,
      capture_output=True, text=True, timeout=300,
      env={**os.environ, "XDG_CACHE_HOME": compile_cache})
  assert result.returncode == 2
  assert result.stderr.splitlines()[-1] == (
      "error: --lams takes float values separated by commas, got '0,x'")
  assert "Traceback" not in result.stderr


def test_the_pm_epochs_study_pairs_each_pm_with_the_run_without():
  assert ablations.study_cells("pm_epochs", "fashion_mnist",
                               pm_epochs=(1, 30)) == [
      {"augfl.lam": 0.0}, {"pm.epochs": 1}, {"pm.epochs": 30}]


@pytest.mark.slow
def test_pm_epochs_study(tmp_path, monkeypatch):
  """PMs pretrained for 1 and 2 epochs (each in its own directory under
  runs/pm, as a run pretrains them), each paired with w/o PM."""
  monkeypatch.chdir(tmp_path)
  out = str(tmp_path / "pm_epochs")
  base = _base(**{"pm.model": "mlp"})
  ablations.run_study("pm_epochs", base, [0, 1], out, pm_epochs=(1, 2))
  assert _cells(out) == ["augfl.lam=0.0", "pm.epochs=1", "pm.epochs=2"]
  text = open(os.path.join(out, "pm_strength.md")).read()
  rows = [l for l in text.splitlines() if l.startswith("| ")][1:]
  assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 2", "| w/o PM"]
  for epochs, row in zip((1, 2), rows):
    pm_dir = training.prepare(fields.replace(
        base, **{"pm.epochs": epochs})).config.pm.dir
    meta = checkpoint.restore_metadata(pm_dir)
    assert f"| {epochs} | {100 * meta['heldout_accuracy']:.2f} | " in row
    assert row.endswith(" | 2 |")  # seeds
  # the gain is the sweep table's paired difference to w/o PM
  table = open(os.path.join(out, "results.md")).read()
  gain = rows[0].split(" | ")[3]
  assert f"| pm.epochs=1 | " in table and gain in table
  with open(os.path.join(out, "pm_strength.png"), "rb") as f:
    assert f.read(4) == b"\x89PNG"
