r"""Learning curves of runs, like the paper's Fig. 2.

  python -m experiments.plot RUN_DIR [RUN_DIR ...] --output curves.png
  python -m experiments.plot RUN_DIR ... --panels=accuracy,train_loss \
      --figsize=7,2.5 --font_size=9 --output curves.pdf

Each RUN_DIR is a run's output directory (``metrics.jsonl``, ``config.json``)
or holds several (a sweep: one sub-directory per cell and seed).
``--output`` names the figure's file, in a directory that exists; its
suffix is its format, any that matplotlib writes: .png (at 150 dpi), .pdf
(fonts embedded as TrueType), .svg, ...; one file a command. It is
checked, and so are ``--panels``, ``--figsize`` and ``--font_size``,
before any run is read.

Runs are grouped into curves by :mod:`experiments.curves` (one
configuration a curve, its repeats across seeds drawn together;
re-exported here). A curve is labelled by its method's name ("AugFL w/ PM")
and the fields that differ between curves, and says how many runs it
draws ("3 seeds", "1 run"); fields that differ only with the method (AugFL's
``lam`` between "w/ PM" and "w/o PM") are printed by the command, not
drawn.

Panels (``--panels``, in the order named; default: those the runs have
values for), each with a plain y-axis label and the rounds on the x-axis:
``accuracy``, the test clients' (the protocol's held-out clients);
``test_split``, the test-split clients' (many clients from the dataset's
test split, where the runs scored them); ``test_loss``, the test clients'
(the query cross-entropy after adaptation, the same quantity for every
method); ``train_loss``, a panel per algorithm, since each algorithm's is
its own objective (AugFL's query loss after adaptation, FedAvg's local SGD
loss, KT-only's R_h), on a log scale where positive. The panels fill a
grid (a row of up to three; four as 2 x 2; a shorter last row centred),
the legend under them. Every panel spans the runs' rounds, from 0 to the
last; a curve of fewer than four points is drawn as markers with error
bars, those of curves at one round side by side.

``train.<metric>`` (named in ``--panels`` only) draws one of the training
metrics a run records for each evaluated round (``metrics.jsonl``'s
``train``; every round's with ``--eval_every=1``), e.g. AugFL's
``train.server_reg_norm``. ``--table=FILE.md`` also writes the values drawn,
a row per round and a column per curve, each with its band.

Bands: a curve of several seeds is their mean with its 95% interval across
seeds (Student's t, ``n - 1`` degrees of freedom); a curve of one run is
the run's accuracy with its 95% interval across clients (as
``metrics.jsonl`` records it), and its losses without a band. The legend's
title says which, once. Accuracy bands are clipped to [0, 100%], loss
bands at 0 (where no run's loss is negative).
"""

from __future__ import annotations

import logging as std_logging
import math
import os
import pathlib
import textwrap
from typing import Sequence

from absl import flags
import matplotlib

matplotlib.use("Agg")
from matplotlib import ticker  # pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from augfl_jax.commands import output_files, runner
from augfl_jax.core import intervals
from experiments.compare import write_output
from experiments.curves import (ALGORITHM, DATASET, REPEAT_FIELDS,
                                REPEAT_SECTIONS, SEED, Curve, PlotError,
                                find_runs, flatten, group_curves, load_run)

__all__ = [  # the grouping's names, re-exported
    "ALGORITHM", "DATASET", "REPEAT_FIELDS", "REPEAT_SECTIONS", "SEED",
    "Curve", "PlotError", "find_runs", "flatten", "group_curves", "load_run",
    "PANELS", "available_panels", "band", "band_caption", "check_figsize",
    "check_font_size", "check_output", "check_panels", "legend_label",
    "make_figure", "plot_curves", "write_figure", "main"]

FLAGS = flags.FLAGS

# The formats --output may name.
FORMATS = output_files.figure_formats()

# An accuracy's recorded 95% interval across clients: its two ends' keys.
_CLIENT_INTERVALS = {"accuracy": ("accuracy_ci_low", "accuracy_ci_high"),
                     "test_split_accuracy": ("test_split_ci_low",
                                             "test_split_ci_high")}
ACROSS_SEEDS = "95% CI across seeds"
ACROSS_CLIENTS = "95% CI across clients"
NO_BAND = "one run, no band"

# The panels --panels names, in the order they are drawn: name -> (the
# metric, the panel's title, its y-axis label).
PANELS = {
    "accuracy": ("accuracy", "test clients", "accuracy (%)"),
    "test_split": ("test_split_accuracy", "test-split clients",
                   "accuracy (%)"),
    "test_loss": ("test_loss", "test clients", "test loss"),
    "train_loss": ("train_loss", "training clients", "training loss"),
}
DPI = 150  # of a raster format (.png, .jpg, ...)


# A panel of one of a round's own training metrics (a record's ``train``,
# e.g. AugFL's ``server_reg_norm``) is named ``train.<metric>``.
TRAIN = "train."


def panel(name: str) -> tuple[str, str, str]:
  """``(metric, title, y-axis label)`` of the panel ``name``: one of
  :data:`PANELS`, or ``train.<metric>``, the evaluated rounds' own value of
  a training metric (titled by its name)."""
  if name.startswith(TRAIN) and len(name) > len(TRAIN):
    return name, name[len(TRAIN):], "value in the round"
  return PANELS[name]


def check_panels(names: Sequence[str]) -> tuple[str, ...]:
  """``names`` (each of :data:`PANELS` or ``train.<metric>``), in the order
  given, once each.

  Raises:
    PlotError: an unknown panel (one line naming the known ones).
  """
  for name in names:
    if name not in PANELS and not (name.startswith(TRAIN)
                                   and len(name) > len(TRAIN)):
      raise PlotError(f"--panels: no panel {name!r}: name some of "
                      f"{', '.join(PANELS)}, or train.<metric> for a "
                      "training metric the runs record (e.g. --panels="
                      "accuracy,train_loss)")
  return tuple(dict.fromkeys(names))


def check_figsize(figsize: Sequence[str | float]) -> tuple[float, float]:
  """``(width, height)`` in inches of ``figsize``, two positive numbers
  (``["7", "2.5"]`` as ``--figsize=7,2.5`` gives them).

  Raises:
    PlotError: anything else (one line).
  """
  try:
    width, height = (float(v) for v in figsize)
  except (TypeError, ValueError):
    width = height = math.nan
  if not all(math.isfinite(v) and v > 0 for v in (width, height)):
    raise PlotError(f"--figsize={','.join(str(v) for v in figsize)}: give "
                    "the figure's width and height in inches, two positive "
                    "numbers (e.g. --figsize=7,2.5)")
  return width, height


def check_font_size(font_size: float) -> float:
  """``font_size`` (points), a positive number.

  Raises:
    PlotError: anything else (one line).
  """
  if not (isinstance(font_size, (int, float)) and math.isfinite(font_size)
          and font_size > 0):
    raise PlotError(f"--font_size={font_size}: give the font size in "
                    "points, a number greater than 0 (e.g. --font_size=9)")
  return float(font_size)


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
  several runs: their mean with its 95% t-interval across seeds
  (:data:`ACROSS_SEEDS`); one run: an accuracy with its recorded 95%
  interval across clients (:data:`ACROSS_CLIENTS`), else no band (``low``,
  ``high`` None, :data:`NO_BAND`). A band is clipped to the values its
  quantity takes: an accuracy's to [0, ``scale``], a loss's at 0 where
  every run's loss is at least 0."""
  values = scale * source[metric]
  mean = values.mean(0)
  if len(values) >= 2:
    (low, high), what = _t_ends(values), ACROSS_SEEDS
  else:
    keys = _CLIENT_INTERVALS.get(metric, ())
    if not keys or not all(k in source for k in keys):
      return mean, None, None, NO_BAND
    low, high = (scale * source[k][0] for k in keys)
    what = ACROSS_CLIENTS
  if metric in _CLIENT_INTERVALS:
    return mean, np.clip(low, 0, scale), np.clip(high, 0, scale), what
  if np.all(values >= 0):
    return mean, np.maximum(low, 0), np.maximum(high, 0), what
  return mean, low, high, what


def legend_label(curve: Curve) -> str:
  """``curve``'s entry in the legend: its label and how many runs it draws
  ("AugFL w/ PM (3 seeds)", "AugFL w/o PM (1 run)"); what its band is, the
  legend's title says (:func:`band_caption`)."""
  runs = len(curve.runs)
  return f"{curve.label} ({runs} seeds)" if runs >= 2 else (
      f"{curve.label} (1 run)")


def band_caption(kinds: set[str], styles: set[str]) -> str:
  """What the figure's bands are, said once (the legend's title): ``kinds``
  the bands drawn (:data:`ACROSS_SEEDS`, :data:`ACROSS_CLIENTS`), ``styles``
  how ("bands", "error bars"); "" for none."""
  drawn = " and ".join(sorted(styles))
  if kinds == {ACROSS_SEEDS}:
    return f"lines: mean over seeds; {drawn}: {ACROSS_SEEDS}"
  if kinds == {ACROSS_CLIENTS}:
    return f"{drawn}: {ACROSS_CLIENTS}"
  if kinds:
    return (f"lines: mean over seeds (or 1 run); {drawn}: {ACROSS_SEEDS} "
            "(or clients, for 1 run)")
  return ""


def _last_round(curves: Sequence[Curve]) -> int:
  return max(max(c.rounds + c.test_split_rounds) for c in curves)


def _source(curve: Curve, metric: str) -> tuple[list[int], dict]:
  """``(rounds, values)`` of ``curve`` where ``metric`` is."""
  if metric.startswith("test_split"):
    return curve.test_split_rounds, curve.test_split
  return curve.rounds, curve.metrics


def available_panels(curves: Sequence[Curve], train: bool = False
                    ) -> tuple[str, ...]:
  """The :data:`PANELS` that some of ``curves`` have values for, and with
  ``train`` the ``train.<metric>`` ones too."""
  names = [name for name, (metric, _, _) in PANELS.items()
           if any(metric in _source(c, metric)[1] for c in curves)]
  if train:
    names += sorted({k for c in curves for k in c.metrics
                     if k.startswith(TRAIN)})
  return tuple(names)


def _cells(curves: Sequence[Curve], panels: Sequence[str]) -> list[tuple]:
  """``(metric, title, ylabel, algorithm)`` of each panel drawn: a
  training-loss panel per algorithm (each algorithm's is its own
  objective, not comparable with another's), titled by its method where
  its curves have one ("FedAvg"), else by the algorithm ("augfl" for
  "AugFL w/ PM" and "AugFL w/o PM"); ``algorithm`` None where every curve
  is drawn."""
  methods = {}  # algorithm -> its curves' methods
  for c in curves:
    if "train_loss" in c.metrics:
      methods.setdefault(c.algorithm, set()).add(c.method or c.algorithm)
  cells = []
  for name in panels:
    metric, title, ylabel = panel(name)
    if name == "train_loss" and len(methods) > 1:
      cells += [(metric, f"{title}: " + (
          next(iter(names)) if len(names) == 1 else algorithm), ylabel,
                 algorithm) for algorithm, names in methods.items()]
    else:
      cells.append((metric, title, ylabel, None))
  return cells


class _PlainLog(ticker.LogFormatter):
  """A log axis's tick labels as plain numbers (0.5, 1, 10), not 5e-01 or
  mathtext powers; which ticks are labelled, as matplotlib's."""

  def _num_to_string(self, x, vmin, vmax):
    del vmin, vmax  # the number alone
    return f"{x:g}"


def _grid(count: int) -> tuple[int, int]:
  """``(rows, columns)`` for ``count`` panels: a row of up to 3, then rows
  of 2 (4 panels) or 3."""
  columns = count if count <= 3 else 2 if count == 4 else 3
  return math.ceil(count / columns), columns


def _legend(fig, handles: list, labels: list[str], caption: str):
  """The figure's legend under its panels: its entries side by side, as
  many as fit the figure's width, under ``caption`` (its title; on a line
  a part, then wrapped shorter, where one line does not fit)."""
  renderer = fig.canvas.get_renderer()
  parts = caption.split("; ")
  for title in dict.fromkeys([caption, "\n".join(parts)] + [
      "\n".join(textwrap.fill(p, width) for p in parts)
      for width in (40, 30, 20)]):
    for columns in range(len(labels), 0, -1):
      legend = fig.legend(handles, labels, loc="outside lower center",
                          frameon=False, title=title or None, ncols=columns)
      if legend.get_window_extent(renderer).width <= fig.bbox.width:
        return legend
      legend.remove()
  return fig.legend(handles, labels, loc="outside lower center",
                    frameon=False, title=title or None)  # wider than it


def _draw_panel(ax, curves: Sequence[Curve], cell: tuple, colors,
                step: float) -> list[tuple]:
  """Draws ``cell``'s (:func:`_cells`) curves on ``ax``: each curve's
  line, or markers with error bars where it has fewer than four points
  (those of several curves ``step`` rounds apart, centred on their round),
  its band. Returns ``(curve's index, its line, what its band is, how it
  is drawn or None, x)`` per curve drawn."""
  metric, title, ylabel, algorithm = cell
  scale = 100.0 if "accuracy" in metric else 1.0
  todo = []
  for k, curve in enumerate(curves):
    rounds, source = _source(curve, metric)
    if metric in source and algorithm in (None, curve.algorithm):
      todo.append((k, np.asarray(rounds, dtype=np.float64), source,
                   *band(source, metric, scale)))
  bars = [k for k, x, _, _, low, *_ in todo if low is not None and len(x) < 4]
  drawn, positive = [], True
  for k, x, source, mean, low, high, what in todo:
    positive &= bool(np.all(source[metric] > 0))
    color = colors(k % colors.N)
    few = len(x) < 4  # markers: a line of one point is not seen
    if k in bars:
      x = x + (bars.index(k) - (len(bars) - 1) / 2) * step
      (line, *_) = ax.errorbar(
          x, mean, yerr=np.nan_to_num([mean - low, high - mean]),
          color=color, marker="o", capsize=2.5, markersize=4)
    else:
      (line,) = ax.plot(x, mean, color=color, marker="o" if few else None,
                        markersize=4)
      if low is not None:
        ax.fill_between(x, low, high, alpha=0.2, color=color, linewidth=0)
    style = None if low is None else "error bars" if k in bars else "bands"
    drawn.append((k, line, what, style, x))
  ax.set(title=title, xlabel="round", ylabel=ylabel)
  ax.xaxis.set_major_locator(ticker.MaxNLocator(
      5, steps=[1, 2, 2.5, 5, 10], integer=True))
  if (metric == "train_loss" or metric.startswith(TRAIN)) and positive:
    ax.set_yscale("log")
    lowest = min(np.nanmin(line.get_ydata()) for _, line, *_ in drawn)
    ax.set_ylim(bottom=lowest / 3)  # a band's end at 0 is off the axis
    ax.yaxis.set_major_formatter(_PlainLog())
    ax.yaxis.set_minor_formatter(_PlainLog(labelOnlyBase=False,
                                           minor_thresholds=(1, 0.4)))
  ax.grid(alpha=0.3)
  return drawn


def make_figure(curves: Sequence[Curve], title: str = "",
                panels: Sequence[str] = (),
                figsize: Sequence[float] | None = None,
                font_size: float | None = None):
  """The ``panels`` (:data:`PANELS`; default :func:`available_panels`) of
  ``curves``, a grid that fits them (no empty cell; a shorter last row is
  centred), one colour per curve throughout, one legend under the panels
  whose title says what the bands are; ``figsize`` ``(width, height)`` in
  inches (default by the grid), ``font_size`` in points (default
  matplotlib's). Every panel spans rounds 0 to the runs' last; a curve of
  fewer than four points is drawn as markers with error bars, those of
  curves that share a round side by side.

  Raises:
    PlotError: a bad option, or a panel that no curve has values for.
  """
  panels = check_panels(panels) if panels else available_panels(curves)
  have = available_panels(curves, train=True)
  missing = [p for p in panels if p not in have]
  if missing:
    raise PlotError(f"--panels: the runs have no {missing[0]} values (they "
                    f"have: {', '.join(have)})")
  cells = _cells(curves, panels)
  rows, columns = _grid(len(cells))
  rc = {} if font_size is None else {"font.size": check_font_size(font_size)}
  figsize = check_figsize(figsize) if figsize is not None else (
      3.2 * columns, 2.5 * rows + 0.7 + 0.3 * bool(title))
  with plt.rc_context(rc):
    fig = plt.figure(figsize=figsize, layout="constrained")
    grid = fig.add_gridspec(rows, 2 * columns)  # a panel: two columns
    colors = plt.get_cmap("tab10" if len(curves) <= 10 else "tab20")
    last = _last_round(curves)
    drawn = []
    for i, cell in enumerate(cells):
      row, column = divmod(i, columns)
      start = 2 * column + columns - min(columns, len(cells) - row * columns)
      drawn += _draw_panel(fig.add_subplot(grid[row, start:start + 2]),
                           curves, cell, colors, 0.03 * max(last, 1))
    xs = np.concatenate([x for *_, x in drawn])
    pad = max(0.02 * last, 0.5)  # a marker at an end is not cut in half
    for ax in fig.axes:
      ax.set_xlim(xs.min() - pad if xs.min() <= 0 else 0,
                  max(xs.max(), last) + pad)
    handles = {k: (line, legend_label(curves[k])) for k, line, *_ in
               reversed(drawn)}  # each curve's first line
    _legend(fig, *zip(*(handles[k] for k in sorted(handles))),
            band_caption({what for _, _, what, style, _ in drawn if style},
                         {style for *_, style, _ in drawn if style}))
    if title:
      fig.suptitle(title)
  return fig


def _number(value: float) -> str:
  return "–" if not math.isfinite(value) else f"{value:.4g}" if abs(
      value) < 1e4 else f"{value:.0f}"


def values_table(curves: Sequence[Curve], panels: Sequence[str] = ()
                 ) -> str:
  """The values the figure of ``panels`` (default: the available ones)
  draws, as Markdown: per panel, a row per round and a column per curve
  that has it, each cell the line's value and, in brackets, its band
  (:func:`band`: the 95% interval across seeds, or a single run's across
  clients)."""
  panels = check_panels(panels) if panels else available_panels(curves)
  lines = []
  for name in panels:
    metric, title, ylabel = panel(name)
    scale = 100.0 if "accuracy" in metric else 1.0
    columns = {}
    for curve in curves:
      rounds, source = _source(curve, metric)
      if metric in source:
        mean, low, high, _ = band(source, metric, scale)
        columns[legend_label(curve)] = {
            t: _number(m) + ("" if low is None else
                             f" [{_number(lo)}, {_number(hi)}]")
            for t, m, lo, hi in zip(rounds, mean, *(
                (mean, mean) if low is None else (low, high)))}
    if not columns:
      continue
    lines += [f"{title}: {ylabel}", "",
              "| round | " + " | ".join(columns) + " |",
              "|---" * (len(columns) + 1) + "|"]
    for t in sorted(set().union(*columns.values())):
      lines.append(f"| {t} | " + " | ".join(
          column.get(t, "") for column in columns.values()) + " |")
    lines.append("")
  kinds = {band(_source(c, panel(n)[0])[1], panel(n)[0], 1.0)[3]
           for c in curves for n in panels
           if panel(n)[0] in _source(c, panel(n)[0])[1]}
  caption = band_caption(kinds - {NO_BAND}, {"brackets"})
  return "\n".join(lines + ([caption] if caption else [])) + "\n"


def check_output(output: str) -> None:
  """Checks, before any work, that the figure can be written to
  ``output``: ``output_files.check_figure_file``'s checks (a suffix of
  :data:`FORMATS`).

  Raises:
    PlotError: one line saying what is wrong.
  """
  try:
    output_files.check_figure_file(output)
  except ValueError as e:
    raise PlotError(str(e)) from None


def plot_curves(curves: Sequence[Curve], output: str, title: str = "",
                **options) -> None:
  """Writes ``make_figure(curves, title, **options)`` (``panels``,
  ``figsize``, ``font_size``) to ``output`` (:func:`write_figure`)."""
  check_output(output)
  fig = make_figure(curves, title, **options)
  try:
    write_figure(fig, output)
  finally:
    plt.close(fig)


def write_figure(fig, output: str) -> None:
  """Writes ``fig`` to ``output``, in the format its suffix names
  (:func:`check_output`), of the figure's size: a PNG (or other raster) at
  :data:`DPI`, a PDF or PostScript with TrueType fonts embedded (not Type
  3, which some publishers refuse), an SVG with its text as paths. It goes
  through a temporary file renamed into place: a failure (a full disk)
  keeps the figure there before whole, and says so naming ``output``
  (``PlotError``)."""
  suffix = os.path.splitext(output)[1][1:].lower()
  try:
    with plt.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42}):
      write_output(output, lambda tmp: fig.savefig(tmp, format=suffix,
                                                   dpi=DPI))
  except ValueError as e:
    raise PlotError(str(e)) from None


def _figure_options() -> dict:
  """``make_figure``'s options from ``--panels``, ``--figsize`` and
  ``--font_size``, checked (:class:`PlotError`, one line)."""
  return {"panels": check_panels(FLAGS.panels),
          "figsize": check_figsize(FLAGS.figsize) if FLAGS.figsize else None,
          "font_size": (None if FLAGS.font_size is None
                        else check_font_size(FLAGS.font_size))}


def _plot(paths: list[str]) -> None:
  check_output(FLAGS.output)
  if FLAGS.table:
    try:
      output_files.check_output_file(FLAGS.table, "--table")
    except ValueError as e:
      raise PlotError(str(e)) from None
  options = _figure_options()
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
  plot_curves(curves, FLAGS.output, FLAGS.title, **options)
  print(f"{len(runs)} runs, {len(curves)} curves "
        f"({'; '.join(c.label for c in curves)}) -> {FLAGS.output}")
  if FLAGS.table:
    text = values_table(curves, options["panels"])
    try:
      write_output(FLAGS.table, lambda tmp: pathlib.Path(tmp).write_text(text),
                   "--table")
    except ValueError as e:
      raise PlotError(str(e)) from None
    print(f"their values -> {FLAGS.table}")
  if curves[0].folded:
    print("fields that also differ, with the method: "
          + ", ".join(curves[0].folded))


def main(argv: list[str]) -> None:
  # fontTools, subsetting a PDF's fonts, logs each step at INFO
  std_logging.getLogger("fontTools").setLevel(std_logging.WARNING)
  runner.run_command(lambda: _plot(argv[1:]))


if __name__ == "__main__":
  flags.DEFINE_string("output", "curves.png", "the figure's file, of a "
                      "format matplotlib writes (.png, .pdf, .svg, ...), in "
                      "a directory that exists")
  flags.DEFINE_list("label_by", [],
                    "config fields that name a curve (dotted, e.g. augfl.lam, "
                    "or a field's last part); default: the fields that differ")
  flags.DEFINE_string("title", "", "figure title")
  flags.DEFINE_list("panels", [], "the panels, in order, of "
                    + ", ".join(PANELS) + " (train_loss: one per algorithm)"
                    ", or train.<metric>, a training metric the runs record "
                    "(e.g. train.server_reg_norm: the evaluated rounds' "
                    "values; --eval_every=1 records every round's); default:"
                    " those of the first four the runs have values for")
  flags.DEFINE_string("table", None, "also write the panels' values, a "
                      "row per round and a column per curve with its band, "
                      "to this Markdown file")
  flags.DEFINE_list("figsize", [], "the figure's width and height in inches, "
                    "e.g. 7,2.5; default: 3.2 by 2.5 a panel, and the legend")
  flags.DEFINE_float("font_size", None, "the font size in points; default: "
                     "matplotlib's (10)")
  runner.main_runner(main, runner.parse_flags_and_paths)
