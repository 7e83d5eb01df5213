r"""Two configurations compared on the same clients, seed by seed.

  python -m experiments.compare \
      --runs=cheap=runs/table2_fmnist_cpu/fashion_mnist/augfl \
      --runs=full=runs/table2_fmnist/fashion_mnist/augfl --seeds=0,1,2
  python -m experiments.compare \
      --runs=augfl=runs/fashion_mnist_augfl_seed0 \
      --runs=fedavg=runs/fashion_mnist_fedavg_seed0

Each ``--runs=NAME=DIR`` names either a directory of seeds, holding one
finished run per seed in ``DIR/seed<s>`` (as ``experiments.table2`` and
``experiments.sweep`` lay them out), or one finished run's directory (it
holds ``summary.json``, as ``experiments.run`` writes it): the run of the
seed its ``config.json`` names. ``--seeds`` picks the seeds (default: the
seed of the run directories given, else 0); a run directory of a seed that
is not among them is refused. The first is compared with each of the
others. Per seed: each run's final accuracy with its 95% interval across
clients, and the paired difference (same seed, same clients) with its
interval across clients; over the seeds: each configuration's mean with its
Student-t interval across seeds, and the mean paired difference with its
t-interval across seeds (``experiments.scores`` defines them); with fewer
than 3 seeds, a line under the table says that an interval across seeds
needs at least 3.
``--clients`` picks the clients: ``auto`` (the default) compares the
test-split clients where every run has them, else the protocol's held-out
clients; ``test_split`` or ``held_out`` asks for one set (the held-out
clients are the ones the paper scores; under ``--data.partition=authors``,
the authors' 10 fixed users). Runs of one seed must have been scored on the
same clients (the same partition protocol); otherwise the command stops
with one line.

Each run is scored from what its newest checkpoint sealed, and refused in
one line, with the command that writes its files again, where its
``metrics.jsonl``, ``summary.json`` or ``config.json`` are not what it
sealed (``experiments.scores``); one run under two names is refused.

The table (markdown) is printed, and written to ``--output`` when given
(its directory must exist; it is checked before anything is read), through
a temporary file renamed into place: the file there before is replaced
whole or kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Callable

from absl import flags

from augfl_jax.core import intervals
from augfl_jax.training import outputs
from experiments import cli, scores

FLAGS = flags.FLAGS

CLIENTS = ("auto", "test_split", "held_out")


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_multi_string("runs", [], "NAME=DIR: DIR is a finished run's "
                            "directory (it holds summary.json) or a "
                            "directory of seeds (DIR/seed<s>: the run of "
                            "seed s); the first is compared with the others")
  flags.DEFINE_list("seeds", None, "seeds to compare (default: the seed of "
                    "the run directories in --runs, else 0)")
  flags.DEFINE_enum("clients", "auto", CLIENTS, "the clients compared: "
                    "auto = the test-split clients where every run has "
                    "them, else the protocol's held-out clients; test_split;"
                    " held_out")
  flags.DEFINE_string("output", "", "also write the table to this file (in "
                      "a directory that exists)")


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


def parse_seeds(values: list[str] | None) -> list[int] | None:
  """``--seeds``' values as integers (``None``: not given).

  Raises:
    ValueError: a value that is not an integer, or a seed named twice.
  """
  if values is None:
    return None
  try:
    seeds = [int(v) for v in values]
  except ValueError:
    raise ValueError(f"--seeds takes integers separated by commas, got "
                     f"{','.join(values)!r}") from None
  if not seeds:
    raise ValueError("--seeds: give at least one seed")
  twice = sorted({s for s in seeds if seeds.count(s) > 1})
  if twice:
    raise ValueError(f"--seeds: {', '.join(map(str, twice))} named twice; "
                     "name each seed once")
  return seeds


def check_output_file(path: str, flag: str = "--output") -> None:
  """Checks, before any work, that the file ``path`` can be written: not a
  directory, in a directory that exists and where a file can be created.

  Raises:
    ValueError: one line saying what is wrong with ``path``.
  """
  full = os.path.abspath(path)
  parent = os.path.dirname(full)
  if os.path.isdir(full):
    raise ValueError(f"{flag}={path} is a directory: name a file in it")
  if not os.path.isdir(parent):
    what = ("is not a directory" if os.path.exists(parent)
            else "does not exist: create it first")
    raise ValueError(f"{flag}={path}: {parent} {what}")
  if os.path.exists(full) and not (os.path.isfile(full)
                                   and os.access(full, os.W_OK)):
    raise ValueError(f"{flag}={path}: it exists and is not a file that can "
                     "be written; name another")
  try:
    with tempfile.NamedTemporaryFile(dir=parent, prefix=".probe-"):
      pass
  except OSError as e:
    raise ValueError(f"{flag}={path}: a file cannot be created in {parent} "
                     f"({e.strerror or e}); name another directory") from None


def run_dirs(runs: dict[str, str], seeds: list[int] | None
            ) -> tuple[list[int], dict[tuple[str, int], str]]:
  """``(seeds, {(name, seed): run directory})`` of ``runs`` (name -> a run's
  directory or a directory of seeds) over ``seeds`` (``None``: the seed of
  the run directories, else 0).

  Raises:
    ValueError: a missing or unfinished run, a run directory whose
      ``config.json`` names no seed, run directories of different seeds, a
      run directory of a seed other than ``seeds``, or one run under two
      names (the same directory, a link to it, or a run directory and the
      directory of seeds that holds it).
  """
  single = {}  # name -> (run directory, its seed)
  for name, directory in runs.items():
    if os.path.isfile(os.path.join(directory, "summary.json")):
      single[name] = (directory, _seed_of(directory))
    elif os.path.isfile(os.path.join(directory, "metrics.jsonl")):
      raise ValueError(f"{directory}: the run has not finished (no "
                       "summary.json); finish it (experiments.run --resume) "
                       "or compare finished runs")
  if seeds is None:
    found = sorted({seed for _, seed in single.values()})
    if len(found) > 1:
      raise ValueError("--runs: run directories of seeds "
                       f"{', '.join(map(str, found))}, which were not scored "
                       "on the same clients: compare runs of one seed, or "
                       "pass --seeds with directories of seeds")
    seeds = found or [0]
  paths = {}
  for name, directory in runs.items():
    for seed in seeds:
      if name in single:
        path, own = single[name]
        if own not in seeds or len(seeds) > 1:
          raise ValueError(
              f"--runs={name}={directory}: a run of seed {own} alone, and "
              f"--seeds={','.join(map(str, seeds))}; pass --seeds={own}, or "
              "a directory of seeds (DIR/seed<s>)")
      else:
        path = os.path.join(directory, f"seed{seed}")
        if not os.path.isfile(os.path.join(path, "summary.json")):
          raise ValueError(
              f"{path}: no finished run (no summary.json); --runs=NAME=DIR "
              "takes a run's directory or a directory of seeds "
              "(DIR/seed<s>)")
      paths[name, seed] = path
  named = {}  # one run under two names would be compared with itself
  for (name, seed), path in paths.items():
    other = named.setdefault(os.path.realpath(path), name)
    if other != name:
      raise ValueError(f"--runs: {other} and {name} name the same run "
                       f"({path}); name two different runs")
  return seeds, paths


def _seed_of(run_dir: str) -> int:
  """The seed in ``run_dir/config.json``.

  Raises:
    ValueError: the file cannot be read or names no integer seed.
  """
  path = os.path.join(run_dir, "config.json")
  try:
    with open(path) as f:
      config = json.load(f)
  except OSError as e:
    raise ValueError(f"{path}: cannot be read ({e.strerror or e}); it "
                     f"names the run's seed: {outputs.REWRITE}") from None
  except ValueError as e:
    raise ValueError(f"{path}: not readable JSON ({e}); it names the run's "
                     f"seed: {outputs.REWRITE}") from None
  seed = config.get("seed") if isinstance(config, dict) else None
  if not isinstance(seed, int) or isinstance(seed, bool):
    raise ValueError(f"{path}: names no seed (an integer \"seed\")")
  return seed


def _pct(interval: intervals.Interval | None) -> str:
  return "-" if interval is None else interval.format()


def compare(runs: dict[str, str], seeds: list[int] | None = None,
            clients: str = "auto") -> str:
  """The markdown table of ``runs`` (name -> a run's directory or a
  directory of seeds, :func:`run_dirs`) over ``seeds``, scored on
  ``clients`` (one of ``CLIENTS``).

  Raises:
    ValueError: a missing or unfinished run (:func:`run_dirs`), runs of one
      seed scored on different clients, an unknown ``clients``, or
      ``test_split`` asked of a run without test-split clients.
  """
  if clients not in CLIENTS:
    raise ValueError(f"clients must be one of {CLIENTS}, got {clients!r}")
  seeds, paths = run_dirs(runs, seeds)
  loaded = [scores.load_run_score(path, name, seed)
            for (name, seed), path in paths.items()]
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
  for seed in seeds:  # a paired difference needs the same clients
    for other in others:
      scores.check_same_clients(by_key[first, seed], by_key[other, seed],
                                test_split)
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
  few = scores.few_seeds_note({name: len(seeds) for name in names})
  if few:
    lines += ["", few]
  lines += ["", "Runs: " + "; ".join(
      f"{name} = {directory}" + ("/seed<s>" if paths[name, seeds[0]]
                                 != directory else "")
      for name, directory in runs.items())]
  return "\n".join(lines)


def _main() -> None:
  if FLAGS.output:
    check_output_file(FLAGS.output)
  text = compare(parse_runs(FLAGS.runs), parse_seeds(FLAGS.seeds),
                 FLAGS.clients)
  print(text)
  if FLAGS.output:
    write_output(FLAGS.output, lambda tmp: _write_text(tmp, text + "\n"))


def _write_text(path: str, text: str) -> None:
  with open(path, "x") as f:
    f.write(text)


def write_output(path: str, write: Callable[[str], None],
                 flag: str = "--output") -> None:
  """``write(tmp)`` writes the file, then it replaces ``path`` atomically
  (``outputs.replacing``; a symbolic link's target, the link kept): on a
  failure (a full disk) the file there before is kept whole.

  Raises:
    ValueError: one line naming ``path``, the reason, and that the file
      there before is unchanged.
  """
  try:
    with outputs.replacing(os.path.realpath(path)) as tmp:
      write(tmp)
  except OSError as e:
    raise ValueError(f"{flag}={path} could not be written "
                     f"({e.strerror or e}); the file there before, if any, "
                     "is unchanged") from None


def main(argv: list[str]) -> None:
  del argv  # flags only (cli.parse_flags)
  cli.quiet_library_logs()  # orbax's, as the runs' checkpoints are read
  cli.run_command(_main)


if __name__ == "__main__":
  define_flags()
  cli.main_runner(main)
