r"""A grid of runs over flag values and seeds, with a table of the results.

  python -m experiments.sweep --algorithm=augfl \
      --grid="rho=0.7,0.2,0.05;alpha=0.03,0.1" --seeds=0,1,2 \
      --output_dir=runs/sweep_augfl

Every other ``experiments.run`` flag (``--dataset``, ``--rounds``, ...) applies
to every cell. Each (cell, seed) run writes its own directory under
``--output_dir``; a finished run of the same configuration is reused and
an interrupted one continues from its checkpoint, so an interrupted sweep
resumes (a larger ``--rounds`` trains the finished runs further). Writes
``results.csv`` (one row per run) and ``results.md`` (final test-client
accuracy, mean ± std over seeds, per cell).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import os
import sys
from typing import Any, Callable

from absl import app
from absl import flags
import numpy as np

from experiments import run as run_flags  # defines the run flags
from experiments import runner
from experiments.config import RunConfig

FLAGS = flags.FLAGS


def define_seeds_flag() -> None:
  flags.DEFINE_list("seeds", ["0", "1", "2"], "seeds of every cell")


def parse_list(values: list[str], cast: type, flag: str) -> list:
  """A list flag's values as ``cast`` (int, float); ``ValueError`` names
  the flag."""
  try:
    return [cast(v) for v in values]
  except ValueError:
    raise ValueError(f"--{flag} takes {cast.__name__} values separated by "
                     f"commas, got {','.join(values)!r}") from None


def parse_grid(text: str) -> list[dict[str, object]]:
  """'a=1,2;b=x' -> [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}] (typed by field)."""
  types = {f.name: f.type for f in dataclasses.fields(RunConfig)}
  axes = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, _, values = part.partition("=")
    name = name.strip()
    if name not in types or not values:
      raise ValueError(f"bad --grid entry {part!r}: expected name=v1,v2 with a "
                       f"name among {', '.join(types)}")
    cast = {"int": int, "float": float,
            "bool": lambda v: v.lower() in ("1", "true")}.get(
                types[name].replace(" | None", ""), str)
    axes.append([(name, cast(v.strip())) for v in values.split(",")])
  return [dict(cell) for cell in itertools.product(*axes)]


def cell_name(cell: dict[str, object]) -> str:
  return "_".join(f"{k}={v}" for k, v in cell.items()).replace("/", "-") or "base"


def finished_run(run_dir: str, config: RunConfig) -> dict[str, Any] | None:
  """The summary of the run in ``run_dir`` if it is ``config``'s and has
  done ``config.rounds`` rounds; ``None`` if it must run (absent,
  interrupted, or fewer rounds: it continues).

  Raises:
    ValueError: ``run_dir`` holds a run of another configuration (fields
      outside ``runner.RESUMABLE_FIELDS`` differ).
  """
  summary_path = os.path.join(run_dir, "summary.json")
  if not os.path.exists(summary_path):
    return None
  with open(os.path.join(run_dir, "config.json")) as f:
    saved = json.load(f)
  diff = runner.config_diff(saved, runner.validate(config),
                            runner.RESUMABLE_FIELDS)
  if diff:
    raise ValueError(f"{run_dir} holds a run of another configuration "
                     f"({'; '.join(diff)}); choose another --output_dir or "
                     "remove that run")
  with open(summary_path) as f:
    summary = json.load(f)
  return summary if summary["rounds"] == config.rounds else None


def run_cells(base: RunConfig, cells: list[dict[str, object]],
              seeds: list[int], out: str,
              names: list[str] | None = None,
              transform: Callable[[RunConfig], Callable[..., Any] | None]
              | None = None) -> list[dict[str, object]]:
  """Runs every (cell, seed) under ``out/<name>/seed<seed>``.

  Args:
    base: the configuration every cell starts from.
    cells: ``RunConfig`` field overrides, one dict per cell.
    seeds: the seeds of every cell.
    out: the root of the run directories.
    names: the cells' directory names (default ``cell_name(cell)``).
    transform: ``transform(config)`` gives the ``transform_data`` hook of
      ``runner.run`` for that run (e.g. ``experiments.ood``'s held-out
      domain), or ``None``.

  A finished run of the same configuration is reused (``finished_run``); an
  interrupted one, or one with fewer rounds, continues from its checkpoint.
  Prints one line per run, with ``[k/n]`` progress.

  Returns:
    One row per run: ``cell``, ``seed``, the cell's fields,
    ``final_accuracy``, ``best_accuracy``, ``run_dir``.
  """
  names = names or [cell_name(cell) for cell in cells]
  rows = []
  jobs = list(itertools.product(zip(names, cells), seeds))
  for k, ((name, cell), seed) in enumerate(jobs, 1):
    config = dataclasses.replace(base, seed=seed, **cell)
    run_dir = os.path.join(out, name, f"seed{seed}")
    progress = f"[{k}/{len(jobs)}] {name} seed {seed}"
    summary = finished_run(run_dir, config)
    if summary is not None:
      print(f"{progress}: reusing {run_dir}", flush=True)
    else:
      print(f"{progress} ...", flush=True)
      resume = runner.resumable(run_dir)  # an interrupted run continues
      summary = runner.run(
          config, run_dir, log=lambda s: None, resume=resume,
          overwrite=not resume,
          transform_data=transform(config) if transform else None)
      print(f"{progress}: final accuracy "
            f"{100 * summary['final_accuracy']:.2f} "
            f"({summary['seconds']:.0f} s)", flush=True)
    rows.append({"cell": name, "seed": seed, **cell,
                 "final_accuracy": summary["final_accuracy"],
                 "best_accuracy": summary["best_accuracy"],
                 "run_dir": run_dir})
  return rows


def run_command(body: Callable[[], Any]) -> Any:
  """A comparison command's ``main`` (sweep, ablations, table2, ood): quiet
  logs, one compilation cache for all its runs (``--compilation_cache``),
  and ``body()``, whose bad configuration or failed run ends the process as
  one line on stderr (exit 2) instead of a traceback."""
  run_flags.quiet_logging()
  if FLAGS.compilation_cache:  # the runs share compiled programs
    run_flags.enable_compilation_cache(FLAGS.compilation_cache_dir)
  try:
    return body()
  except (ValueError, FloatingPointError, FileNotFoundError,
          runner.data.DatasetUnavailableError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  del argv

  def body():
    base = run_flags.config_from_flags()
    out = FLAGS.output_dir or f"runs/sweep_{base.algorithm}"
    return base, out, run_cells(base, parse_grid(FLAGS.grid),
                                parse_list(FLAGS.seeds, int, "seeds"), out)

  base, out, rows = run_command(body)
  write_tables(rows, out, f"{base.algorithm} on {base.dataset}, "
               f"{base.rounds} rounds")


def write_tables(rows: list[dict[str, object]], out: str, title: str) -> str:
  """Writes ``results.csv`` and ``results.md`` (mean ± std over seeds per
  cell) to ``out``; returns the markdown."""
  with open(os.path.join(out, "results.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  lines = [f"{title}: final test-client accuracy (%), mean ± std over seeds",
           "",
           "| cell | accuracy | seeds |", "|---|---|---|"]
  for cell in dict.fromkeys(r["cell"] for r in rows):
    acc = [100 * r["final_accuracy"] for r in rows if r["cell"] == cell]
    lines.append(f"| {cell} | {np.mean(acc):.2f} ± {np.std(acc):.2f} | "
                 f"{len(acc)} |")
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(text)
  print(text)
  return text


if __name__ == "__main__":
  flags.DEFINE_string("grid", "", "cells: 'name=v1,v2;name2=w1,w2' over "
                      "RunConfig fields")
  define_seeds_flag()
  app.run(main)
