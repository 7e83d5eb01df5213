"""experiments.plot: one curve per configuration (mean ± std across seeds),
labelled by the fields that differ, never merging different configurations,
never two datasets on one axis, training losses per algorithm."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(algorithm="augfl", lam=5.0, dataset="digits", seed=0, **extra):
  """A flat config.json like the runner's (with its algorithm_config)."""
  algorithm_config = ({"alpha": 0.03, "lam": lam} if algorithm != "fedavg"
                      else {"lr": 0.05})
  return {"algorithm": algorithm, "dataset": dataset, "seed": seed,
          "lam": lam if algorithm != "fedavg" else None, "rounds": 30,
          "strategy": "map", "eval_every": 10,
          "algorithm_config": algorithm_config, **extra}


def _nested(lam, seed=0, output_dir="runs/x"):
  return {"algorithm": "augfl", "dataset": "digits", "seed": seed,
          "rounds": 30, "augfl": {"alpha": 0.03, "lam": lam},
          "model": {"name": "mlp", "hidden": [64]},
          "output": {"dir": output_dir}}


def _run(path, config, accuracies, train_loss=1.0):
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps(config))
  (path / "metrics.jsonl").write_text("".join(
      json.dumps({"round": 10 * (i + 1), "accuracy": a,
                  "train_loss": train_loss / (i + 1), "test_loss": 2.0 - a})
      + "\n" for i, a in enumerate(accuracies)))


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.plot", *args],
                        cwd=ROOT, capture_output=True, text=True, check=False,
                        timeout=120)


def _labels(tmp_path, label_by=None):
  curves = plot.group_curves(plot.find_runs([str(tmp_path)]), label_by)
  return [c.label for c in curves], curves


def test_lambdas_are_curves_labelled_and_sorted_by_value(tmp_path):
  for lam in (5.0, 10.0, 0.0):  # "10" < "5" as text
    _run(tmp_path / f"lam{lam:g}", _config(lam=lam), [0.5, 0.6])
  out = tmp_path / "curves.png"
  result = _cli(str(tmp_path), f"--output={out}")
  assert result.returncode == 0, result.stderr
  assert "3 curves (lam=0; lam=5; lam=10)" in result.stdout
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  labels, curves = _labels(tmp_path)
  assert labels == ["lam=0", "lam=5", "lam=10"]
  assert [len(c.runs) for c in curves] == [1, 1, 1]


def test_values_are_readable(tmp_path):
  _run(tmp_path / "a", _config(lam=0.05000000001), [0.5])
  _run(tmp_path / "b", _config(lam=0.1, uniform_weights=True), [0.5])
  _run(tmp_path / "c", _config(lam=0.1, uniform_weights=False), [0.5])
  labels, _ = _labels(tmp_path)
  assert labels == ["lam=0.05", "lam=0.1, uniform_weights=false",
                    "lam=0.1, uniform_weights=true"]


def test_seeds_are_one_band_over_their_common_rounds(tmp_path):
  # Seeds, and run-control fields (rounds, strategy), vary between repeats.
  _run(tmp_path / "seed0", _config(seed=0), [0.5, 0.7, 0.9])
  _run(tmp_path / "seed1", _config(seed=1, rounds=20, strategy="vmap"),
       [0.3, 0.5])
  (curve,) = plot.group_curves(plot.find_runs([str(tmp_path)]))
  assert curve.label == "augfl" and len(curve.runs) == 2
  assert curve.rounds == [10, 20]
  np.testing.assert_allclose(curve.metrics["accuracy"].mean(0), [0.4, 0.6])
  fig = plot.make_figure([curve])
  assert any("std across seeds" in ax.get_ylabel() for ax in fig.axes)
  _run(tmp_path / "again" / "seed1", _config(seed=1), [0.3, 0.5])
  with pytest.raises(ValueError, match=r"seed \(1\): pass only one"):
    plot.group_curves(plot.find_runs([str(tmp_path)]))


def test_two_datasets_are_not_merged(tmp_path):
  _run(tmp_path / "a", _config(dataset="digits"), [0.5])
  _run(tmp_path / "b", _config(dataset="mnist"), [0.9])
  with pytest.raises(ValueError, match="digits, mnist"):  # plot.PlotError
    plot.group_curves(plot.find_runs([str(tmp_path)]), ["algorithm"])
  result = _cli(str(tmp_path), f"--output={tmp_path / 'c.png'}")
  assert result.returncode == 2
  assert result.stderr.count("\n") == 1 and "datasets" in result.stderr
  assert not (tmp_path / "c.png").exists()


@pytest.mark.slow
def test_label_by_that_would_merge_configurations_is_refused(tmp_path):
  _run(tmp_path / "lam0", _config(lam=0.0), [0.5])
  _run(tmp_path / "lam5", _config(lam=5.0), [0.7])
  with pytest.raises(ValueError, match="differ in lam"):  # plot.PlotError
    plot.group_curves(plot.find_runs([str(tmp_path)]), ["algorithm"])
  result = _cli(str(tmp_path), "--label_by=algorithm",
                f"--output={tmp_path / 'c.png'}")
  assert result.returncode == 2 and result.stderr.count("\n") == 1
  assert "lam" in result.stderr and not (tmp_path / "c.png").exists()
  labels, _ = _labels(tmp_path, ["algorithm", "lam"])  # separates them
  assert labels == ["augfl, lam=0", "augfl, lam=5"]


def test_flat_and_nested_configs(tmp_path):
  assert plot.flatten(_nested(5.0))["augfl.lam"] == 5.0
  assert plot.flatten(_nested(5.0))["model.hidden"] == [64]
  for lam in (10.0, 0.0):
    for seed in (0, 1):  # another output section per seed: one curve
      _run(tmp_path / f"lam{lam:g}" / f"seed{seed}",
           _nested(lam, seed, f"runs/{seed}"), [0.5 + seed / 10])
  labels, curves = _labels(tmp_path)
  assert labels == ["lam=0", "lam=10"] and [len(c.runs) for c in curves] == [2, 2]
  assert _labels(tmp_path, ["lam"])[0] == labels
  assert _labels(tmp_path, ["augfl.lam"])[0] == labels
  with pytest.raises(plot.PlotError, match="lam"):
    plot.group_curves(plot.find_runs([str(tmp_path)]), ["model.name"])


@pytest.mark.slow
def test_unreadable_config_is_one_line(tmp_path):
  _run(tmp_path / "a", _config(), [0.5])
  (tmp_path / "a" / "config.json").write_text("{not json")
  result = _cli(str(tmp_path), f"--output={tmp_path / 'c.png'}")
  assert result.returncode == 2 and result.stderr.count("\n") == 1
  assert "config.json" in result.stderr or "unreadable" in result.stderr
  result = _cli(str(tmp_path / "nothing"))
  assert result.returncode == 2 and "no run" in result.stderr


def test_training_losses_of_different_algorithms_get_their_own_panels(
    tmp_path):
  _run(tmp_path / "augfl0", _config(lam=0.0), [0.5], train_loss=0.5)
  _run(tmp_path / "augfl5", _config(lam=5.0), [0.6], train_loss=0.4)
  _run(tmp_path / "fedavg", _config(algorithm="fedavg"), [0.4],
       train_loss=2.0)
  labels, curves = _labels(tmp_path)
  assert labels == ["augfl, lam=0", "augfl, lam=5", "fedavg"]
  fig = plot.make_figure(curves)
  titles = [ax.get_title() for ax in fig.axes if ax.has_data()]
  assert titles == ["test-client accuracy",
                    "test loss (query CE after adaptation)",
                    "training loss: augfl", "training loss: fedavg"]
  for ax in fig.axes[2:4]:  # one algorithm's curves per training-loss panel
    assert len(ax.get_lines()) == (2 if ax.get_title().endswith("augfl") else 1)
  text = " ".join(t.get_text() for t in fig.texts)
  assert "not comparable across algorithms" in text
  assert "also differ" in text and "lr" in text  # named, not hidden


def test_one_algorithm_has_one_training_loss_panel(tmp_path):
  _run(tmp_path / "a", _config(lam=0.0), [0.5])
  _run(tmp_path / "b", _config(lam=5.0), [0.6])
  fig = plot.make_figure(_labels(tmp_path)[1], "title")
  assert [ax.get_title() for ax in fig.axes if ax.has_data()] == [
      "test-client accuracy", "test loss (query CE after adaptation)",
      "training loss"]
  out = tmp_path / "curves.png"
  plot.plot_curves(_labels(tmp_path)[1], str(out), "title")
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_another_algorithms_section_does_not_label_a_curve(tmp_path):
  """A FedAvg run's augfl section (unused by it) is not its configuration:
  the curves are told apart by the algorithm and AugFL's lam alone."""
  for lam in (0.0, 5.0):
    _run(tmp_path / f"augfl{lam:g}", _nested(lam), [0.5, 0.6])
  fedavg = {**_nested(5.0), "algorithm": "fedavg",
            "fedavg": {"lr": 0.05}}
  _run(tmp_path / "fedavg", fedavg, [0.7, 0.8])
  labels, _ = _labels(tmp_path)
  assert sorted(labels) == ["augfl, lam=0", "augfl, lam=5", "fedavg"]


def test_the_pm_sections_of_a_run_without_a_pm_are_not_compared(tmp_path):
  """FedAvg and AugFL at lam 0 read no ``pm`` or ``crd`` section: the
  sections their config.json records neither label nor fold a curve."""
  with_pm = {**_nested(5.0), "pm": {"model": "cnn"}, "crd": {"nce_k": 64}}
  _run(tmp_path / "augfl5", with_pm, [0.5, 0.6])
  for seed, pm in enumerate(("cnn", "resnet8x4")):
    _run(tmp_path / f"fedavg{seed}", {
        **_nested(5.0, seed=seed), "algorithm": "fedavg",
        "pm": {"model": pm}, "crd": {"nce_k": 16384}}, [0.7, 0.8])
  _run(tmp_path / "augfl0", {**_nested(0.0), "pm": {"model": "resnet8x4"},
                             "crd": {"nce_k": 16384}}, [0.6, 0.7])
  labels, curves = _labels(tmp_path)
  assert sorted(labels) == ["augfl, lam=0", "augfl, lam=5", "fedavg"]
  fedavg = next(c for c in curves if c.label == "fedavg")
  assert len(fedavg.runs) == 2  # seeds of one configuration
  assert not [f for c in curves for f in c.folded
              if f.startswith(("pm.", "crd."))]
