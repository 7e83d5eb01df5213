r"""The paper's ablations of knowledge transfer, as commands.

  python -m experiments.ablations --study=kt       # Fig. 7: KT on/off/only
  python -m experiments.ablations --study=lam      # Fig. 8: lambda 0,1,5,10,20
  python -m experiments.ablations --study=lam --lams=0,5    # other lambdas
  python -m experiments.ablations --study=kt --crd.nce_k=4096 --rounds=100
  python -m experiments.ablations --study=pm_size  # Fig. 9: PM sizes
  python -m experiments.ablations --study=pm_epochs --pm_epochs=1,3,10,30

Every ``experiments.run`` flag applies to every cell (``--dataset``,
``--rounds``, ``--crd.nce_k``, ...). Each (cell, seed) run lands in
``--output_dir/<cell>/seed<seed>`` (reused when done), and the study writes
``results.csv`` and ``results.md`` as ``experiments.sweep`` writes them
(per cell the final accuracy, the mean over ``--seeds`` with its 95%
interval across seeds, and the paired difference to the first cell; per
run, intervals across its clients: ``sweep.write_tables``) and
``curves.png`` (learning curves, mean ± std over seeds); the lambda study
also ``accuracy_vs_lambda.png``. The PM-strength study (``pm_epochs``: AugFL
w/o PM, then w/ PMs pretrained for each of ``--pm_epochs``, each paired
with w/o PM on the same clients) also writes ``pm_strength.md`` and
``pm_strength.png``: each PM's held-out accuracy (its checkpoint's)
against AugFL's paired gain over w/o PM, with its interval across seeds.
"""

from __future__ import annotations

import os

from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from augfl_jax import training
from augfl_jax.core import fields
from augfl_jax.storage import checkpoint
from augfl_jax.training import outputs
from augfl_jax.core.progress import counted
from experiments import cli
from experiments import plot, scores, sweep

# PMs of three sizes per kind of dataset (Fig. 9): (pm.model, pm.kwargs).
PM_SIZES = {
    "digits": [("mlp", '{"hidden": [64]}'), ("cnn", None),
               ("cnn", '{"widths": [64, 128], "dense": 1024}')],
    "synthetic": [("mlp", '{"hidden": [32]}'), ("mlp", None),
                  ("mlp", '{"hidden": [512, 256]}')],
    "images": [("resnet8", None), ("resnet32", None), ("resnet32x4", None)],
}
STUDIES = ("kt", "lam", "pm_size", "pm_epochs")
# The PM-strength study's pretraining epochs.
PM_EPOCHS = (1, 3, 10, 30)
# The lambda study's values (Fig. 8).
LAMS = (0.0, 1.0, 5.0, 10.0, 20.0)
FLAGS = flags.FLAGS


def define_flags() -> None:
  """This command's flags and the run flags; defined only when it runs, so
  that importing the module defines none."""
  sweep.define_command_flags(
      "runs/ablation_<study>_<dataset>, a / in the dataset's name as _")
  flags.DEFINE_enum("study", "kt", STUDIES, "which ablation")
  flags.DEFINE_list("pm_epochs", [str(e) for e in PM_EPOCHS],
                    "the PM-strength study's values of --pm.epochs")
  flags.DEFINE_list("lams", [f"{lam:g}" for lam in LAMS],
                    "the lambda study's values of --augfl.lam")
  sweep.define_seeds_flag()


def study_cells(study: str, dataset: str,
                lams: tuple[float, ...] = LAMS,
                pm_epochs: tuple[int, ...] = PM_EPOCHS) -> list[sweep.Cell]:
  """The cells (dotted RunConfig field overrides) of one study."""
  if study not in STUDIES:
    raise ValueError(f"unknown study {study!r}; choose one of "
                     f"{', '.join(STUDIES)}")
  if study == "kt":
    return [{"algorithm": "augfl", "augfl.lam": 0.0},
            {"algorithm": "augfl", "augfl.lam": 5.0},
            {"algorithm": "kt_only", "augfl.lam": 5.0}]
  if study == "lam":
    return [{"algorithm": "augfl", "augfl.lam": float(lam)} for lam in lams]
  if study == "pm_epochs":  # w/o PM first: the cell the others pair with
    return [{"augfl.lam": 0.0}] + [{"pm.epochs": int(e)} for e in pm_epochs]
  sizes = PM_SIZES.get(dataset, PM_SIZES["images"])
  return [{"algorithm": "augfl", "pm.model": name,
           **({"pm.kwargs": kwargs} if kwargs else {})}
          for name, kwargs in sizes]


def plot_lambda(rows: list[dict[str, object]], output: str) -> None:
  lams = sorted({float(r["augfl.lam"]) for r in rows})
  acc = [[100 * r["final_accuracy"] for r in rows if r["augfl.lam"] == lam]
         for lam in lams]
  fig, ax = plt.subplots(figsize=(5, 3.5))
  ax.errorbar(range(len(lams)), [np.mean(a) for a in acc],
              yerr=[np.std(a) for a in acc], marker="o", capsize=4)
  ax.set_xticks(range(len(lams)), [f"{lam:g}" for lam in lams])
  ax.set(xlabel="lambda", ylabel="test-client accuracy (%)")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(output, dpi=120)
  plt.close(fig)


def pm_strength(rows: list[dict[str, object]], base: training.RunConfig,
                cells: list[sweep.Cell], out: str) -> str:
  """The PM-strength study's ``pm_strength.md`` and ``pm_strength.png`` in
  ``out``: per PM cell (``pm.epochs``), the PM's held-out accuracy (its
  checkpoint's metadata), AugFL's accuracy across seeds and its paired
  gain over the first cell (w/o PM) across seeds; returns the markdown."""
  runs = [scores.load_run_score(r["run_dir"], r["cell"], r["seed"])
          for r in rows]
  test_split = scores.uses_test_split(runs)
  names = [sweep.cell_name(c) for c in cells]
  reference, points = names[0], []
  lines = [f"PM strength on {base.dataset}: AugFL w/ a PM of each number of "
           f"pretraining epochs, paired with AugFL w/o PM ({reference}) on "
           f"the same {'test-split' if test_split else 'held-out'} clients "
           "(%; 95% intervals across seeds).", "",
           "| PM epochs | PM held-out accuracy | AugFL w/ PM | gain over "
           "w/o PM | seeds |", "|---|---|---|---|---|"]
  for cell, name in zip(cells[1:], names[1:]):
    config = training.prepare(fields.replace(base, **cell)).config
    meta = checkpoint.restore_metadata(config.pm.dir)
    pm_accuracy = 100 * float(meta["heldout_accuracy"])
    gain = scores.paired(runs, name, reference, test_split)[1]
    points.append((cell["pm.epochs"], pm_accuracy, gain))
    lines.append(f"| {cell['pm.epochs']} | {pm_accuracy:.2f} | "
                 f"{scores.across_seeds(runs, name, test_split).format()} | "
                 f"{'-' if gain is None else gain.format()} | "
                 f"{sum(r.method == name for r in runs)} |")
  lines.append(f"| w/o PM | - | "
               f"{scores.across_seeds(runs, reference, test_split).format()}"
               f" | - | {sum(r.method == reference for r in runs)} |")
  text = "\n".join(lines) + "\n"
  outputs.write_text_atomic(os.path.join(out, "pm_strength.md"), text)
  fig, ax = plt.subplots(figsize=(5, 3.5), layout="constrained")
  for epochs, accuracy, gain in points:
    if gain is not None:
      ax.errorbar(accuracy, 100 * gain.mean, capsize=4, marker="o",
                  color="tab:blue", yerr=[[100 * (gain.mean - gain.low)],
                                          [100 * (gain.high - gain.mean)]])
      ax.annotate(f"{epochs} ep.", (accuracy, 100 * gain.mean),
                  textcoords="offset points", xytext=(6, 4))
  ax.axhline(0, color="black", linewidth=0.8)
  ax.set(xlabel="PM held-out accuracy (%)",
         ylabel="AugFL w/ PM minus w/o PM (points)",
         title="error bars: 95% CI across seeds")
  ax.grid(alpha=0.3)
  plot.write_figure(fig, os.path.join(out, "pm_strength.png"))
  plt.close(fig)
  print(text)
  return text


def run_study(study: str, base: training.RunConfig, seeds: list[int],
              out: str, lams: tuple[float, ...] = LAMS,
              checkpoint_every: int = training.CHECKPOINT_EVERY,
              pm_epochs: tuple[int, ...] = PM_EPOCHS
              ) -> list[dict[str, object]]:
  """Runs (or reuses) one study's cells under ``out/<cell>/seed<seed>`` and
  writes ``results.csv``, ``results.md``, ``curves.png`` (the lambda study
  also ``accuracy_vs_lambda.png``) to ``out``; returns one row per run.

  Raises:
    ValueError: an unknown study, a bad configuration, or a run directory
      holding a run of another configuration.
  """
  cells = study_cells(study, base.dataset, lams, pm_epochs)
  runs = sweep.plan_runs(base, cells, seeds)  # every run's, before any run
  rows = sweep.run_cells(runs, out, checkpoint_every=checkpoint_every)
  sweep.write_tables(rows, out, f"ablation {study} on {base.dataset}, "
                     f"{counted(base.rounds, 'round')}")
  label_by = list(dict.fromkeys(k for cell in cells for k in cell))
  plot.plot_curves(plot.group_curves(plot.find_runs([out]), label_by),
                   os.path.join(out, "curves.png"),
                   f"ablation {study} on {base.dataset}")
  if study == "lam":
    plot_lambda(rows, os.path.join(out, "accuracy_vs_lambda.png"))
  if study == "pm_epochs":
    pm_strength(rows, base, cells, out)
  return rows


def main(argv):
  del argv  # flags only (cli.parse_flags)
  cli.start_command()

  def body():
    sweep.check_run_control()
    base = cli.config_from_flags()
    out = FLAGS.output_dir or (
        f"runs/ablation_{FLAGS.study}_{base.dataset.replace('/', '_')}")
    run_study(FLAGS.study, base, sweep.parse_list(FLAGS.seeds, int, "seeds"),
              out, tuple(sweep.parse_list(FLAGS.lams, float, "lams")),
              checkpoint_every=FLAGS.checkpoint_every,
              pm_epochs=tuple(sweep.parse_list(FLAGS.pm_epochs, int,
                                               "pm_epochs")))
    return out

  print(f"results and plots in {sweep.run_comparison(body)}")


if __name__ == "__main__":
  define_flags()
  cli.main_runner(main)
