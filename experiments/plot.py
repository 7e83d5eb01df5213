r"""Learning curves of runs, like the paper's Fig. 2.

  python -m experiments.plot RUN_DIR [RUN_DIR ...] --output curves.png

Each RUN_DIR is a run's output directory (``metrics.jsonl``, ``config.json``)
or holds several (a sweep: one sub-directory per cell and seed).

Runs are grouped into curves by :mod:`experiments.curves` (one
configuration a curve, repeats across seeds as mean ± std; re-exported
here).

Panels: test-client accuracy (the protocol's held-out clients); the
test-split accuracy (many clients from the dataset's test split, where the
runs scored them); test loss (the query cross-entropy after adaptation, the
same quantity for every method); training loss, a panel per algorithm,
since each algorithm's is its own objective (AugFL's query loss after
adaptation, FedAvg's local SGD loss, KT-only's R_h).

Bands: a curve of several seeds is their mean with its 95% interval across
seeds (Student's t, ``n - 1`` degrees of freedom); a curve of one run is the
run's accuracy with its 95% interval across clients (as ``metrics.jsonl``
records it); the losses are mean ± std across seeds.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Sequence

from absl import app
from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from augfl_jax.core import intervals
from experiments.curves import (ALGORITHM, DATASET, REPEAT_FIELDS,
                                REPEAT_SECTIONS, SEED, Curve, PlotError,
                                find_runs, flatten, group_curves, load_run)

__all__ = [  # the grouping's names, re-exported
    "ALGORITHM", "DATASET", "REPEAT_FIELDS", "REPEAT_SECTIONS", "SEED",
    "Curve", "PlotError", "find_runs", "flatten", "group_curves", "load_run",
    "make_figure", "plot_curves", "main"]

FLAGS = flags.FLAGS



# An accuracy's recorded 95% interval across clients: its two ends' keys.
_CLIENT_INTERVALS = {"accuracy": ("accuracy_ci_low", "accuracy_ci_high"),
                     "test_split_accuracy": ("test_split_ci_low",
                                             "test_split_ci_high")}


def _band(source: dict[str, np.ndarray], metric: str, scale: float):
  """``(mean, low, high, what)`` of ``source[metric]`` ``[runs, rounds]``:
  an accuracy's 95% interval across seeds (several runs; clipped to [0,
  100%] as every accuracy interval) or across clients (one run), else mean
  ± std across seeds."""
  values = scale * source[metric]
  mean = values.mean(0)
  if metric in _CLIENT_INTERVALS and len(values) >= 2:
    ends = [intervals.mean_interval(column) for column in values.T]
    return (mean, np.clip([e.low for e in ends], 0, scale),
            np.clip([e.high for e in ends], 0, scale), "95% CI across seeds")
  low, high = _CLIENT_INTERVALS.get(metric, (None, None))
  if low in source and high in source:
    return (mean, scale * source[low][0], scale * source[high][0],
            "95% CI across clients")
  std = values.std(0)
  return mean, mean - std, mean + std, "mean ± std across seeds"


def make_figure(curves: Sequence[Curve], title: str = ""):
  """Panels of accuracy, test-split accuracy, test loss, and training loss
  per algorithm, one colour per curve throughout, one legend; notes under
  the panels."""
  algorithms = list(dict.fromkeys(c.algorithm for c in curves))
  panels = [("accuracy", "test-client accuracy", None)]
  if any(c.test_split for c in curves):
    panels.append(("test_split_accuracy", "test-split clients' accuracy",
                   None))
  if any("test_loss" in c.metrics for c in curves):
    panels.append(("test_loss", "test loss (query CE after adaptation)", None))
  panels += [("train_loss", "training loss" + (
      f": {a}" if len(algorithms) > 1 else ""), a) for a in algorithms]
  ncols = min(3, len(panels))
  nrows = math.ceil(len(panels) / ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows),
                           squeeze=False)
  colors = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
  handles = {}
  for ax, (metric, name, algorithm) in zip(axes.flat, panels):
    scale, positive = (100.0 if "accuracy" in metric else 1.0), True
    bands = set()
    for k, curve in enumerate(curves):
      test_split = metric.startswith("test_split")
      source = curve.test_split if test_split else curve.metrics
      if metric not in source or algorithm not in (None, curve.algorithm):
        continue
      rounds = curve.test_split_rounds if test_split else curve.rounds
      mean, low, high, what = _band(source, metric, scale)
      bands.add(what)
      positive &= bool(np.all(source[metric] > 0))
      color = colors(k % colors.N)
      if len(rounds) < 4 and metric in _CLIENT_INTERVALS:  # error bars
        (line, *_) = ax.errorbar(
            rounds, mean, yerr=np.nan_to_num([mean - low, high - mean]),
            color=color, marker="o", capsize=3)
      else:
        (line,) = ax.plot(rounds, mean, color=color,
                          marker="o" if len(rounds) < 4 else None)
        ax.fill_between(rounds, low, high, alpha=0.2, color=color)
      handles.setdefault(k, (line, f"{curve.label} (n={len(curve.runs)})"))
    ax.set(title=name, xlabel="round", ylabel=(
        "%; " if scale == 100 else "") + "; ".join(sorted(bands)))
    if metric == "train_loss" and positive:
      ax.set_yscale("log")
    ax.grid(alpha=0.3)
  for ax in axes.flat[len(panels):]:
    ax.axis("off")
  fig.legend(*zip(*(handles[k] for k in sorted(handles))), loc="center left",
             bbox_to_anchor=(1.0, 0.5), fontsize="small")
  notes = []
  if len(algorithms) > 1:
    notes.append("Training losses are each algorithm's own objective, not "
                 "comparable across algorithms: one panel each.")
  if curves[0].folded:
    notes.append("Fields that also differ, along with those in the legend: "
                 + ", ".join(curves[0].folded[:8])
                 + (", ..." if len(curves[0].folded) > 8 else "."))
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  for i, note in enumerate(notes):  # under the panels (saved bbox "tight")
    fig.text(0.01, -0.01 - 0.06 * i / nrows, note, va="top", fontsize="small")
  return fig


def plot_curves(curves: Sequence[Curve], output: str, title: str = "") -> None:
  """Writes ``make_figure(curves, title)`` to the PNG ``output``."""
  fig = make_figure(curves, title)
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=120, bbox_inches="tight")
  plt.close(fig)


def main(argv):
  try:
    runs = find_runs(argv[1:])
    if not runs:
      raise PlotError("no run directories (with metrics.jsonl) under "
                      f"{' '.join(argv[1:]) or 'the arguments'}")
    curves = group_curves(runs, FLAGS.label_by)
    plot_curves(curves, FLAGS.output, FLAGS.title)
  except PlotError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"{len(runs)} runs, {len(curves)} curves "
        f"({'; '.join(c.label for c in curves)}) -> {FLAGS.output}")


if __name__ == "__main__":
  flags.DEFINE_string("output", "curves.png", "PNG file to write")
  flags.DEFINE_list("label_by", [],
                    "config fields that name a curve (dotted, e.g. augfl.lam, "
                    "or a field's last part); default: the fields that differ")
  flags.DEFINE_string("title", "", "figure title")
  app.run(main)
