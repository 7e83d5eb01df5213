r"""The paper's Table II: every method on every dataset, several seeds.

  python -m experiments.table2 --datasets=digits --seeds=0,1,2
  python -m experiments.table2 --datasets=digits,fashion_mnist \
      --methods=fedavg,augfl_wo_pm,augfl --data.data_dir=~/tfds

Protocol (the paper's §VI-A): M = 20, two classes per client, 80% of the
clients train and 20% are held out; every method is scored by ONE rule: a
held-out client personalises the trained state with its support set by the
method's own procedure (fast adaptation of the global model for FedAvg,
Per-FedAvg, FedLP, FedBC and AugFL; the method's local training for FedProto,
FedPCL, FedCP, FedOA) and is scored on its query set. Every other
``experiments.run`` flag applies to every cell; AugFL w/ PM runs at
``--augfl.lam`` (the preset's 5.0 unless a flag or flag file says otherwise;
0 is refused, being AugFL w/o PM). Cells already done are reused
and an interrupted one continues (``sweep.finished_run``), so an interrupted
table resumes; a directory holding cells of another configuration is
refused. ``--finished_only`` runs nothing and tabulates the cells already
finished (runs still going, or run on another machine and copied in),
naming the (method, seed) cells the table lacks.
The runs go to ``--output_dir`` (default ``runs/table2``), each with its
resolved ``config.json``; each run's progress lines are printed with its
place in the table, and the table's time left after each run. They run
one after another in this one process (``sweep.run_cells``): the table
launches no run across processes or hosts.

Every run is scored on its test-split clients where the dataset has a test
split (many held-out clients drawn from it under the same protocol, the
same for every method of a seed: ``--eval.test_clients``), and on the
protocol's own held-out clients. The tables go to ``--results_dir``
(default ``<output_dir>/tables``, beside the runs), per dataset, in
``<results_dir>/<dataset>/``; the repository's committed tables are
written only where ``--results_dir=results`` names them:

* ``table2.md``: the configuration the runs share and each method's own
  hyper-parameters; per method the mean over seeds of the final accuracy
  with its 95% interval across seeds, the paired difference to AugFL w/ PM
  (same seed, same clients) with its interval across seeds, the held-out
  clients' accuracy, and the paper's Table II; the PM's effect (AugFL w/
  PM minus w/o PM, paired) over seeds and per seed; a line saying that an
  interval across seeds needs at least 3 seeds where a method has fewer;
  then every run with its intervals across clients (``experiments.scores``
  defines them all); then where the runs' wall time went, by phase
  (``training.phases``: setup, PM, first round with its compilation,
  rounds, evaluations, checkpoints), summed per method and over the
  table, in seconds and % (:func:`phase_lines`);
* ``table2.csv``: the same figures, in %: one row per run (``seed`` a
  number, intervals across clients), per method (``seed`` "all",
  intervals across seeds) and for the PM's effect (``method``
  ``pm_effect``); ``scored_on`` says whether the accuracy is the
  test-split clients' or the held-out clients';
* ``table2.json``: the configuration the table is of, and each run's
  phases (``runs``: method, seed, ``phase_seconds`` of its
  ``summary.json``, null for a run of a version that did not record
  them; a table of an older version has no ``runs``). A table of another
  configuration (other fields, or seeds or methods it lacks) is never
  overwritten: the command stops before any run unless
  ``--replace_results`` is given.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from absl import flags

from augfl_jax import algorithms, training
from augfl_jax.core import fields, intervals
from augfl_jax.training import outputs, phases
from experiments import cli
from experiments import scores, sweep

# Table II's columns, then the two other methods of this library: the
# default --methods. A method is a registered algorithm (its label from its
# spec) or one of VARIANTS.
COLUMNS = ("fedavg", "fedavg_code", "per_fedavg", "fedproto", "fedcp",
           "fedlp", "fedpcl", "augfl_wo_pm", "augfl", "fedbc", "fedoa")
# Table variants of a registered algorithm: (label, or None for its spec's
# label of the variant's configuration; the variant's fields). "augfl"
# itself runs at lam as the run's flags set it: the preset's 5.0, or a flag
# file's.
VARIANTS = {
    # FedAvg as the authors' code runs it (``Client.train_avg``): the support
    # set only, one full batch, at lr alpha.
    "fedavg_code": ("FedAvg (authors' code)",
                    {"algorithm": "fedavg", "fedavg.train_on": "support",
                     "fedavg.batch_size": 1000, "fedavg.lr": 0.03}),
    "augfl_wo_pm": (None, {"algorithm": "augfl", "augfl.lam": 0.0}),
}


def methods_known() -> tuple[str, ...]:
  """What ``--methods`` accepts: the variants and every registered
  algorithm."""
  return tuple(VARIANTS) + tuple(algorithms.REGISTRY)


def method_cell(method: str) -> dict[str, Any]:
  """The dotted fields a method's runs set."""
  return VARIANTS[method][1] if method in VARIANTS else {"algorithm": method}


def method_label(method: str, config: training.RunConfig) -> str:
  """A method's name in the table (its resolved ``config``)."""
  label = VARIANTS.get(method, (None,))[0]
  return label or algorithms.spec(config.algorithm).label_of(
      training.config.algorithm_config(config))


# The paper's Table II (mean ± std of 5 runs, M = 20; SPEC §6).
PAPER_TABLE2 = {
    "cifar10": {"fedavg": "54.41±0.64", "per_fedavg": "60.96±7.19",
                "fedproto": "59.67±4.81", "fedcp": "68.67±3.34",
                "fedlp": "56.36±1.56", "fedpcl": "59.71±0.41",
                "augfl_wo_pm": "74.49±2.16", "augfl": "76.53±2.0"},
    "cifar100": {"fedavg": "46.18±2.92", "per_fedavg": "48.25±8.27",
                 "fedproto": "49.54±7.15", "fedcp": "53.07±5.31",
                 "fedlp": "48.46±1.90", "fedpcl": "58.95±1.70",
                 "augfl_wo_pm": "57.35±1.76", "augfl": "61.06±3.30"},
    "emnist/letters": {"fedavg": "54.34±1.62", "per_fedavg": "69.74±1.58",
                       "fedproto": "72.13±1.57", "fedcp": "73.68±3.19",
                       "fedlp": "79.45±0.24", "fedpcl": "84.67±1.55",
                       "augfl_wo_pm": "79.89±1.69", "augfl": "89.44±0.42"},
    "fashion_mnist": {"fedavg": "73.95±3.68", "per_fedavg": "90.23±3.23",
                      "fedproto": "88.32±1.73", "fedcp": "90.24±1.10",
                      "fedlp": "91.23±0.96", "fedpcl": "91.07±0.76",
                      "augfl_wo_pm": "94.04±1.16", "augfl": "97.30±0.70"},
}
# What every run of a table shares, as the table states it.
SHARED_FIELDS = ("dataset", "model", "norm", "data.num_clients", "data.M",
                 "data.classes_per_client", "data.server_size",
                 "data.support_fraction", "data.partition",
                 "data.server_overlap", "rounds", "eval.steps",
                 "pm.model", "pm.epochs", "pm.statistics")

FLAGS = flags.FLAGS


def define_flags() -> None:
  """This command's flags and the run flags; defined only when it runs, so
  that importing the module defines none."""
  sweep.define_command_flags("runs/table2")
  flags.DEFINE_list("datasets", ["digits"], "datasets (rows of the table)")
  flags.DEFINE_string("results_dir", None, "the tables go to "
                      "<results_dir>/<dataset>/table2.{md,csv,json} "
                      "(default <output_dir>/tables, beside the runs; "
                      "--results_dir=results writes the repository's "
                      "committed tables)")
  flags.DEFINE_bool("replace_results", False, "replace a table of another "
                    "configuration in --results_dir (refused otherwise)")
  flags.DEFINE_bool("finished_only", False, "run nothing: tabulate the "
                    "runs already finished under --output_dir, naming the "
                    "(method, seed) cells without one")
  flags.DEFINE_list("methods", list(COLUMNS), "methods (columns): " +
                    ", ".join(methods_known()))
  sweep.define_seeds_flag()


def _method_fields(config: training.RunConfig) -> str:
  """The method's own section (its hyper-parameters), and its evaluation
  step."""
  section = training.config.section_name(config)
  own = ", ".join(f"{name.partition('.')[2]}={value}" for name, _, _, value
                  in fields.walk(config) if name.startswith(section + "."))
  return f"{section}: {own}; eval.alpha={config.eval.alpha}"


def _pct(interval: intervals.Interval | None) -> str:
  return "–" if interval is None else interval.format()


def default_results_dir(out: str) -> str:
  """Where the tables go without ``--results_dir``: beside the runs in
  ``out``, never into the repository's committed ``results/``."""
  return os.path.join(out, "tables")


def _csv_row(method: str, seed: str, rounds: int | str,
             accuracy: intervals.Interval | None,
             diff: intervals.Interval | None,
             heldout: intervals.Interval | None, best: str, seconds: str,
             scored_on: str, interval: str) -> dict[str, str]:
  a, d, h = map(scores.percent, (accuracy, diff, heldout))
  return {"method": method, "seed": seed, "rounds": rounds,
          "scored_on": scored_on, "interval": interval,
          "accuracy": a[0], "accuracy_ci_low": a[1],
          "accuracy_ci_high": a[2], "minus_augfl": d[0],
          "minus_augfl_ci_low": d[1], "minus_augfl_ci_high": d[2],
          "heldout_accuracy": h[0], "heldout_ci_low": h[1],
          "heldout_ci_high": h[2], "best_heldout_accuracy": best,
          "seconds": seconds}


def write_table(runs: list[scores.RunScore], dataset: str,
                methods: list[str], configs: dict[str, training.RunConfig],
                out: str, scored_on: str,
                requested_seeds: list[int] | None = None) -> str:
  """``out/table2.csv`` and ``out/table2.md`` (module docstring) for one
  dataset; returns the markdown.

  Args:
    runs: the finished runs' scores.
    dataset: the dataset's name.
    methods: the columns, in order.
    configs: each method's resolved configuration.
    out: the directory.
    scored_on: one line saying what the test-split clients are, or why
      the runs have none.
    requested_seeds: the seeds asked for; a (method, seed) among them
      without a run is named under the table.
  """
  os.makedirs(out, exist_ok=True)
  test_split = scores.uses_test_split(runs)
  where = "test_split" if test_split else "heldout"
  reference = "augfl" if any(r.method == "augfl" for r in runs) else None
  first = next(iter(configs.values()))
  paper = PAPER_TABLE2.get(dataset, {})
  seeds = sorted({r.seed for r in runs})
  heldout_n = sorted({len(r.heldout.count) for r in runs})
  headline = ("test-split clients" if test_split else
              "the protocol's held-out clients")
  lines = [f"# Table II on {dataset}", "",
           "Configuration shared by every run: " + ", ".join(
               f"{name}={fields.get(first, name)}"
               for name in SHARED_FIELDS) + ".", "",
           "Each method's own hyper-parameters:", ""]
  lines += [f"* {method_label(m, configs[m])}: {_method_fields(configs[m])}"
            for m in methods]
  lines += ["", f"Scored on: {scored_on}. Beside them, the protocol's own "
            f"held-out clients ({'/'.join(map(str, heldout_n))} a run).", "",
            f"Accuracy (%) after the last round on {headline}. `a [l, h]` "
            "is an estimate a with its 95% confidence interval. Across "
            f"seeds ({', '.join(map(str, seeds))}): the mean of the seeds' "
            "accuracies, Student's t with n - 1 degrees of freedom. Across "
            "clients (one run): the sample-weighted accuracy over its "
            "clients, a linearised ratio estimator with a t quantile "
            "(augfl_jax.intervals). \"minus AugFL w/ PM\" is paired: the "
            "same seed, the same clients. The paper's ± is the std across "
            "its 5 runs, not an interval.", ""]
  lines += ["| method | accuracy, 95% CI across seeds | minus AugFL w/ PM, "
            "95% CI across seeds | held-out clients, 95% CI across seeds "
            "| seeds | paper (Table II) |", "|---|---|---|---|---|---|"]
  rows = []
  for m in methods:
    acc = scores.across_seeds(runs, m, test_split)
    held = scores.across_seeds(runs, m, False)
    diff = (scores.paired(runs, m, reference, test_split)[1]
            if reference and m != reference else None)
    n = sum(r.method == m for r in runs)
    lines.append(f"| {method_label(m, configs[m])} | {_pct(acc)} | "
                 f"{_pct(diff)} | "
                 f"{_pct(held)} | {n} | {paper.get(m, '–')} |")
    rows.append(_csv_row(m, "all", first.rounds, acc, diff, held, "", "",
                         where, "seeds"))
  missing = {m: [str(seed) for seed in requested_seeds or ()
                 if not any(r.method == m and r.seed == seed for r in runs)]
             for m in methods}
  lacking = [f"{method_label(m, configs[m])} seed{'s' * (len(ss) > 1)} "
             f"{', '.join(ss)}"
             for m, ss in missing.items() if ss]
  if lacking:
    lines += ["", f"Not in the table (no finished run): {'; '.join(lacking)}."]
  few = scores.few_seeds_note({method_label(m, configs[m]): sum(
      r.method == m for r in runs) for m in methods if any(
          r.method == m for r in runs)})
  if few:
    lines += ["", few]
  if reference and "augfl_wo_pm" in methods:
    per_seed, effect = scores.paired(runs, "augfl", "augfl_wo_pm",
                                     test_split)
    if per_seed:
      lines += ["", "The PM's effect (AugFL w/ PM minus AugFL w/o PM, "
                f"paired): {_pct(effect)} across seeds; per seed, across "
                "clients: " + "; ".join(f"seed {seed}: {_pct(d)}"
                                        for seed, d in per_seed.items())
                + "."]
      rows.append(_csv_row("pm_effect", "all", first.rounds, effect, None,
                           None, "", "", where, "seeds"))
      rows += [_csv_row("pm_effect", str(seed), first.rounds, d, None, None,
                        "", "", where, "clients")
               for seed, d in per_seed.items()]
  lines += ["", "Every run (95% CI across its clients):", "",
            "| method | seed | accuracy | minus AugFL w/ PM | held-out "
            "clients | best held-out | rounds | seconds |",
            "|---|---|---|---|---|---|---|---|"]
  for r in runs:
    diff = (scores.minus_reference(runs, r, reference, test_split)
            if reference else None)
    acc, held = r.headline(test_split).interval, r.heldout.interval
    lines.append(f"| {method_label(r.method, configs[r.method])} | "
                 f"{r.seed} | {_pct(acc)} | "
                 f"{_pct(diff)} | {_pct(held)} | {100 * r.best_heldout:.2f}"
                 f" | {r.rounds} | {r.seconds:.0f} |")
    rows.append(_csv_row(r.method, str(r.seed), r.rounds, acc, diff, held,
                         f"{100 * r.best_heldout:.2f}", f"{r.seconds:.0f}",
                         where, "clients"))
  lines += phase_lines(run_phases(runs), methods,
                       {m: method_label(m, configs[m]) for m in methods})
  outputs.write_text_atomic(os.path.join(out, "table2.csv"),
                            sweep.csv_text(rows))
  text = "\n".join(lines) + "\n"
  outputs.write_text_atomic(os.path.join(out, "table2.md"), text)
  return text


# What table2.md calls a run's phases (``training.phases``), where it
# differs from their name.
PHASE_TITLES = {"first_round": "first round", "first_heldout_eval":
                "first held-out eval", "heldout_eval": "held-out evals",
                "first_test_split_eval": "first test-split scoring",
                "test_split_eval": "test-split scorings", "pm": "PM"}


def run_phases(runs: list[scores.RunScore]) -> list[dict[str, Any]]:
  """Each run's ``method``, ``seed`` and ``phase_seconds`` (where its wall
  time went: its ``summary.json``'s, ``training.phases``; ``None`` for a
  run of a version that did not record them), as ``table2.json``'s
  ``runs`` holds them."""
  return [{"method": r.method, "seed": r.seed,
           "phase_seconds": r.phase_seconds} for r in runs]


def _seconds_and_share(seconds: float, total: float) -> str:
  share = f"{100 * seconds / total:.1f}%" if total > 0 else "–"
  return f"{seconds:.1f} ({share})"


def phase_lines(records: list[dict[str, Any]], methods: list[str],
                labels: dict[str, str]) -> list[str]:
  """table2.md's lines of where the runs' wall time went: ``records``
  (:func:`run_phases`) summed by phase per method (in ``methods``' order,
  named by ``labels``) and over the table, each in seconds and % of its
  row's total (a total: % of the table's); the runs that record no phases
  are named and left out."""
  timed = [r for r in records if r["phase_seconds"]]
  lacking = [f"{labels[r['method']]} seed {r['seed']}" for r in records
             if not r["phase_seconds"]]
  lines = ["", "Where the runs' wall time went (each run's `phase_seconds` "
           "in its summary.json, augfl_jax.training.phases), in seconds "
           "summed over a method's runs and over the table, with % of the "
           "row's total (the total's %: of the table's). A run's wall time "
           "counts from its start to its summary, its data, PM and "
           "compilation included (the seconds above count its rounds from "
           "the first); \"first round\" and each \"first\" evaluation are "
           "a session's first call, compiling included; setup is the rest "
           "(data, partition, model, files)."]
  if not timed:
    return lines[:1] + ["No run records where its time went (runs of a "
                        "version without `phase_seconds`)."]
  names = phases.ordered({n for r in timed for n in r["phase_seconds"]})
  lines += ["", "| method | runs | total | " + " | ".join(
      PHASE_TITLES.get(n, n) for n in names) + " |",
            "|---|---|---|" + "---|" * len(names)]
  grand = sum(sum(r["phase_seconds"].values()) for r in timed)
  rows = [(labels[m], [r for r in timed if r["method"] == m])
          for m in methods] + [("all methods", timed)]
  for label, mine in rows:
    if not mine:
      continue
    summed = {n: sum(r["phase_seconds"].get(n, 0.0) for r in mine)
              for n in names}
    total = sum(summed.values())
    lines.append(f"| {label} | {len(mine)} | "
                 f"{_seconds_and_share(total, grand)} | " + " | ".join(
                     _seconds_and_share(summed[n], total) for n in names)
                 + " |")
  if lacking:
    lines += ["", "Not in these sums (no phases recorded: a run of an "
              f"older version): {'; '.join(lacking)}."]
  return lines


def check_results(directory: str, key: dict[str, Any], replace: bool
                 ) -> None:
  """Refuses to overwrite a table of another configuration in
  ``directory``: the new table must hold every (method, seed) of the old
  one (``table2.json``), with the same configuration, unless ``replace``
  (``sweep.check_table``).

  Raises:
    ValueError: one line saying what differs and what to do.
  """
  sweep.check_table(
      directory, key, replace, ("table2.md", "table2.csv"), "table2.json",
      "method", "pass --results_dir=DIR to write the new table elsewhere, "
      "or --replace_results to replace it")


def run_table(base: training.RunConfig, datasets: list[str],
              methods: list[str], seeds: list[int], out: str,
              checkpoint_every: int = training.CHECKPOINT_EVERY,
              results_dir: str | None = None, replace_results: bool = False,
              log=print, finished_only: bool = False) -> str:
  """Runs (or reuses) every (dataset, method, seed) cell under
  ``out/<dataset>/<method>/seed<seed>`` and writes each dataset's tables to
  ``results_dir/<dataset>/`` (``table2.md``, ``table2.csv`` and
  ``table2.json``, the configuration they are of and the runs' phases).

  Args:
    base: the configuration every cell starts from (its ``dataset`` is
      replaced by each of ``datasets``).
    datasets: the rows.
    methods: the columns (:func:`methods_known`).
    seeds: the seeds of every cell.
    out: the runs' directory.
    checkpoint_every: as ``training.run``'s.
    results_dir: the tables' root (default
      :func:`default_results_dir`, ``out/tables``).
    replace_results: replace a table of another configuration
      (:func:`check_results`) instead of refusing.
    log: receives the progress lines (``sweep.run_cells``).
    finished_only: run nothing; tabulate the cells already finished under
      ``out`` (the table names the cells it lacks).

  Returns:
    The markdown of every dataset's ``table2.md``.

  The table holds its output and results directories for its whole life
  (another table2 or sweep writing there stops at once; with
  ``finished_only``, the results directories alone), and writes each file
  atomically, ``table2.json`` first. Each run is scored from its newest
  checkpoint's sealed records, its files checked against them
  (``scores.load_run_score``).

  Raises:
    ValueError: no method, dataset or seed, an unknown or repeated one, a bad
      configuration, a run directory holding a run of another
      configuration, a table of another configuration in ``results_dir``,
      or a directory another command is writing (all before any run).
  """
  results_dir = results_dir or default_results_dir(out)
  for values, flag in ((methods, "methods"), (datasets, "datasets"),
                       (seeds, "seeds")):
    sweep.distinct(list(values), f"--{flag}")
  unknown = [m for m in methods if m not in methods_known()]
  if unknown:
    raise ValueError(f"unknown --methods {', '.join(unknown)}; choose from "
                     f"{', '.join(methods_known())}")
  cells = [method_cell(m) for m in methods]
  runs = {dataset: sweep.plan_runs(fields.replace(base, dataset=dataset),
                                   cells, seeds, names=methods)
          for dataset in datasets}  # every run's plan, before any run
  configs = {dataset: {m: training.resolve(fields.replace(
      base, dataset=dataset, **cell)) for m, cell in zip(methods, cells)}
             for dataset in datasets}  # what each table is of
  with contextlib.ExitStack() as held:
    # --finished_only reads the runs: their directory's lock is not taken
    # (a copy one may not write is tabulated too).
    for directory in ([] if finished_only else [out]) + [
        _results_dir(results_dir, configs[dataset]) for dataset in datasets]:
      held.enter_context(sweep.exclusive(directory))
    return _run_table(datasets, methods, seeds, out, runs, configs,
                      checkpoint_every, results_dir, replace_results, log,
                      finished_only)


def _run_table(datasets, methods, seeds, out, runs, configs,
               checkpoint_every, results_dir, replace_results, log,
               finished_only) -> str:
  """:func:`run_table`'s body, while it holds its directories."""
  keys = {}
  for dataset in datasets:
    if "augfl" in methods and training.pm_role(
        configs[dataset]["augfl"]) == "none":
      raise ValueError("AugFL w/ PM needs --augfl.lam > 0, got "
                       f"{configs[dataset]['augfl'].augfl.lam} (AugFL w/o PM "
                       "is augfl_wo_pm)")
    keys[dataset] = sweep.table_key(configs[dataset], seeds)
    check_results(_results_dir(results_dir, configs[dataset]),
                  keys[dataset], replace_results)
  texts = []
  for dataset in datasets:
    directory = _results_dir(results_dir, configs[dataset])
    rows = sweep.run_cells(
        runs[dataset], os.path.join(out, os.path.basename(directory)),
        checkpoint_every=checkpoint_every, log=log,
        finished_only=finished_only)
    if not rows:
      raise ValueError(f"no finished run of {', '.join(methods)} under "
                       f"{os.path.join(out, os.path.basename(directory))}")
    runs = [scores.load_run_score(row["run_dir"], row["cell"], row["seed"],
                                  log)
            for row in rows]
    lacking = [r.run_dir for r in runs if r.test_split is None]
    if lacking and len(lacking) < len(runs):
      raise ValueError(
          f"{lacking[0]}" + (f" and {len(lacking) - 1} more runs" if
                             len(lacking) > 1 else "")
          + " scored no test-split clients where the table's other runs "
          "did: one table scores every run on the same clients; rerun it")
    # What the table is of first: a table stopped between its files is
    # then one its rerun writes again, never one it refuses.
    outputs.write_text_atomic(os.path.join(directory, "table2.json"),
                              json.dumps({**keys[dataset],
                                          "runs": run_phases(runs)},
                                         indent=1, sort_keys=True))
    texts.append(write_table(runs, configs[dataset][methods[0]].dataset,
                             methods, configs[dataset], directory,
                             _scored_on(rows), seeds))
  return "\n".join(texts)


def _results_dir(results_dir: str, configs: dict[str, training.RunConfig]
                ) -> str:
  return os.path.join(results_dir, next(iter(
      configs.values())).dataset.replace("/", "_"))


def _scored_on(rows: list[dict[str, Any]]) -> str:
  """What the runs' ``summary.json`` say of their test-split clients (per
  seed where the seeds' differ)."""
  by_seed = {}
  for row in rows:
    with open(os.path.join(row["run_dir"], "summary.json")) as f:
      test_split = json.load(f).get("test_split") or {}
    by_seed.setdefault(row["seed"], test_split.get("source") or (
        "the protocol's held-out clients only (test-split scoring off: "
        f"{test_split.get('off', 'not recorded')})"))
  if len(set(by_seed.values())) == 1:
    return (next(iter(by_seed.values())) +
            ", the same for every method of a seed")
  return "; ".join(f"seed {seed}: {source}" for seed, source in
                   by_seed.items()) + " (the same for every method of a seed)"


def main(argv):
  del argv  # flags only (cli.parse_flags)
  cli.start_command()
  out = FLAGS.output_dir or "runs/table2"
  results_dir = FLAGS.results_dir or default_results_dir(out)

  def body():
    sweep.check_run_control()
    return run_table(cli.config_from_flags(), FLAGS.datasets,
                     FLAGS.methods, sweep.parse_list(FLAGS.seeds, int,
                                                     "seeds"), out,
                     checkpoint_every=FLAGS.checkpoint_every,
                     results_dir=results_dir,
                     replace_results=FLAGS.replace_results,
                     finished_only=FLAGS.finished_only)

  print(sweep.run_comparison(body))
  print(f"runs in {out}; tables in {results_dir}/<dataset>/")


if __name__ == "__main__":
  define_flags()
  cli.main_runner(main)
