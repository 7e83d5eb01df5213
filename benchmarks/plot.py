r"""Per-round time (or memory) against the number of clients, one line per
strategy.

  python -m benchmarks.plot RESULTS.json [MORE.json ...] --output=plot.png
  python -m benchmarks.plot RESULTS.json --value=memory --output=mem.png

With ``--value=memory`` the y axis is XLA's compiled memory of the round
(arguments, outputs and temporaries: ``xla_memory.peak_bytes``), in MiB;
lines of AugFL's factored dense updates are labelled ``factored``.

One panel per (algorithm, model, conv_impl, examples); solid lines are our
strategies (median, with min-max error bars), dashed lines the references
timed in the same runs. Log-log axes, with a dotted slope-1 guide: a
per-round time linear in the number of clients runs parallel to it. Prints,
per line, the least-squares slope of log(median) against log(clients)
(1 = linear) and the median time per client at each number of clients.
"""

from __future__ import annotations

import collections
import json
import math
from typing import Any

from absl import flags

from augfl_jax.commands import output_files, runner

FLAGS = flags.FLAGS
# What every result of round_cost records, that a figure reads.
RESULT_KEYS = ("algorithm", "model", "conv_impl", "examples", "num_clients",
               "strategy", "round_s")


def load(paths: list[str]) -> list[dict[str, Any]]:
  """The ``results`` of every JSON file written by ``round_cost``.

  Raises:
    ValueError: no path, or a file that is not such a JSON file (one line
      naming it).
  """
  if not paths:
    raise ValueError("name the JSON files of benchmarks.round_cost to plot: "
                     "python -m benchmarks.plot RESULTS.json [MORE.json ...]")
  results = []
  for path in paths:
    try:
      with open(path) as fh:
        found = json.load(fh)["results"]
      lacking = [k for k in RESULT_KEYS for r in found if k not in r]
    except (OSError, ValueError, KeyError, TypeError) as e:
      lacking = [e.strerror if isinstance(e, OSError) else (
          "it has no results" if isinstance(e, (KeyError, TypeError))
          else "it is not JSON")]
    else:
      lacking = [f"a result has no {lacking[0]!r}"] if lacking else []
    if lacking:
      raise ValueError(f"{path}: not a results file of "
                       f"benchmarks.round_cost ({lacking[0]})")
    results.extend(found)
  return results


def label(result: dict[str, Any]) -> str:
  """The result's strategy, with ``factored`` for AugFL's factored dense
  updates."""
  mode = result.get("dense_updates", "materialised")
  return result["strategy"] + ("" if mode == "materialised" else f" {mode}")


def series(results: list[dict[str, Any]], value: str = "time"
           ) -> dict[tuple, dict[str, list]]:
  """``{panel: {label: [(clients, median, min, max), ...]}}``, sorted by C;
  ``value="memory"``: ``(clients, MiB, MiB, MiB)`` of XLA's peak bytes."""
  panels: dict[tuple, dict[str, dict[int, tuple]]] = collections.defaultdict(
      lambda: collections.defaultdict(dict))
  for r in results:
    panel = (r["algorithm"], r["model"], r["conv_impl"], r["examples"])
    if value == "memory":
      mib = r["xla_memory"]["peak_bytes"] / 2 ** 20
      panels[panel][label(r)][r["num_clients"]] = (mib, mib, mib)
      continue
    t = r["round_s"]
    panels[panel][label(r)][r["num_clients"]] = (
        t["median"], t["min"], t["max"])
    for ref, rt in r.get("references", {}).items():
      panels[panel]["ref " + ref][r["num_clients"]] = (
          rt["median"], rt["min"], rt["max"])
  return {p: {name: [(c,) + v for c, v in sorted(points.items())]
              for name, points in lines.items()}
          for p, lines in panels.items()}


def loglog_slope(points: list[tuple]) -> float:
  """Least-squares slope of log(median s) on log(clients); 1 = linear."""
  if len(points) < 2:
    return float("nan")
  xs = [math.log(p[0]) for p in points]
  ys = [math.log(p[1]) for p in points]
  mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
  return (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) /
          sum((x - mx) ** 2 for x in xs))


def summary(results: list[dict[str, Any]], value: str = "time") -> str:
  """One line per plotted line: its log-log slope and s (or MiB) per
  client."""
  lines = []
  unit, scale = ("MiB", 1.0) if value == "memory" else ("ms", 1e3)
  for panel, labelled in sorted(series(results, value).items()):
    for name, points in sorted(labelled.items()):
      per_client = ", ".join(f"{p[0]}: {p[1] / p[0] * scale:.2f} {unit}"
                             for p in points)
      lines.append(f"{'/'.join(map(str, panel))} {name}: slope "
                   f"{loglog_slope(points):.3f}; per client {per_client}")
  return "\n".join(lines)


def plot(results: list[dict[str, Any]], output: str, value: str = "time"
         ) -> None:
  """Draws ``series(results, value)`` to ``output`` (any matplotlib
  format)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  data = series(results, value)
  if not data:
    raise ValueError("no results to plot")
  fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4.5),
                           squeeze=False)
  for ax, (panel, lines) in zip(axes[0], sorted(data.items())):
    lo, hi = float("inf"), 0.0
    for name, points in sorted(lines.items()):
      c = [p[0] for p in points]
      med = [p[1] for p in points]
      err = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
      ax.errorbar(c, med, yerr=err, marker="o", capsize=3, label=name,
                  linestyle="--" if name.startswith("ref") else "-")
      lo, hi = min(lo, min(c)), max(hi, max(c))
    if hi > lo:
      first = min(p[1] for pts in lines.values() for p in pts if p[0] == lo)
      ax.plot([lo, hi], [first, first * hi / lo], ":", color="grey",
              label="linear in C")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("clients per round")
    ax.set_ylabel("XLA memory of a round (MiB)" if value == "memory"
                  else "seconds per round")
    algorithm, model, impl, examples = panel
    ax.set_title(f"{algorithm}, {model} ({impl}), n={examples}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(output, dpi=120)


def _plot_files(paths: list[str]) -> None:
  """Plots the results files ``paths`` as the flags say."""
  output_files.check_figure_file(FLAGS.output)
  results = load(paths)
  plot(results, FLAGS.output, FLAGS.value)
  print(summary(results, FLAGS.value))
  print(f"wrote {FLAGS.output}")


def main(argv: list[str]) -> None:
  """The command: ``argv[1:]`` are the results files; a file that cannot
  be read or an ``--output`` that cannot be written is one line on stderr
  and exit code 2."""
  runner.run_command(lambda: _plot_files(argv[1:]))


if __name__ == "__main__":
  flags.DEFINE_string("output", "round_cost.png", "the figure's file (.png, "
                      ".pdf, .svg, ...), in a directory that exists")
  flags.DEFINE_enum("value", "time", ["time", "memory"], "seconds per "
                    "round, or XLA's memory of a round")
  runner.main_runner(main, runner.parse_flags_and_paths)
