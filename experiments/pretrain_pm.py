r"""Pretrains the server's private model (PM) on the server split and saves it.

  python -m experiments.pretrain_pm                          # cnn on digits
  python -m experiments.pretrain_pm --pm_model=mlp --pm_kwargs='{"hidden": [512, 256]}'
  python -m experiments.pretrain_pm --dataset=fashion_mnist   # resnet32x4

The server split is the first ``--server_size`` examples of the dataset (the
clients never see them); the last 10% of it are held out for the reported
accuracy. The checkpoint goes to ``--pm_dir`` (default: the directory
``experiments.run`` looks in for the same dataset, PM model, norm, kwargs
and split, ``runs/pm/<dataset>_<model>[-<kwargs>][-<norm>]_srv<n>``) and
replaces any PM there.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from absl import logging

from augfl_jax import data, models, pretrain
from experiments import config as run_config

# Defaults from experiments.config, resolved as for a run: the paper's PM
# (resnet32x4, 240 epochs) for the image datasets; on digits a small CNN for
# 30 epochs.

_DEFAULTS = pretrain.PretrainConfig()

flags.DEFINE_string("dataset", "digits", "digits, fashion_mnist, mnist, "
                    "kmnist, emnist (= emnist/letters), emnist/<split>, "
                    "cifar10, cifar100 (as experiments.run)")
flags.DEFINE_string("pm_model", None, "PM architecture: cnn, mlp, resnet32x4,"
                    " ... (default: cnn on digits, resnet32x4 otherwise)")
flags.DEFINE_string("pm_norm", None, "normalisation layers of the PM: "
                    "batch, group or none (ignored by logreg; default: the "
                    "runs' --norm, group on digits, batch otherwise)")
flags.DEFINE_string("conv_impl", run_config.AUTO, "how the convolutions of "
                    "a cnn / resnet PM run: auto (patches on CPU, xla "
                    "elsewhere), xla or patches; not part of the checkpoint's "
                    "architecture (a PM restores under either)")
flags.DEFINE_string("pm_kwargs", None, "other model fields as a JSON object, "
                    "e.g. '{\"hidden\": [512, 256]}'")
flags.DEFINE_integer("epochs", None, "epochs (default: 30 on digits, 240, as "
                     "the reference, otherwise)")
flags.DEFINE_integer("server_size", None, "server split: the first n examples"
                     " (default: per dataset)")
flags.DEFINE_string("pm_dir", None, "where the checkpoint is written "
                    "(default: where experiments.run looks for this PM)")
flags.DEFINE_string("data_dir", None, "searched first for the dataset's "
                    "files (as experiments.run)")
flags.DEFINE_integer("seed", 0, "seed of the split (recorded) and of the "
                     "initialisation and shuffles")
flags.DEFINE_float("lr", _DEFAULTS.lr, "initial learning rate (x0.1 at 62.5%,"
                   " 75% and 87.5% of the epochs)")
flags.DEFINE_integer("batch_size", _DEFAULTS.batch_size, "minibatch size")
flags.DEFINE_float("holdout_fraction", _DEFAULTS.holdout_fraction,
                   "fraction of the server split held out for the accuracy")
FLAGS = flags.FLAGS


def _validate_flags() -> None:
  checks = [
      (data.canonical_name(FLAGS.dataset) != "synthetic",
       "synthetic has natural clients and no server split to pretrain on; "
       "choose an image dataset such as digits"),
      (FLAGS.pm_model is None or FLAGS.pm_model in models.available_models(),
       f"unknown --pm_model {FLAGS.pm_model!r}; choose one of "
       f"{', '.join(models.available_models())}"),
      (FLAGS.conv_impl == run_config.AUTO or
       FLAGS.conv_impl in models.CONV_IMPLS,
       f"unknown --conv_impl {FLAGS.conv_impl!r}; choose auto or one of "
       f"{', '.join(models.CONV_IMPLS)}"),
      (FLAGS.epochs is None or FLAGS.epochs >= 1,
       f"--epochs must be >= 1, got {FLAGS.epochs}"),
      (FLAGS.server_size is None or FLAGS.server_size >= 2,
       f"--server_size must be >= 2, got {FLAGS.server_size}"),
  ]
  for ok, message in checks:
    if not ok:
      raise ValueError(message)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS["verbosity"].present:  # orbax logs every file it writes
    logging.set_verbosity(logging.ERROR)
  try:
    _validate_flags()
    # The runs' own resolution: the same PM model, norm, epochs, server split
    # and default directory as ``experiments.run`` would look for.
    run = run_config.resolve(run_config.RunConfig(
        dataset=data.canonical_name(FLAGS.dataset), data_dir=FLAGS.data_dir, seed=FLAGS.seed,
        norm=FLAGS.pm_norm, conv_impl=FLAGS.conv_impl,
        server_size=FLAGS.server_size, pm_model=FLAGS.pm_model,
        pm_kwargs=FLAGS.pm_kwargs, pm_epochs=FLAGS.epochs,
        pm_dir=FLAGS.pm_dir))
    name, server_size, pm_dir = run.pm_model, run.server_size, run.pm_dir
    config = pretrain.PretrainConfig(
        model=name, seed=FLAGS.seed, lr=FLAGS.lr, batch_size=FLAGS.batch_size,
        holdout_fraction=FLAGS.holdout_fraction, epochs=run.pm_epochs)
    config.validate()
    data.locate(run.dataset, FLAGS.data_dir)  # fails before any work
    kwargs = run_config.model_kwargs(name, run.norm, run.pm_kwargs,
                                     run.conv_impl)
    dataset = data.load_dataset(run.dataset, data_dir=FLAGS.data_dir,
                                seed=FLAGS.seed)
    server_idx, _ = data.server_split(dataset.num_examples, server_size)
    try:
      model = models.create_model(name, dataset.num_classes, **kwargs)
    except TypeError as e:  # an unknown field in --pm_kwargs
      raise ValueError(f"--pm_kwargs does not fit {name}: {e}") from e
    server = {"x": dataset.x[server_idx], "y": dataset.y[server_idx]}
    print(f"pretraining {name} on the first {server_size} examples of "
          f"{run.dataset} for {config.epochs} epochs", flush=True)
    _, metadata = pretrain.pretrain_and_save(
        pm_dir, model=model, model_name=name, dataset_name=run.dataset,
        server=server, server_size=server_size, split_seed=run_config.SERVER_SPLIT_SEED,
        config=config, log=lambda line: print(line, flush=True),
        overwrite=True)
  except (ValueError, FloatingPointError, data.DatasetUnavailableError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  held = metadata["heldout_accuracy"]
  held = "n/a" if held is None else f"{100 * held:.2f}%"
  print(f"held-out accuracy {held} on {metadata['num_heldout']} server "
        f"examples ({metadata['seconds']:.1f} s); PM saved to {pm_dir}")


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag is one line on stderr and exit 2."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
