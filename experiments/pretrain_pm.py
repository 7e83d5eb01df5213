r"""Pretrains the server's private model (PM) on the server split and saves it.

  python -m experiments.pretrain_pm                        # cnn on digits
  python -m experiments.pretrain_pm --pm.model=mlp --pm.kwargs='{"hidden": [512, 256]}'
  python -m experiments.pretrain_pm --dataset=fashion_mnist # resnet32x4

The PM is the one ``experiments.run`` would use: the flags that decide it are
the run's own, with the same names and defaults (``--dataset``, ``--norm``,
``--conv_impl``, ``--data.data_dir``, ``--data.download``,
``--data.server_size``,
``--pm.model``, ``--pm.kwargs``, ``--pm.epochs``, ``--pm.dir``), and they
are resolved as a run resolves them (``augfl_jax.training.defaults``): the
same model, norm, recipe (``--pm.epochs``, ``--pm.lr``, ``--pm.batch_size``,
``--pm.holdout_fraction``), server split and default directory
``runs/pm/<dataset>_<model>[-<kwargs>][-<norm>]_e<epochs>_srv<n>``. A run
reuses the PM only if it was trained with that recipe.

The server split is the first ``--data.server_size`` examples of the dataset
(the clients never see them); the last 10% of it are held out for the
reported accuracy. The checkpoint replaces any PM in ``--pm.dir``.

Pretraining saves its state at the end of every epoch (or every
``--pm.checkpoint_every_steps`` steps) and when Ctrl-C or SIGTERM stops it,
in ``<pm.dir>.pretraining``; after a stop, a crash or ``kill -9``, the same
command continues from there to the PM an uninterrupted pretraining gives.
"""

from __future__ import annotations

import os
import signal
import sys

from absl import flags
from absl import logging

from augfl_jax import data, models, training
from augfl_jax.commands import runner
from augfl_jax.pm import pretrain, store
from augfl_jax.core.progress import counted
from augfl_jax.training import defaults, pm_roles
from experiments import cli

# The RunConfig fields that decide the PM (experiments.run's flags).
PM_FIELDS = ("dataset", "norm", "conv_impl", "data.data_dir",
             "data.download", "data.download_as",
             "data.server_size", "pm.model", "pm.kwargs", "pm.epochs",
             "pm.lr", "pm.batch_size", "pm.holdout_fraction", "pm.dir",
             "pm.checkpoint_every_steps")

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The run's flags of ``PM_FIELDS``; defined only when the command
  runs."""
  cli.define_config_flags(only=PM_FIELDS)


def resolve_pm(config: training.RunConfig) -> training.RunConfig:
  """``config`` resolved as a run resolves it, after the checks a PM needs
  (one-line ``ValueError``)."""
  if data.spec(config.dataset).natural_clients:
    raise ValueError(f"{config.dataset} has natural clients and no server "
                     "split to pretrain on; choose an image dataset such as "
                     "digits")
  run = defaults.resolve(config)
  checks = [
      (run.pm.model in models.available_models(),
       f"unknown --pm.model {run.pm.model!r}; choose one of "
       f"{', '.join(models.available_models())}"),
      (run.conv_impl in models.CONV_IMPLS,
       f"unknown --conv_impl {config.conv_impl!r}; choose auto or one of "
       f"{', '.join(models.CONV_IMPLS)}"),
      (run.norm in ("batch", "group", "none"),
       f"unknown --norm {run.norm!r}; choose batch, group or none"),
      (run.pm.epochs >= 1, f"--pm.epochs must be >= 1, got {run.pm.epochs}"),
      (run.data.server_size >= 2,
       f"--data.server_size must be >= 2, got {run.data.server_size}"),
  ]
  for ok, message in checks:
    if not ok:
      raise ValueError(message)
  return run


def pretrain_pm(config: training.RunConfig, log=print,
                should_stop=None) -> tuple[str, dict]:
  """Pretrains ``config``'s PM (resolved as a run would), continuing an
  interrupted pretraining of it, and saves it to its directory; returns
  ``(directory, metadata)``. ``should_stop``: asked after every step
  (``pretrain.Stopped``, its checkpoint kept)."""
  run = resolve_pm(config)
  name, server_size, pm_dir = run.pm.model, run.data.server_size, run.pm.dir
  recipe = pm_roles.pm_recipe(run)
  recipe.validate()
  if run.data.download:  # fetched on request only
    data.fetch(run.dataset, run.data.data_dir, form=run.data.download_as)
  data.locate(run.dataset, run.data.data_dir)  # fails before any work
  kwargs = defaults.model_kwargs(name, run.norm, run.pm.kwargs, run.conv_impl)
  dataset = data.load_dataset(run.dataset, data_dir=run.data.data_dir,
                              seed=run.seed)
  server_idx, _ = data.server_split(dataset.num_examples, server_size)
  try:
    model = models.create_model(name, dataset.num_classes, **kwargs)
  except TypeError as e:  # an unknown field in --pm.kwargs
    raise ValueError(f"--pm.kwargs does not fit {name}: {e}") from None
  server = {"x": dataset.x[server_idx], "y": dataset.y[server_idx]}
  log(f"pretraining {name} on the first {server_size} examples of "
      f"{run.dataset} for {counted(recipe.epochs, 'epoch')}")
  _, metadata = store.pretrain_and_save(
      pm_dir, model=model, model_name=name, dataset_name=run.dataset,
      server=server, server_size=server_size,
      split_seed=defaults.server_split_seed(run), config=recipe, log=log,
      overwrite=True, should_stop=should_stop)
  return pm_dir, metadata


def main(argv):
  del argv  # flags only (cli.parse_flags)
  if not FLAGS["verbosity"].present:  # orbax logs every file it writes
    logging.set_verbosity(logging.ERROR)
  log = lambda line: print(line, flush=True)

  try:
    with training.StopSignals() as stop:
      pm_dir, metadata = runner.run_command(lambda: pretrain_pm(
          cli.config_from_flags(), log,
          should_stop=lambda: stop.signum is not None))
      late = stop.take()  # after the last step: the PM is saved
  except pretrain.Stopped as e:
    print(f"interrupted: {signal.Signals(stop.signum).name}: {e}",
          file=sys.stderr)
    sys.exit(128 + stop.signum)
  except KeyboardInterrupt:
    print("interrupted at once (a second signal); the same command "
          "continues from the newest checkpoint, if any", file=sys.stderr,
          flush=True)
    sys.stdout.flush()
    os._exit(130)  # pylint: disable=protected-access
  held = metadata["heldout_accuracy"]
  held = "n/a" if held is None else f"{100 * held:.2f}%"
  print(f"held-out accuracy {held} on {metadata['num_heldout']} server "
        f"examples ({metadata['seconds']:.1f} s); PM saved to {pm_dir}")
  if late is not None:
    print(f"interrupted: {signal.Signals(late).name} after the last step: "
          "the PM was saved", file=sys.stderr)
    sys.exit(128 + late)


if __name__ == "__main__":
  define_flags()
  cli.main_runner(main)
