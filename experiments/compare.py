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

``--round=R`` compares the runs' evaluations of round R instead of their
last (a run of 300 rounds that scored its test-split clients at round 100,
``--eval.test_split_every``, against a run of 100). ``--by_round`` gives,
instead, the first run minus each other at every round all runs evaluated,
on the held-out clients and, at the rounds every run scored them, the
test-split clients: the mean over seeds of the per-seed paired difference
with its t-interval across seeds, and the first round whose interval
leaves 0; ``--figure`` draws them.

The table (markdown) is printed, and written to ``--output`` when given
(its directory must exist; it is checked before anything is read), through
a temporary file renamed into place: the file there before is replaced
whole or kept.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from absl import flags

from augfl_jax.commands import output_files, runner
from augfl_jax.core import intervals
from augfl_jax.training import outputs
from experiments import scores

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
  flags.DEFINE_integer("round", None, "compare the runs' evaluations of this "
                       "round (every run must have evaluated it; its "
                       "test-split clients where every run scored them "
                       "then); default: their last", lower_bound=1)
  flags.DEFINE_bool("by_round", False, "instead, the first run minus each "
                    "other at every round all runs evaluated, across seeds, "
                    "and the first round whose interval leaves 0")
  flags.DEFINE_string("figure", "", "with --by_round, also draw the paired "
                      "differences against the round to this file (.png, "
                      ".pdf, .svg)")


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


def _at(by_round: dict[int, scores.RunScore], round_: int | None,
        path: str) -> scores.RunScore:
  """A run's scores (:func:`scores.load_round_scores`) of round
  ``round_`` (``None``: its last)."""
  if round_ is None:
    return by_round[max(by_round)]
  if round_ not in by_round:
    raise ValueError(f"--round={round_}: {path} has no evaluation of round "
                     f"{round_} (it evaluated rounds "
                     f"{', '.join(map(str, sorted(by_round)[:8]))}"
                     f"{', ...' if len(by_round) > 8 else ''})")
  return by_round[round_]


def compare(runs: dict[str, str], seeds: list[int] | None = None,
            clients: str = "auto", round_: int | None = None) -> str:
  """The markdown table of ``runs`` (name -> a run's directory or a
  directory of seeds, :func:`run_dirs`) over ``seeds``, scored on
  ``clients`` (one of ``CLIENTS``) after round ``round_`` (``None``: each
  run's last).

  Raises:
    ValueError: a missing or unfinished run (:func:`run_dirs`), runs of one
      seed scored on different clients, an unknown ``clients``,
      ``test_split`` asked of a run without test-split clients, or a
      ``round_`` a run did not evaluate.
  """
  if clients not in CLIENTS:
    raise ValueError(f"clients must be one of {CLIENTS}, got {clients!r}")
  seeds, paths = run_dirs(runs, seeds)
  loaded = [_at(scores.load_round_scores(path, name, seed), round_, path)
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
  after = "" if round_ is None else f" after round {round_}"
  lines = [f"Scored on {scored_on}{after}; 95% intervals: across clients "
           "for a seed, Student-t across seeds for a mean.", "",
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


def by_round(runs: dict[str, str], seeds: list[int] | None = None
            ) -> tuple[str, dict[str, tuple[list[int], list]]]:
  """The first run minus each other at every round that all runs
  evaluated: per round, the mean over seeds of the per-seed paired
  difference on the protocol's held-out clients with its t-interval across
  seeds, and on the test-split clients at the rounds every run scored
  them; the first round whose interval lies wholly above or below 0, and
  whether it stays there. Returns ``(markdown, {"<first> - <other>
  (<clients>)": (rounds, intervals)})``.

  Raises:
    ValueError: as :func:`compare`; runs with no round in common.
  """
  seeds, paths = run_dirs(runs, seeds)
  loaded = {key: scores.load_round_scores(path, *key)
            for key, path in paths.items()}
  common = sorted(set.intersection(*(set(r) for r in loaded.values())))
  if not common:
    raise ValueError("--by_round: the runs have no evaluated round in "
                     "common")
  names = list(runs)
  first = names[0]
  lines = ["Paired differences per evaluated round: mean over "
           f"{len(seeds)} seeds of the per-seed difference on the same "
           "clients, with its 95% Student-t interval across seeds.", ""]
  curves = {}
  for other in names[1:]:
    for test_split, clients in ((False, "held-out clients"),
                                (True, "test-split clients")):
      rounds = [t for t in common if all(
          loaded[key][t].test_split is not None for key in loaded)
                ] if test_split else common
      if not rounds:
        continue
      diffs = []
      for t in rounds:
        at_t = [loaded[key][t] for key in loaded if key[0] in (first, other)]
        diffs.append(scores.paired(at_t, first, other, test_split)[1])
      name = f"{first} - {other} ({clients})"
      curves[name] = (rounds, diffs)
      lines += [f"### {name}", "", "| round | difference |", "|---|---|"]
      lines += [f"| {t} | {_pct(d)} |" for t, d in zip(rounds, diffs)]
      lines += ["", _first_clear(rounds, diffs), ""]
  few = scores.few_seeds_note({name: len(seeds) for name in names})
  if few:
    lines += [few, ""]
  lines.append("Runs: " + "; ".join(f"{name} = {directory}"
                                    for name, directory in runs.items()))
  return "\n".join(lines), curves


def _first_clear(rounds: list[int], diffs: list) -> str:
  """The sentence on the first round whose interval leaves 0."""
  side = [None if d is None or d.low <= 0 <= d.high else d.low > 0
          for d in diffs]
  first = next((i for i, s in enumerate(side) if s is not None), None)
  if first is None:
    return "The interval contains 0 at every round."
  where = "above" if side[first] else "below"
  stays = all(s == side[first] for s in side[first:])
  return (f"The interval first leaves 0 at round {rounds[first]} ({where} "
          "it)" + ("; it stays there to the last round." if stays else
                   "; it does not stay there at every later round."))


def plot_by_round(curves: dict[str, tuple[list[int], list]],
                  output: str) -> None:
  """Draws :func:`by_round`'s differences (%, with their intervals across
  seeds as bands) against the round into ``output``."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 3.2), layout="constrained")
  for name, (rounds, diffs) in curves.items():
    mean = [d.mean * 100 for d in diffs]
    (line,) = ax.plot(rounds, mean, marker="o" if len(rounds) < 12 else None,
                      markersize=3, label=name)
    ax.fill_between(rounds, [d.low * 100 for d in diffs],
                    [d.high * 100 for d in diffs], alpha=0.2,
                    color=line.get_color(), linewidth=0)
  ax.axhline(0, color="black", linewidth=0.8)
  ax.set(xlabel="round", ylabel="difference (accuracy points)")
  ax.grid(alpha=0.3)
  ax.legend(title="bands: 95% CI across seeds", fontsize="small",
            title_fontsize="small")
  try:
    write_output(output, lambda tmp: fig.savefig(
        tmp, format=os.path.splitext(output)[1][1:].lower(), dpi=150),
                 "--figure")
  finally:
    plt.close(fig)


def _main() -> None:
  for path, flag in ((FLAGS.output, "--output"), (FLAGS.figure, "--figure")):
    if path:
      output_files.check_output_file(path, flag)
  if FLAGS.figure and not FLAGS.by_round:
    raise ValueError("--figure draws --by_round's differences: add "
                     "--by_round")
  if FLAGS.by_round and FLAGS.round is not None:
    raise ValueError("--by_round compares every round; leave out --round")
  if FLAGS.by_round:
    text, curves = by_round(parse_runs(FLAGS.runs), parse_seeds(FLAGS.seeds))
    if FLAGS.figure:
      plot_by_round(curves, FLAGS.figure)
  else:
    text = compare(parse_runs(FLAGS.runs), parse_seeds(FLAGS.seeds),
                   FLAGS.clients, FLAGS.round)
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
  del argv  # flags only (runner.parse_flags)
  runner.quiet_library_logs()  # orbax's, as the runs' checkpoints are read
  runner.run_command(_main)


if __name__ == "__main__":
  define_flags()
  runner.main_runner(main)
