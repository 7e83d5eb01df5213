"""experiments.plot: one curve per configuration (its seeds' mean with
their t-interval), labelled by its method's name and the fields that
differ, never merging different configurations, never two datasets on one
axis, training losses per algorithm; its output checked before any work,
a torn last line of metrics.jsonl dropped."""

import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

from augfl_jax.core import intervals
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


def _run(path, config, accuracies, train_loss=1.0, ci=None,
         test_split=None):
  """A run's files; ``ci``: each evaluation's interval across clients is
  its accuracy -+ ci; ``test_split``: the last one's test-split accuracy."""
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps(config))
  records = [{"round": 10 * (i + 1), "accuracy": a,
              "train_loss": train_loss / (i + 1), "test_loss": 2.0 - a}
             for i, a in enumerate(accuracies)]
  for r in records if ci is not None else ():
    r["accuracy_ci"] = [r["accuracy"] - ci, r["accuracy"] + ci]
  if test_split is not None:
    records[-1]["test_split"] = {"accuracy": test_split, "accuracy_ci": [
        test_split - 0.05, test_split + 0.05]}
  (path / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in records))


def _cli(*args, cwd=ROOT):
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
  return subprocess.run([sys.executable, "-m", "experiments.plot", *args],
                        cwd=cwd, capture_output=True, text=True, check=False,
                        timeout=120, env=env)


def _inside(fig):
  """Asserts that nothing of ``fig`` (its panels, labels, legend) lies
  outside it, where a file of its size would cut it off."""
  fig.canvas.draw()
  box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
  width, height = fig.get_size_inches()
  assert (box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width + 1e-9
          and box.y1 <= height + 1e-9), (box, width, height)


def _labels(tmp_path, label_by=None):
  curves = plot.group_curves(plot.find_runs([str(tmp_path)]), label_by)
  return [c.label for c in curves], curves


def test_lambdas_are_curves_labelled_and_sorted_by_value(tmp_path):
  for lam in (5.0, 10.0, 0.0):  # "10" < "5" as text
    _run(tmp_path / f"lam{lam:g}", _config(lam=lam), [0.5, 0.6])
  out = tmp_path / "curves.png"
  result = _cli(str(tmp_path), f"--output={out}")
  assert result.returncode == 0, result.stderr
  # a config.json without an augfl section: the algorithm's name
  assert ("3 curves (augfl, lam=0; augfl, lam=5; augfl, lam=10)"
          in result.stdout)
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  labels, curves = _labels(tmp_path)
  assert labels == ["augfl, lam=0", "augfl, lam=5", "augfl, lam=10"]
  assert [len(c.runs) for c in curves] == [1, 1, 1]


def test_values_are_readable(tmp_path):
  _run(tmp_path / "a", _config(lam=0.05000000001), [0.5])
  _run(tmp_path / "b", _config(lam=0.1, uniform_weights=True), [0.5])
  _run(tmp_path / "c", _config(lam=0.1, uniform_weights=False), [0.5])
  labels, _ = _labels(tmp_path)
  assert labels == ["augfl, lam=0.05", "augfl, lam=0.1, uniform_weights=false",
                    "augfl, lam=0.1, uniform_weights=true"]


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
  assert fig.legends[0].get_title().get_text() == (
      "lines: mean over seeds; error bars: 95% CI across seeds")
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
  for lam in (10.0, 0.0, 5.0):
    for seed in (0, 1):  # another output section per seed: one curve
      _run(tmp_path / f"lam{lam:g}" / f"seed{seed}",
           _nested(lam, seed, f"runs/{seed}"), [0.5 + seed / 10])
  labels, curves = _labels(tmp_path)
  assert labels == ["AugFL w/o PM, lam=0", "AugFL w/ PM, lam=5",
                    "AugFL w/ PM, lam=10"]
  assert [len(c.runs) for c in curves] == [2, 2, 2]
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
  assert result.returncode == 2 and "no such directory" in result.stderr
  (tmp_path / "empty").mkdir()
  result = _cli(str(tmp_path / "empty"), f"--output={tmp_path / 'c.png'}")
  assert result.returncode == 2 and "no run" in result.stderr


def test_training_losses_of_different_algorithms_get_their_own_panels(
    tmp_path):
  _run(tmp_path / "augfl0", _config(lam=0.0), [0.5], train_loss=0.5)
  _run(tmp_path / "augfl5", _config(lam=5.0), [0.6], train_loss=0.4)
  _run(tmp_path / "fedavg", _config(algorithm="fedavg"), [0.4],
       train_loss=2.0)
  labels, curves = _labels(tmp_path)
  assert labels == ["augfl, lam=0", "augfl, lam=5", "FedAvg"]
  fig = plot.make_figure(curves)
  titles = [ax.get_title() for ax in fig.axes if ax.has_data()]
  assert titles == ["test clients", "test clients",
                    "training clients: augfl", "training clients: FedAvg"]
  assert [ax.get_ylabel() for ax in fig.axes] == [
      "accuracy (%)", "test loss", "training loss", "training loss"]
  for ax in fig.axes[2:4]:  # one algorithm's curves per training-loss panel
    assert len(ax.get_lines()) == (2 if ax.get_title().endswith("augfl") else 1)
  assert not fig.texts  # no footnote: the panels' titles say it
  assert "lr" in curves[0].folded  # named by the command, not hidden


def test_one_algorithm_has_one_training_loss_panel(tmp_path):
  _run(tmp_path / "a", _config(lam=0.0), [0.5])
  _run(tmp_path / "b", _config(lam=5.0), [0.6])
  fig = plot.make_figure(_labels(tmp_path)[1], "title")
  assert [ax.get_title() for ax in fig.axes if ax.has_data()] == [
      "test clients", "test clients", "training clients"]
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
  # lam is implied by the method's name: named under the figure
  assert sorted(labels) == ["AugFL w/ PM", "AugFL w/o PM", "FedAvg"]
  assert [c.folded for c in _labels(tmp_path)[1]] == [("lam",)] * 3


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
  assert sorted(labels) == ["AugFL w/ PM", "AugFL w/o PM", "FedAvg"]
  fedavg = next(c for c in curves if c.label == "FedAvg")
  assert len(fedavg.runs) == 2  # seeds of one configuration
  assert not [f for c in curves for f in c.folded
              if f.startswith(("pm.", "crd."))]


def test_curves_are_named_by_their_method_with_their_runs_and_band(tmp_path):
  """The method's name from the registry and how many runs, per curve,
  and what the bands are, once: one run's interval across clients (its
  losses: none); several seeds' mean with the t-interval across seeds."""
  accuracies = {0: [0.5, 0.6, 0.7, 0.8], 1: [0.4, 0.6, 0.6, 0.9],
                2: [0.6, 0.5, 0.8, 0.7]}
  for seed, acc in accuracies.items():
    _run(tmp_path / "pm" / f"seed{seed}", _nested(5.0, seed), acc, ci=0.1)
  _run(tmp_path / "nopm", _nested(0.0), [0.3, 0.4, 0.5, 0.6], ci=0.1)
  labels, curves = _labels(tmp_path)
  assert labels == ["AugFL w/ PM", "AugFL w/o PM"]
  fig = plot.make_figure(curves)
  assert [t.get_text() for t in fig.legends[0].get_texts()] == [
      "AugFL w/ PM (3 seeds)", "AugFL w/o PM (1 run)"]
  caption = ("lines: mean over seeds (or 1 run); bands: 95% CI across seeds "
             "(or clients, for 1 run)")
  assert fig.legends[0].get_title().get_text() == caption
  _inside(fig)
  narrow = plot.make_figure(curves, panels=["accuracy"])  # 3.2 inches
  wrapped = narrow.legends[0].get_title().get_text()
  assert wrapped.startswith("lines: mean over seeds (or 1 run)\nbands:")
  assert wrapped.replace("\n", " ") == caption.replace("; ", " ")
  assert wrapped.count("\n") == 2  # and the entries one above the other:
  assert narrow.legends[0]._ncols == 1  # pylint: disable=protected-access
  _inside(narrow)
  seeds, one = curves
  mean, low, high, what = plot.band(seeds.metrics, "accuracy", 100.0)
  column = [acc[1] for acc in accuracies.values()]
  expected = intervals.mean_interval(column)
  assert what == plot.ACROSS_SEEDS and mean[1] == pytest.approx(
      100 * expected.mean)
  assert (low[1], high[1]) == pytest.approx(
      (100 * expected.low, 100 * expected.high))
  mean, low, high, what = plot.band(one.metrics, "accuracy", 100.0)
  assert what == plot.ACROSS_CLIENTS
  np.testing.assert_allclose(high - mean, 10.0)
  assert plot.band(one.metrics, "test_loss", 1.0)[1:] == (
      None, None, "one run, no band")
  assert [ax.get_ylabel() for ax in fig.axes] == [
      "accuracy (%)", "test loss", "training loss"]


def test_a_config_that_cannot_be_read_is_named_by_its_algorithm(tmp_path):
  """No augfl section (a config.json of an older layout), or one this
  version refuses: the algorithm's name; a fixed label needs no section."""
  _run(tmp_path / "a", _config(lam=5.0), [0.5])
  _run(tmp_path / "b", {**_nested(5.0), "augfl": {"lam": -1.0}}, [0.6])
  _run(tmp_path / "c", _config(algorithm="fedavg"), [0.4])
  assert [c.method for c in _labels(tmp_path)[1]] == [
      "augfl", "augfl", "FedAvg"]


def test_a_panel_of_single_points_spans_the_runs_rounds(tmp_path):
  """Test-split clients scored at the last round only: the panel's x-axis
  runs from 0 to the last round, the point drawn as a marker."""
  for seed in (0, 1):
    _run(tmp_path / f"seed{seed}", _nested(5.0, seed), [0.5, 0.6],
         test_split=0.7 + seed / 100)
  fig = plot.make_figure(_labels(tmp_path)[1])
  for ax in fig.axes:
    if ax.has_data():
      low, high = ax.get_xlim()
      assert low == 0 and 20 < high < 22, ax.get_title()
  split = next(ax for ax in fig.axes if ax.get_title() == "test-split clients")
  line = split.get_lines()[0]  # then the error bar's caps
  assert line.get_marker() == "o" and list(line.get_xdata()) == [20]


def test_a_torn_last_line_is_dropped_and_other_damage_named(tmp_path,
                                                           capsys):
  """A run killed while it wrote metrics.jsonl (or still writing): its torn
  last line is dropped, naming the file; a damaged line elsewhere, a
  config.json that is not JSON, or a value that is not a number is one
  error naming the file."""
  _run(tmp_path / "a", _nested(5.0), [0.5, 0.6])
  metrics = tmp_path / "a" / "metrics.jsonl"
  whole = metrics.read_text()
  metrics.write_text(whole + '{"round": 30, "accuracy": 0.')
  (curve,) = plot.group_curves(plot.find_runs([str(tmp_path)]))
  assert curve.rounds == [10, 20]
  err = capsys.readouterr().err
  assert str(metrics) in err and "dropped its last line" in err
  first, second = whole.splitlines()
  metrics.write_text(f"{first}\n{{\"round\": 1\n{second}\n")
  with pytest.raises(plot.PlotError,
                     match=re.escape(str(metrics)) + ": line 2 is not JSON"):
    plot.group_curves(plot.find_runs([str(tmp_path)]))
  metrics.write_text(f"{first}\n" + json.dumps(
      {"round": 20, "accuracy": "high"}) + "\n")
  with pytest.raises(plot.PlotError, match=re.escape(str(metrics)) +
                     ": round 20: accuracy is not a number"):
    plot.group_curves(plot.find_runs([str(tmp_path)]))
  metrics.write_text(f"{first}\n" + json.dumps({"accuracy": 0.5}) + "\n")
  with pytest.raises(plot.PlotError, match="record 2 has no round"):
    plot.group_curves(plot.find_runs([str(tmp_path)]))
  config = tmp_path / "a" / "config.json"
  config.write_text('{"algorithm": "augfl", ')
  with pytest.raises(plot.PlotError, match=re.escape(str(config))):
    plot.group_curves(plot.find_runs([str(tmp_path)]))


def test_the_output_is_checked_before_any_work(tmp_path):
  """A directory, a missing directory, one under a regular file, one where
  no file can be created, a suffix matplotlib does not write: one line
  each, and nothing written."""
  (tmp_path / "file").write_text("x")
  for output, message in [
      (tmp_path, "is a directory"),
      (tmp_path / "missing" / "c.png", "does not exist: create it"),
      (tmp_path / "file" / "c.png", "is not a directory"),
      ("/proc/c.png", "a file cannot be created in /proc"),
      (tmp_path / "c.txt", "format matplotlib writes"),
      (tmp_path / "c", "format matplotlib writes")]:
    with pytest.raises(plot.PlotError, match=message) as e:
      plot.check_output(str(output))
    assert "\n" not in str(e.value)
  plot.check_output(str(tmp_path / "c.PDF"))
  plot.check_output(str(tmp_path / "c.svg"))
  assert os.listdir(tmp_path) == ["file"]
  _run(tmp_path / "run", _nested(5.0), [0.5])
  curves = _labels(tmp_path / "run")[1]
  with pytest.raises(plot.PlotError, match="is a directory"):
    plot.plot_curves(curves, str(tmp_path))
  assert not os.path.exists(f"{tmp_path}.png")
  plot.plot_curves(curves, str(tmp_path / "c.pdf"))
  assert (tmp_path / "c.pdf").read_bytes()[:5] == b"%PDF-"


@pytest.mark.slow
def test_the_command_takes_paths_and_flags_and_fails_in_one_line(tmp_path):
  """--help is the command's own (exit 0); RUN_DIR arguments beside
  flags, a flag's value after a space included; a bad --output or an
  unknown flag is one line, exit 2, before anything is written."""
  result = _cli("--help")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("Learning curves of runs")
  assert "the flags of python -m experiments.plot:" in result.stdout
  assert "--output:" in result.stdout and "--label_by:" in result.stdout
  _run(tmp_path / "a", _nested(5.0), [0.5, 0.6])
  out = tmp_path / "c.png"
  result = _cli("--output", str(out), str(tmp_path / "a"))
  assert result.returncode == 0, result.stderr
  assert "1 runs, 1 curves (AugFL w/ PM)" in result.stdout
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  for args, message in [((f"--output={tmp_path}",), "is a directory"),
                        (("--output=/proc/c.png",), "cannot be created"),
                        ((f"--output={tmp_path / 'c.txt'}",), "format"),
                        (("--nosuch",), "nosuch")]:
    result = _cli(str(tmp_path / "a"), *args)
    assert result.returncode == 2, (args, result.stderr)
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and not result.stdout
  assert not os.path.exists(f"{tmp_path}.png")
  assert sorted(os.listdir(tmp_path)) == ["a", "c.png"]


def _seeds(tmp_path, accuracies, test_split=None, **config):
  """Runs of one configuration, a seed per row of ``accuracies``."""
  for seed, acc in enumerate(accuracies):
    _run(tmp_path / f"seed{seed}", _nested(5.0, seed, **config), acc,
         train_loss=0.1 + 2 * seed, test_split=test_split)
  return _labels(tmp_path)[1]


def test_panels_are_chosen_and_the_grid_fits_them(tmp_path):
  """By default the panels the runs have values for, else those named, in
  their order; a training-loss panel per algorithm; no empty panel; axes
  labelled plainly; a panel without values, or an unknown one, refused."""
  _run(tmp_path / "a" / "pm", _nested(5.0), [0.5, 0.6], test_split=0.7)
  _run(tmp_path / "a" / "nopm", _nested(0.0), [0.4, 0.5], test_split=0.6)
  curves = _labels(tmp_path / "a")[1]
  assert plot.available_panels(curves) == (
      "accuracy", "test_split", "test_loss", "train_loss")
  for panels, ylabels in [
      ((), ["accuracy (%)", "accuracy (%)", "test loss", "training loss"]),
      (["train_loss", "accuracy"], ["training loss", "accuracy (%)"]),
      (["test_split"], ["accuracy (%)"])]:
    fig = plot.make_figure(curves, panels=panels)
    assert [ax.get_ylabel() for ax in fig.axes] == ylabels
    assert all(ax.has_data() and ax.get_xlabel() == "round"
               for ax in fig.axes)
    _inside(fig)
  fig = plot.make_figure(curves)  # 4 panels: 2 by 2
  assert sorted({ax.get_subplotspec().rowspan.start for ax in fig.axes}) == [
      0, 1]
  _run(tmp_path / "b" / "fedavg", _config(algorithm="fedavg"), [0.4])
  _run(tmp_path / "b" / "per_fedavg", _config(algorithm="per_fedavg"), [0.4])
  _run(tmp_path / "b" / "augfl", _config(), [0.5])
  fig = plot.make_figure(_labels(tmp_path / "b")[1])  # 5 panels: 3 + 2
  assert [ax.get_title() for ax in fig.axes] == [
      "test clients", "test clients", "training clients: augfl",
      "training clients: FedAvg", "training clients: Per-FedAvg"]
  assert all(ax.has_data() for ax in fig.axes)
  centred = [ax.get_subplotspec().colspan for ax in fig.axes[3:]]
  assert [(c.start, c.stop) for c in centred] == [(1, 3), (3, 5)]
  _inside(fig)
  with pytest.raises(plot.PlotError, match="the runs have no test_split "
                     "values .they have: accuracy, test_loss, train_loss."):
    plot.make_figure(_labels(tmp_path / "b")[1], panels=["test_split"])
  with pytest.raises(plot.PlotError, match="no panel 'loss': name some of "
                     "accuracy, test_split, test_loss, train_loss"):
    plot.make_figure(curves, panels=["accuracy", "loss"])


def test_the_bands_are_said_once_and_clipped_to_their_range(tmp_path):
  """Two seeds far apart: their t-intervals reach below 0 and above 100%;
  the loss bands stop at 0 and the accuracy bands at [0, 100], drawn as
  bands (4 rounds) or error bars (fewer), named in the legend's title
  only."""
  curves = _seeds(tmp_path / "bands", [[0.05, 0.1, 0.2, 0.3],
                                       [0.95, 0.99, 0.99, 1.0]])
  mean, low, high, what = plot.band(curves[0].metrics, "test_loss", 1.0)
  assert what == plot.ACROSS_SEEDS and low.min() == 0 and mean.min() > 0
  fig = plot.make_figure(curves, panels=["accuracy", "test_loss"])
  accuracy, loss = fig.axes
  for ax, (bottom, top) in ((accuracy, (0, 100)), (loss, (0, np.inf))):
    (fill,) = ax.collections
    y = fill.get_paths()[0].vertices[:, 1]
    assert bottom <= y.min() and y.max() <= top
    assert ax.get_ylabel() in ("accuracy (%)", "test loss")
  assert y.min() == 0  # the loss band reached 0
  assert fig.legends[0].get_title().get_text() == (
      "lines: mean over seeds; bands: 95% CI across seeds")
  assert [t.get_text() for t in fig.legends[0].get_texts()] == [
      "AugFL w/ PM (2 seeds)"]
  fig = plot.make_figure(_seeds(tmp_path / "bars", [[0.05, 0.1],
                                                    [0.95, 0.99]]),
                         panels=["accuracy", "test_loss"])
  for ax, (bottom, top) in zip(fig.axes, ((0, 100), (0, np.inf))):
    (bars,) = ax.collections  # error bars
    y = np.concatenate(bars.get_segments())[:, 1]
    assert bottom <= y.min() and y.max() <= top
  assert y.min() == 0
  assert fig.legends[0].get_title().get_text() == (
      "lines: mean over seeds; error bars: 95% CI across seeds")


def test_error_bars_of_curves_at_one_round_are_side_by_side(tmp_path):
  """Curves of fewer than four points share their rounds: their error bars
  are dodged (centred on the round), a line's are not."""
  for lam in (0.0, 5.0, 10.0):
    _run(tmp_path / f"lam{lam:g}", _nested(lam), [0.5, 0.6], ci=0.1,
         test_split=0.7)
  fig = plot.make_figure(_labels(tmp_path)[1], panels=["accuracy",
                                                       "test_split"])
  for ax, rounds in zip(fig.axes, ([10, 20], [20])):
    xs = np.array([c.lines[0].get_xdata() for c in ax.containers])
    assert xs.shape == (3, len(rounds))
    for column, round_ in zip(xs.T, rounds):  # one round: three places
      assert len(set(column)) == 3 and np.mean(column) == pytest.approx(round_)
    low, high = ax.get_xlim()  # every bar inside the axes
    assert low == 0 and xs.max() < high
  fig = plot.make_figure(_labels(tmp_path / "lam0")[1])
  assert list(fig.axes[0].containers[0].lines[0].get_xdata()) == [10, 20]


def test_figure_size_and_font_size(tmp_path):
  """--figsize is the figure's size in inches; --font_size every text's
  size (ticks drawn after the figure is made included); by default
  3.2 x 2.5 inches a panel, and matplotlib's font size."""
  _run(tmp_path / "a", _nested(5.0), [0.5, 0.6, 0.7, 0.8], ci=0.1)
  curves = _labels(tmp_path)[1]
  fig = plot.make_figure(curves, "title", panels=["accuracy", "train_loss"],
                         figsize=["5", "2"], font_size=7)
  assert tuple(fig.get_size_inches()) == (5, 2)
  fig.canvas.draw()
  texts = [fig.legends[0].get_texts()[0], fig.legends[0].get_title()]
  for ax in fig.axes:
    texts += [ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(),
              *ax.get_yticklabels()]
  assert {t.get_fontsize() for t in texts if t.get_text()} == {7}
  assert fig.axes[0].title.get_fontsize() > 7  # larger than the rest
  _inside(fig)
  fig = plot.make_figure(curves)
  assert fig.get_size_inches()[0] == pytest.approx(3 * 3.2)
  assert fig.axes[0].yaxis.label.get_fontsize() == 10
  for figsize in (["7"], ["7", "x"], [0, 2], ["7", "-1"], ["inf", "2"]):
    with pytest.raises(plot.PlotError, match="--figsize=.*: give the "
                       r"figure's width and height in inches, .*e\.g\."):
      plot.make_figure(curves, figsize=figsize)
  for size in (0, -1.0, float("nan")):
    with pytest.raises(plot.PlotError, match=r"--font_size=.*: give the "
                       "font size in points, a number greater than 0"):
      plot.make_figure(curves, font_size=size)


def test_pdf_and_svg_are_written_by_the_outputs_suffix(tmp_path):
  """The format is the output's suffix: PDF (TrueType fonts, no Type 3),
  SVG and PNG, each starting with its magic bytes, of the figure's size."""
  _run(tmp_path / "run", _nested(5.0), [0.5, 0.6], ci=0.1, test_split=0.7)
  curves = _labels(tmp_path / "run")[1]
  for name, magic in (("c.pdf", b"%PDF-"), ("c.svg", b"<?xml"),
                      ("c.png", b"\x89PNG\r\n\x1a\n")):
    plot.plot_curves(curves, str(tmp_path / name), panels=["accuracy"],
                     figsize=(3, 2.5), font_size=8)
    data = (tmp_path / name).read_bytes()
    assert data.startswith(magic), name
  assert b"<svg" in (tmp_path / "c.svg").read_bytes()
  assert b'width="216pt" height="180pt"' in (tmp_path / "c.svg").read_bytes()
  png = (tmp_path / "c.png").read_bytes()
  assert struct.unpack(">II", png[16:24]) == (3 * plot.DPI, 2.5 * plot.DPI)
  pdf = (tmp_path / "c.pdf").read_bytes()
  assert b"/TrueType" in pdf or b"/CIDFontType2" in pdf
  assert b"/Type3" not in pdf


@pytest.mark.slow
def test_the_command_takes_the_figures_flags_and_refuses_bad_ones(tmp_path):
  """--panels, --figsize, --font_size and the format by --output's suffix;
  an unknown panel, one the runs have no values for, a bad size or font
  size: one line, exit 2, nothing written; the fields that differ only
  with the method are printed, not drawn."""
  _run(tmp_path / "runs" / "pm", _nested(5.0), [0.5, 0.6], ci=0.1)
  _run(tmp_path / "runs" / "nopm", _nested(0.0), [0.4, 0.5], ci=0.1)
  runs = str(tmp_path / "runs")
  out = tmp_path / "c.svg"
  result = _cli(runs, "--panels=accuracy,train_loss", "--figsize=6,2.5",
                "--font_size=8", f"--output={out}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines()[-1] == (
      "fields that also differ, with the method: lam")
  assert out.read_bytes().startswith(b"<?xml") and b"<svg" in out.read_bytes()
  assert 'width="432pt" height="180pt"' in out.read_text()  # 6 x 2.5 in
  for args, message in [
      (("--panels=accuracy,loss",), "--panels: no panel 'loss': name some of"),
      (("--panels=test_split",), "the runs have no test_split values"),
      (("--figsize=7",), "--figsize=7: give the figure's width and height"),
      (("--figsize=7,0",), "--figsize=7,0: give"),
      (("--font_size=0",), "--font_size=0.0: give the font size in points"),
      (("--font_size=big",), "font_size")]:
    result = _cli(runs, *args, f"--output={tmp_path / 'd.png'}")
    assert result.returncode == 2, (args, result.stderr)
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and not result.stdout
  assert sorted(os.listdir(tmp_path)) == ["c.svg", "runs"]


@pytest.mark.slow
def test_the_readmes_figure_is_made_by_the_command_beside_it(tmp_path):
  """README's plot command writes the figure README shows (under 150 kB),
  of the size its --figsize gives; run here on fake runs at its paths."""
  text = open(os.path.join(ROOT, "README.md")).read()
  command = re.search(r"```bash\n(python -m experiments\.plot .*?)```",
                      text, re.S)[1]
  args = command.replace("\\\n", " ").split()[3:]
  output = next(a.partition("=")[2] for a in args
                if a.startswith("--output="))
  assert f"]({output})" in text  # the image README shows
  shown = open(os.path.join(ROOT, output), "rb").read()
  assert shown.startswith(b"\x89PNG\r\n\x1a\n") and len(shown) < 150_000
  runs = [a for a in args if not a.startswith("--")]
  assert runs == ["runs/digits_augfl_seed0", "runs/wo_pm"]
  for run, lam in zip(runs, (5.0, 0.0)):
    _run(tmp_path / run, _nested(lam), [0.5, 0.6, 0.7, 0.8], ci=0.1,
         test_split=0.75)
  (tmp_path / os.path.dirname(output)).mkdir(parents=True)
  result = _cli(*args, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  made = (tmp_path / output).read_bytes()
  assert struct.unpack(">II", made[16:24]) == struct.unpack(
      ">II", shown[16:24])  # the same size: 7 x 2.6 inches at 150 dpi


def _train_run(path, seed, values):
  """A run evaluated every round whose records keep the round's training
  metrics (``train``), as AugFL's do."""
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps(_config(seed=seed)))
  records = [{"round": r + 1, "accuracy": 0.5, "train_loss": v,
              "test_loss": 1.0, "train": {"server_reg_norm": v, "loss": v}}
             for r, v in enumerate(values)]
  (path / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in records))


def test_training_metrics_are_panels_and_the_table_holds_the_values(tmp_path):
  _train_run(tmp_path / "s0", 0, [1.0, 8.0, 2.0])
  _train_run(tmp_path / "s1", 1, [3.0, 4.0, 2.0])
  _, curves = _labels(tmp_path)
  np.testing.assert_array_equal(curves[0].metrics["train.server_reg_norm"],
                                [[1.0, 8.0, 2.0], [3.0, 4.0, 2.0]])
  # not drawn unless named; named, a panel of its own
  assert "train.loss" not in plot.available_panels(curves)
  assert plot.available_panels(curves, train=True)[-2:] == (
      "train.loss", "train.server_reg_norm")
  fig = plot.make_figure(curves, panels=["train.server_reg_norm"])
  (ax,) = fig.axes
  assert (ax.get_title(), ax.get_xlabel()) == ("server_reg_norm", "round")
  np.testing.assert_allclose(ax.lines[0].get_ydata(), [2.0, 6.0, 2.0])
  with pytest.raises(plot.PlotError, match="no panel 'train.'"):
    plot.check_panels(["train."])
  with pytest.raises(plot.PlotError, match="no train.nothing values"):
    plot.make_figure(curves, panels=["train.nothing"])
  table = plot.values_table(curves, ["train.server_reg_norm"])
  low, high = intervals.mean_interval([8.0, 4.0]).low, intervals.mean_interval(
      [8.0, 4.0]).high
  assert f"| round | {plot.legend_label(curves[0])} |" in table
  assert low < 0 and f"| 2 | 6 [0, {high:.4g}] |" in table  # clipped at 0
  assert "| 3 | 2 [2, 2] |" in table
  assert table.rstrip().endswith("95% CI across seeds")


@pytest.mark.slow
def test_the_command_writes_the_table_of_its_panels(tmp_path):
  _train_run(tmp_path / "runs" / "s0", 0, [1.0, 8.0, 2.0])
  result = _cli(str(tmp_path / "runs"), "--panels=accuracy,train.loss",
                f"--output={tmp_path / 'f.png'}",
                f"--table={tmp_path / 'f.md'}")
  assert result.returncode == 0, result.stderr
  text = (tmp_path / "f.md").read_text()
  assert "test clients: accuracy (%)" in text and "loss: value" in text
  assert "| 2 | 8 |" in text  # one run: its loss, no band
  bad = _cli(str(tmp_path / "runs"), f"--output={tmp_path / 'g.png'}",
             f"--table={tmp_path / 'nodir' / 'g.md'}")
  assert bad.returncode == 2 and "--table" in bad.stderr
  assert not (tmp_path / "g.png").exists()  # refused before any work
