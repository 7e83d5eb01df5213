r"""Learning curves of runs, like the paper's Fig. 2.

  python -m experiments.plot RUN_DIR [RUN_DIR ...] --output curves.png

Each RUN_DIR is one run's output directory (with ``metrics.jsonl`` and
``config.json``) or a directory holding several of them (e.g. a sweep cell
with one sub-directory per seed). Runs with the same label (``--label_by``
fields of their config, default the algorithm) are drawn as one curve: the
mean over seeds with a band of ± one standard deviation. Two panels:
test-client accuracy and training loss against the round.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from typing import Iterable, Sequence

from absl import app
from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

FLAGS = flags.FLAGS


def find_runs(paths: Iterable[str]) -> list[str]:
  """Every directory under ``paths`` that holds a ``metrics.jsonl``."""
  runs = []
  for path in paths:
    for root, _, files in sorted(os.walk(path)):
      if "metrics.jsonl" in files:
        runs.append(root)
  return runs


def load_run(run_dir: str) -> tuple[dict, list[dict]]:
  """``(config, records)`` of one run."""
  with open(os.path.join(run_dir, "config.json")) as f:
    config = json.load(f)
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return config, records


def config_value(config: dict, name: str):
  """The value of field ``name`` (a dotted path such as ``augfl.lam``) in a
  run's nested ``config.json``; ``None`` when it has none."""
  for part in name.split("."):
    if not isinstance(config, dict):
      return None
    config = config.get(part)
  return config


def group_curves(run_dirs: Sequence[str], label_by: Sequence[str]):
  """``{label: (rounds, accuracy [seeds, T], train_loss [seeds, T])}``.

  ``label_by``: config fields by their dotted names. Runs of one label are
  cut to the rounds they all have.
  """
  grouped = collections.defaultdict(list)
  for run_dir in run_dirs:
    config, records = load_run(run_dir)
    if not records:
      continue
    label = ", ".join(f"{config_value(config, k)}" if len(label_by) == 1 else
                      f"{k}={config_value(config, k)}" for k in label_by)
    grouped[label].append(records)
  curves = {}
  for label, runs in grouped.items():
    length = min(len(r) for r in runs)
    rounds = [rec["round"] for rec in runs[0][:length]]
    acc = np.array([[rec["accuracy"] for rec in r[:length]] for r in runs])
    loss = np.array([[rec["train_loss"] for rec in r[:length]] for r in runs])
    curves[label] = (rounds, acc, loss)
  return curves


def plot_curves(curves, output: str, title: str = "") -> None:
  """Writes the two-panel figure of ``group_curves``' output to ``output``."""
  fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
  for label, (rounds, acc, loss) in curves.items():
    for ax, values, scale in ((ax_acc, acc, 100.0), (ax_loss, loss, 1.0)):
      mean, std = scale * values.mean(0), scale * values.std(0)
      (line,) = ax.plot(rounds, mean, label=f"{label} (n={len(values)})")
      ax.fill_between(rounds, mean - std, mean + std, alpha=0.2,
                      color=line.get_color())
  ax_acc.set(xlabel="round", ylabel="test-client accuracy (%)")
  ax_loss.set(xlabel="round", ylabel="training loss", yscale="log")
  ax_acc.legend(fontsize="small")
  ax_acc.grid(alpha=0.3)
  ax_loss.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  fig.savefig(output, dpi=120)
  plt.close(fig)


def main(argv):
  runs = find_runs(argv[1:])
  if not runs:
    print(f"error: no run directories (with metrics.jsonl) under "
          f"{' '.join(argv[1:]) or 'the arguments'}", file=sys.stderr)
    sys.exit(2)
  plot_curves(group_curves(runs, FLAGS.label_by), FLAGS.output, FLAGS.title)
  print(f"{len(runs)} runs -> {FLAGS.output}")


if __name__ == "__main__":
  flags.DEFINE_string("output", "curves.png", "PNG file to write")
  flags.DEFINE_list("label_by", ["algorithm"],
                    "config fields that name a curve (dotted names: "
                    "augfl.lam)")
  flags.DEFINE_string("title", "", "figure title")
  app.run(main)
