r"""Learning curves of runs, like the paper's Fig. 2.

  python -m experiments.plot RUN_DIR [RUN_DIR ...] --output curves.png

Each RUN_DIR is a run's output directory (``metrics.jsonl``, ``config.json``)
or holds several (a sweep: one sub-directory per cell and seed).
``--output`` names the figure's file, of a format matplotlib writes (.png,
.pdf, .svg, ...), in a directory that exists; it is checked before any run
is read.

Runs are grouped into curves by :mod:`experiments.curves` (one
configuration a curve, its repeats across seeds drawn together;
re-exported here). A curve is labelled by its method's name ("AugFL w/ PM")
and the fields that differ between curves, and says how many runs it
draws ("3 seeds", "1 run").

Panels: test-client accuracy (the protocol's held-out clients); the
test-split accuracy (many clients from the dataset's test split, where the
runs scored them); test loss (the query cross-entropy after adaptation, the
same quantity for every method); training loss, a panel per algorithm,
since each algorithm's is its own objective (AugFL's query loss after
adaptation, FedAvg's local SGD loss, KT-only's R_h). Every panel spans the
runs' rounds, from 0 to the last; a curve of fewer than four points is
drawn as markers (with error bars for its band).

Bands, per curve (its legend says which): a curve of several seeds is their
mean with its 95% interval across seeds (Student's t, ``n - 1`` degrees of
freedom; accuracies clipped to [0, 100%]); a curve of one run is the run's
accuracy with its 95% interval across clients (as ``metrics.jsonl`` records
it), and its losses without a band.
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
from matplotlib import backend_bases  # pylint: disable=g-import-not-at-top
from matplotlib import ticker  # pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from augfl_jax.core import intervals
from experiments import cli, flag_help
from experiments.compare import check_output_file, write_output
from experiments.curves import (ALGORITHM, DATASET, REPEAT_FIELDS,
                                REPEAT_SECTIONS, SEED, Curve, PlotError,
                                find_runs, flatten, group_curves, load_run)

__all__ = [  # the grouping's names, re-exported
    "ALGORITHM", "DATASET", "REPEAT_FIELDS", "REPEAT_SECTIONS", "SEED",
    "Curve", "PlotError", "find_runs", "flatten", "group_curves", "load_run",
    "band", "check_output", "legend_label", "make_figure", "plot_curves",
    "main"]

FLAGS = flags.FLAGS

# The formats --output may name (of those matplotlib writes; not pgf, which
# needs LaTeX, nor raw RGBA).
FORMATS = tuple(
    f for f in ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif",
                "tiff", "webp")
    if f in backend_bases.FigureCanvasBase.get_supported_filetypes())

# An accuracy's recorded 95% interval across clients: its two ends' keys.
_CLIENT_INTERVALS = {"accuracy": ("accuracy_ci_low", "accuracy_ci_high"),
                     "test_split_accuracy": ("test_split_ci_low",
                                             "test_split_ci_high")}
ACROSS_SEEDS = "mean, 95% CI across seeds"
ACROSS_CLIENTS = "95% CI across clients"


def _t_ends(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The ends of each column's 95% t-interval across seeds, of ``values``
  ``[runs, rounds]`` (``nan`` where a column holds a non-finite value)."""
  ends = []
  for column in values.T:
    try:
      interval = intervals.mean_interval(column)
    except ValueError:  # a non-finite value: no interval
      ends.append((math.nan, math.nan))
    else:
      ends.append((interval.low, interval.high))
  low, high = np.array(ends, dtype=np.float64).reshape(-1, 2).T
  return low, high


def band(source: dict[str, np.ndarray], metric: str, scale: float):
  """``(mean, low, high, what)`` of ``source[metric]`` ``[runs, rounds]``:
  several runs: their mean with its 95% t-interval across seeds (an
  accuracy's clipped to [0, 100%]); one run: an accuracy with its recorded
  95% interval across clients, else no band (``low``, ``high`` None)."""
  values = scale * source[metric]
  mean = values.mean(0)
  if len(values) >= 2:
    low, high = _t_ends(values)
    if metric in _CLIENT_INTERVALS:
      low, high = np.clip(low, 0, scale), np.clip(high, 0, scale)
    return mean, low, high, ACROSS_SEEDS
  low, high = _CLIENT_INTERVALS.get(metric, (None, None))
  if low in source and high in source:
    return (mean, scale * source[low][0], scale * source[high][0],
            ACROSS_CLIENTS)
  return mean, None, None, "one run, no band"


def legend_label(curve: Curve) -> str:
  """``curve``'s entry in the legend: its label, how many runs it draws,
  and what its band is ("AugFL w/ PM (3 seeds: mean, 95% CI across
  seeds)", "AugFL w/o PM (1 run, 95% CI across clients)")."""
  if len(curve.runs) >= 2:
    return f"{curve.label} ({len(curve.runs)} seeds: {ACROSS_SEEDS})"
  recorded = any(low in source and high in source
                 for source in (curve.metrics, curve.test_split)
                 for low, high in _CLIENT_INTERVALS.values())
  return f"{curve.label} (1 run" + (
      f", {ACROSS_CLIENTS})" if recorded else ")")


def _last_round(curves: Sequence[Curve]) -> int:
  return max(max(c.rounds + c.test_split_rounds) for c in curves)


def make_figure(curves: Sequence[Curve], title: str = ""):
  """Panels of accuracy, test-split accuracy, test loss, and training loss
  per algorithm, one colour per curve throughout, one legend; every panel
  spans rounds 0 to the runs' last; notes under the panels."""
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
  last = _last_round(curves)
  margin = max(0.02 * last, 0.5)  # a marker at an end is not cut in half
  first = -margin if any(0 in c.rounds + c.test_split_rounds
                         for c in curves) else 0
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
      mean, low, high, what = band(source, metric, scale)
      bands.add(what)
      positive &= bool(np.all(source[metric] > 0))
      color = colors(k % colors.N)
      few = len(rounds) < 4  # markers: a line of one point is not seen
      if low is not None and few:  # error bars
        (line, *_) = ax.errorbar(
            rounds, mean, yerr=np.nan_to_num([mean - low, high - mean]),
            color=color, marker="o", capsize=3)
      else:
        (line,) = ax.plot(rounds, mean, color=color,
                          marker="o" if few else None)
        if low is not None:
          ax.fill_between(rounds, low, high, alpha=0.2, color=color)
      handles.setdefault(k, (line, legend_label(curve)))
    ax.set_xlim(first, last + margin)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set(title=name, xlabel="round", ylabel="; ".join(
        ["accuracy (%)" if scale == 100 else "loss"] + sorted(bands)))
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


def check_output(output: str) -> None:
  """Checks, before any work, that the figure can be written to
  ``output``: a suffix of :data:`FORMATS`, and
  ``compare.check_output_file``'s checks.

  Raises:
    PlotError: one line saying what is wrong.
  """
  try:
    check_output_file(output)
  except ValueError as e:
    raise PlotError(str(e)) from None
  if os.path.splitext(output)[1][1:].lower() not in FORMATS:
    raise PlotError(f"--output={output}: name a file whose suffix is a "
                    "format matplotlib writes (." + ", .".join(FORMATS) + ")")


def plot_curves(curves: Sequence[Curve], output: str, title: str = "") -> None:
  """Writes ``make_figure(curves, title)`` to ``output`` (its format by its
  suffix: :func:`check_output`), through a temporary file renamed into
  place: a failure (a full disk) keeps the figure there before whole, and
  says so naming ``output`` (``PlotError``)."""
  check_output(output)
  fig = make_figure(curves, title)
  suffix = os.path.splitext(output)[1][1:].lower()
  try:
    write_output(output, lambda tmp: fig.savefig(
        tmp, format=suffix, dpi=120, bbox_inches="tight"))
  except ValueError as e:
    raise PlotError(str(e)) from None
  finally:
    plt.close(fig)


def parse_flags_and_paths(argv: list[str]) -> list[str]:
  """``experiments.cli.parse_flags`` for a command whose arguments that are
  not flags are paths: they are returned (after ``argv[0]``), not refused;
  a flag that cannot be parsed is one line on stderr and exit 2, and
  ``--help`` prints the command's help and exits 0."""
  kind = flag_help.requested(argv)
  if kind is not None:
    flag_help.print_and_exit(FLAGS, kind)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)


def _plot(paths: list[str]) -> None:
  check_output(FLAGS.output)
  if not paths:
    raise PlotError("name the runs to plot: python -m experiments.plot "
                    "RUN_DIR [RUN_DIR ...] --output curves.png")
  missing = [p for p in paths if not os.path.isdir(p)]
  if missing:
    raise PlotError(f"{missing[0]}: no such directory (RUN_DIR is a run's "
                    "output directory, or one that holds runs)")
  runs = find_runs(paths)
  if not runs:
    raise PlotError(f"no run directories (with metrics.jsonl) under "
                    f"{' '.join(paths)}")
  curves = group_curves(runs, FLAGS.label_by)
  plot_curves(curves, FLAGS.output, FLAGS.title)
  print(f"{len(runs)} runs, {len(curves)} curves "
        f"({'; '.join(c.label for c in curves)}) -> {FLAGS.output}")


def main(argv: list[str]) -> None:
  cli.run_command(lambda: _plot(argv[1:]))


if __name__ == "__main__":
  flags.DEFINE_string("output", "curves.png", "the figure's file, of a "
                      "format matplotlib writes (.png, .pdf, .svg, ...), in "
                      "a directory that exists")
  flags.DEFINE_list("label_by", [],
                    "config fields that name a curve (dotted, e.g. augfl.lam, "
                    "or a field's last part); default: the fields that differ")
  flags.DEFINE_string("title", "", "figure title")
  app.run(main, flags_parser=parse_flags_and_paths)
