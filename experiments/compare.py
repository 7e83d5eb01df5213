r"""Two configurations compared on the same clients, seed by seed.

  python -m experiments.compare \
      --runs=cheap=runs/table2_fmnist_cpu/fashion_mnist/augfl \
      --runs=full=runs/table2_fmnist/fashion_mnist/augfl --seeds=0,1,2

Each ``--runs=NAME=DIR`` names a directory holding one finished run per
seed, ``DIR/seed<s>`` (as ``experiments.table2`` and ``experiments.sweep``
lay them out). The first is compared with each of the others. Per seed:
each run's final accuracy with its 95% interval across clients, and the
paired difference (same seed, same clients) with its interval across
clients; over the seeds: each configuration's mean with its Student-t
interval across seeds, and the mean paired difference with its t-interval
across seeds (``experiments.scores`` defines them). ``--clients`` picks the
clients: ``auto`` (the default) compares the test-split clients where every
run has them, else the protocol's held-out clients; ``test_split`` or
``held_out`` asks for one set (the held-out clients are the ones the paper
scores; under ``--data.partition=authors``, the authors' 10 fixed users).
Runs of one seed must have been scored on the same clients (the same
partition protocol); otherwise the command stops with one line.

The table (markdown) is printed, and written to ``--output`` when given.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

from augfl_jax.core import intervals
from experiments import scores

FLAGS = flags.FLAGS

CLIENTS = ("auto", "test_split", "held_out")


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_multi_string("runs", [], "NAME=DIR: DIR/seed<s> holds a "
                            "finished run of seed s; the first is compared "
                            "with the others")
  flags.DEFINE_list("seeds", ["0"], "seeds to compare")
  flags.DEFINE_enum("clients", "auto", CLIENTS, "the clients compared: "
                    "auto = the test-split clients where every run has "
                    "them, else the protocol's held-out clients; test_split;"
                    " held_out")
  flags.DEFINE_string("output", "", "also write the table to this file")


def parse_runs(specs: list[str]) -> dict[str, str]:
  """``["a=DIR", ...]`` -> ``{"a": "DIR", ...}`` in order."""
  runs = {}
  for spec in specs:
    name, sep, directory = spec.partition("=")
    if not sep or not name or not directory:
      raise ValueError(f"--runs={spec}: expected NAME=DIR")
    if name in runs:
      raise ValueError(f"--runs: {name!r} is named twice")
    runs[name] = directory
  if len(runs) < 2:
    raise ValueError("--runs: give at least two NAME=DIR to compare")
  return runs


def _pct(interval: intervals.Interval | None) -> str:
  return "-" if interval is None else interval.format()


def compare(runs: dict[str, str], seeds: list[int], clients: str = "auto"
            ) -> str:
  """The markdown table of ``runs`` (name -> directory) over ``seeds``,
  scored on ``clients`` (one of ``CLIENTS``).

  Raises:
    ValueError: a missing or unfinished run, runs of one seed scored on
      different clients, an unknown ``clients``, or ``test_split`` asked of
      a run without test-split clients.
  """
  if clients not in CLIENTS:
    raise ValueError(f"clients must be one of {CLIENTS}, got {clients!r}")
  loaded = []
  for name, directory in runs.items():
    for seed in seeds:
      run_dir = os.path.join(directory, f"seed{seed}")
      if not os.path.exists(os.path.join(run_dir, "summary.json")):
        raise ValueError(f"{run_dir}: no finished run (no summary.json)")
      loaded.append(scores.load_run_score(run_dir, name, seed))
  test_split = scores.uses_test_split(loaded)
  if clients == "test_split" and not test_split:
    missing = next(s.run_dir for s in loaded if s.test_split is None)
    raise ValueError(f"{missing}: scored on no test-split clients (its "
                     "dataset has no test split); use --clients=held_out")
  test_split = test_split and clients != "held_out"
  by_key = {(s.method, s.seed): s for s in loaded}
  names = list(runs)
  first, others = names[0], names[1:]
  scored_on = ("test-split clients" if test_split
               else "the protocol's held-out clients")
  lines = [f"Scored on {scored_on}; 95% intervals: across clients for a "
           "seed, Student-t across seeds for a mean.", "",
           "| seed | " + " | ".join(names) + " | " +
           " | ".join(f"{first} - {other}" for other in others) + " |",
           "|---" * (1 + len(names) + len(others)) + "|"]
  for seed in seeds:
    cells = [_pct(by_key[name, seed].headline(test_split).interval)
             for name in names]
    cells += [_pct(by_key[first, seed].headline(test_split).minus(
        by_key[other, seed].headline(test_split))) for other in others]
    lines.append(f"| {seed} | " + " | ".join(cells) + " |")
  means = [_pct(scores.across_seeds(loaded, name, test_split))
           for name in names]
  diffs = [_pct(scores.paired(loaded, first, other, test_split)[1])
           for other in others]
  lines.append(f"| mean of {len(seeds)} | " + " | ".join(means + diffs)
               + " |")
  lines += ["", "Runs: " + "; ".join(f"{name} = {directory}/seed<s>"
                                     for name, directory in runs.items())]
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  del argv
  try:
    text = compare(parse_runs(FLAGS.runs),
                   [int(s) for s in FLAGS.seeds], FLAGS.clients)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(text)
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  define_flags()
  app.run(main)
