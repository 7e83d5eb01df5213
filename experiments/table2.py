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
Writes ``table2.md`` and ``table2.csv`` (mean ± std over seeds of the final
test-client accuracy) to ``--output_dir``; each run's directory keeps its
resolved ``config.json``.
"""

from __future__ import annotations

import csv
import os

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

FLAGS = flags.FLAGS


def define_flags() -> None:
  """This command's flags and the run flags; defined only when it runs, so
  that importing the module defines none."""
  sweep.define_command_flags()
  flags.DEFINE_list("datasets", ["digits"], "datasets (rows of the table)")
  flags.DEFINE_list("methods", list(METHODS), "methods (columns): " +
                    ", ".join(METHODS))
  sweep.define_seeds_flag()


def write_table(rows: list[dict], datasets: list[str], methods: list[str],
                out: str) -> str:
  """``table2.csv`` (one row per run) and ``table2.md`` (mean ± std)."""
  with open(os.path.join(out, "table2.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=["dataset", "method", "seed",
                                           "final_accuracy", "best_accuracy"])
    writer.writeheader()
    writer.writerows({k: r[k] for k in writer.fieldnames} for r in rows)
  header = [METHODS[m][0] for m in methods]
  lines = ["| Dataset | " + " | ".join(header) + " |",
           "|---" * (len(header) + 1) + "|"]
  for dataset in datasets:
    cells = []
    for method in methods:
      acc = [100 * r["final_accuracy"] for r in rows
             if r["dataset"] == dataset and r["method"] == method]
      cells.append(f"{np.mean(acc):.2f}±{np.std(acc):.2f}" if acc else "–")
    lines.append(f"| {dataset} | " + " | ".join(cells) + " |")
  seeds = sorted({r["seed"] for r in rows})
  text = ("Test-client accuracy (%), mean ± std over seeds "
          f"{', '.join(map(str, seeds))}\n\n" + "\n".join(lines) + "\n")
  with open(os.path.join(out, "table2.md"), "w") as f:
    f.write(text)
  return text


def run_table(base: training.RunConfig, datasets: list[str],
              methods: list[str], seeds: list[int], out: str,
              checkpoint_every: int = training.CHECKPOINT_EVERY) -> str:
  """Runs (or reuses) every (dataset, method, seed) cell under
  ``out/<dataset>/<method>/seed<seed>`` and writes the table to ``out``.

  Args:
    base: the configuration every cell starts from (its ``dataset`` is
      replaced by each of ``datasets``).
    datasets: the rows.
    methods: the columns, keys of ``METHODS``.
    seeds: the seeds of every cell.
    out: the output directory.
    checkpoint_every: as ``training.run``'s.

  Returns:
    The markdown table (also in ``out/table2.md``).

  Raises:
    ValueError: an unknown method, a bad configuration, or a run directory
      holding a run of another configuration.
  """
  unknown = [m for m in methods if m not in METHODS]
  if unknown:
    raise ValueError(f"unknown --methods {', '.join(unknown)}; choose from "
                     f"{', '.join(METHODS)}")
  cells = [METHODS[m][1] for m in methods]
  for dataset in datasets:  # every cell's flags, before any run
    for cell in cells:
      training.validate(fields.replace(base, dataset=dataset, **cell))
  rows = []
  for dataset in datasets:
    config = fields.replace(base, dataset=dataset)
    for row in sweep.run_cells(config, cells, seeds,
                               os.path.join(out, dataset.replace("/", "_")),
                               names=methods,
                               checkpoint_every=checkpoint_every):
      rows.append({**row, "dataset": dataset, "method": row["cell"]})
  return write_table(rows, datasets, methods, out)


def main(argv):
  del argv  # flags only (run_flags.parse_flags)
  run_flags.start_command()
  out = FLAGS.output_dir or "runs/table2"

  def body():
    sweep.check_run_control()
    return run_table(run_flags.config_from_flags(), FLAGS.datasets,
                     FLAGS.methods, sweep.parse_list(FLAGS.seeds, int,
                                                     "seeds"), out,
                     checkpoint_every=FLAGS.checkpoint_every)

  print(sweep.run_comparison(body))
  print(f"table and runs in {out}")


if __name__ == "__main__":
  define_flags()
  run_flags.main_runner(main)
