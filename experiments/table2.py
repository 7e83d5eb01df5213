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
``experiments.run`` flag applies to every cell. Cells already done are reused
and an interrupted one continues (``sweep.finished_run``), so an interrupted
table resumes; a directory holding cells of another configuration is
refused.
The runs go to ``--output_dir`` (default ``runs/table2``), each with its
resolved ``config.json``. The tables go to ``--results_dir`` (default
``results``), per dataset: ``<results_dir>/<dataset>/table2.csv``, one row
per run (``method``, ``seed``, ``final_accuracy`` and ``best_accuracy`` in %,
``seconds``), and ``table2.md``: the configuration the runs share and each
method's own hyper-parameters, then per method the mean ± std ACROSS SEEDS
of the final test-client accuracy next to the paper's Table II (whose ± is
across its 5 runs), then every run.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from absl import flags
import numpy as np

from augfl_jax import fields, training
from experiments import flags as run_flags
from experiments import sweep

# Table II's columns, then the two other methods of this library.
METHODS = {
    "fedavg": ("FedAvg", {"algorithm": "fedavg"}),
    "per_fedavg": ("Per-FedAvg", {"algorithm": "per_fedavg"}),
    "fedproto": ("FedProto", {"algorithm": "fedproto"}),
    "fedcp": ("FedCP", {"algorithm": "fedcp"}),
    "fedlp": ("FedLP", {"algorithm": "fedlp"}),
    "fedpcl": ("FedPCL", {"algorithm": "fedpcl"}),
    "augfl_wo_pm": ("AugFL w/o PM", {"algorithm": "augfl",
                                     "augfl.lam": 0.0}),
    "augfl": ("AugFL w/ PM", {"algorithm": "augfl", "augfl.lam": 5.0}),
    "fedbc": ("FedBC", {"algorithm": "fedbc"}),
    "fedoa": ("FedOA", {"algorithm": "fedoa"}),
}

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
                 "data.support_fraction", "rounds", "eval.steps",
                 "pm.model", "pm.epochs", "pm.statistics")

FLAGS = flags.FLAGS


def define_flags() -> None:
  """This command's flags and the run flags; defined only when it runs, so
  that importing the module defines none."""
  sweep.define_command_flags("runs/table2")
  flags.DEFINE_list("datasets", ["digits"], "datasets (rows of the table)")
  flags.DEFINE_string("results_dir", "results", "the tables go to "
                      "<results_dir>/<dataset>/table2.{md,csv}")
  flags.DEFINE_list("methods", list(METHODS), "methods (columns): " +
                    ", ".join(METHODS))
  sweep.define_seeds_flag()


def _method_fields(config: training.RunConfig) -> str:
  """The method's own section (its hyper-parameters), and its evaluation
  step."""
  section = training.config.SECTIONS[config.algorithm]
  own = ", ".join(f"{name.partition('.')[2]}={value}" for name, _, _, value
                  in fields.walk(config) if name.startswith(section + "."))
  return f"{section}: {own}; eval.alpha={config.eval.alpha}"


def write_table(rows: list[dict[str, Any]], dataset: str,
                methods: list[str], configs: dict[str, training.RunConfig],
                out: str) -> str:
  """``out/table2.csv`` (one row per run) and ``out/table2.md`` (module
  docstring) for one dataset; returns the markdown."""
  os.makedirs(out, exist_ok=True)
  names = ["method", "seed", "final_accuracy", "best_accuracy", "seconds"]
  with open(os.path.join(out, "table2.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=names)
    writer.writeheader()
    for r in rows:
      writer.writerow({"method": r["method"], "seed": r["seed"],
                       "final_accuracy": f"{100 * r['final_accuracy']:.2f}",
                       "best_accuracy": f"{100 * r['best_accuracy']:.2f}",
                       "seconds": f"{r['seconds']:.1f}"})
  first = next(iter(configs.values()))
  paper = PAPER_TABLE2.get(dataset, {})
  seeds = sorted({r["seed"] for r in rows})
  lines = [f"# Table II on {dataset}", "",
           "Configuration shared by every run: " + ", ".join(
               f"{name}={fields.get(first, name)}"
               for name in SHARED_FIELDS) + ".", "",
           "Each method's own hyper-parameters:", ""]
  lines += [f"* {METHODS[m][0]}: {_method_fields(configs[m])}"
            for m in methods]
  lines += ["", f"Final test-client accuracy (%), mean ± std across seeds "
            f"{', '.join(map(str, seeds))}; the paper's ± is across its 5 "
            "runs.", "", "| method | accuracy | seeds | paper (Table II) |",
            "|---|---|---|---|"]
  for m in methods:
    acc = [100 * r["final_accuracy"] for r in rows if r["method"] == m]
    cell = f"{np.mean(acc):.2f} ± {np.std(acc):.2f}" if acc else "–"
    lines.append(f"| {METHODS[m][0]} | {cell} | {len(acc)} | "
                 f"{paper.get(m, '–')} |")
  lines += ["", "Every run:", "",
            "| method | seed | final accuracy | best accuracy | seconds |",
            "|---|---|---|---|---|"]
  lines += [f"| {METHODS[r['method']][0]} | {r['seed']} | "
            f"{100 * r['final_accuracy']:.2f} | "
            f"{100 * r['best_accuracy']:.2f} | {r['seconds']:.0f} |"
            for r in rows]
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out, "table2.md"), "w") as f:
    f.write(text)
  return text


def run_table(base: training.RunConfig, datasets: list[str],
              methods: list[str], seeds: list[int], out: str,
              checkpoint_every: int = training.CHECKPOINT_EVERY,
              results_dir: str = "results") -> str:
  """Runs (or reuses) every (dataset, method, seed) cell under
  ``out/<dataset>/<method>/seed<seed>`` and writes each dataset's tables to
  ``results_dir/<dataset>/``.

  Args:
    base: the configuration every cell starts from (its ``dataset`` is
      replaced by each of ``datasets``).
    datasets: the rows.
    methods: the columns, keys of ``METHODS``.
    seeds: the seeds of every cell.
    out: the runs' directory.
    checkpoint_every: as ``training.run``'s.
    results_dir: the tables' root.

  Returns:
    The markdown of every dataset's ``table2.md``.

  Raises:
    ValueError: an unknown method, a bad configuration, or a run directory
      holding a run of another configuration.
  """
  unknown = [m for m in methods if m not in METHODS]
  if unknown:
    raise ValueError(f"unknown --methods {', '.join(unknown)}; choose from "
                     f"{', '.join(METHODS)}")
  cells = [METHODS[m][1] for m in methods]
  configs = {}  # every cell's flags, before any run
  for dataset in datasets:
    configs[dataset] = {m: training.validate(fields.replace(
        base, dataset=dataset, **cell)) for m, cell in zip(methods, cells)}
  texts = []
  for dataset in datasets:
    name = configs[dataset][methods[0]].dataset.replace("/", "_")
    rows = [{**row, "method": row["cell"]} for row in sweep.run_cells(
        fields.replace(base, dataset=dataset), cells, seeds,
        os.path.join(out, name), names=methods,
        checkpoint_every=checkpoint_every)]
    texts.append(write_table(rows, configs[dataset][methods[0]].dataset,
                             methods, configs[dataset],
                             os.path.join(results_dir, name)))
  return "\n".join(texts)


def main(argv):
  del argv  # flags only (run_flags.parse_flags)
  run_flags.start_command()
  out = FLAGS.output_dir or "runs/table2"

  def body():
    sweep.check_run_control()
    return run_table(run_flags.config_from_flags(), FLAGS.datasets,
                     FLAGS.methods, sweep.parse_list(FLAGS.seeds, int,
                                                     "seeds"), out,
                     checkpoint_every=FLAGS.checkpoint_every,
                     results_dir=FLAGS.results_dir)

  print(sweep.run_comparison(body))
  print(f"runs in {out}; tables in {FLAGS.results_dir}/<dataset>/")


if __name__ == "__main__":
  define_flags()
  run_flags.main_runner(main)
