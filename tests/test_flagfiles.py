"""The shipped flag files spell out exactly the presets a bare --dataset gets."""

from __future__ import annotations

import glob
import os

import pytest
from absl import flags

from augfl_jax.core import fields
from augfl_jax import training
from experiments import cli

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "experiments", "configs")


def _config_from_flagfile(path: str) -> training.RunConfig:
  values = flags.FlagValues()
  cli.define_config_flags(flag_values=values)
  values(["prog", f"--flagfile={path}"])
  return cli.config_from_flags(values)


# Flag files of a configuration other than a dataset's preset, and the
# fields where each departs from it.
VARIANTS = {
    "fashion_mnist_authors": {
        "model", "data.partition", "data.support_fraction",
        "data.server_overlap", "augfl.alpha", "augfl.rho", "augfl.lam",
        "eval.alpha",
        "crd.augment", "pm.dir"},
    "fashion_mnist_cpu": {"pm.model", "pm.epochs", "pm.dir",
                          "crd.kt_steps", "crd.negative_sampling",
                          "crd.nce_k"},
    "fashion_mnist_table": {"pm.model", "pm.epochs", "pm.dir"},
}


@pytest.mark.parametrize("path", sorted(
    p for p in glob.glob(os.path.join(CONFIGS, "*.flags"))
    if os.path.basename(p)[:-6] not in VARIANTS))
def test_flagfile_is_the_preset(path):
  config = _config_from_flagfile(path)
  preset = training.resolve(training.RunConfig(dataset=config.dataset))
  assert training.resolve(config) == preset, fields.diff(
      preset, training.resolve(config))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_departs_from_the_preset_where_it_says(name):
  config = training.resolve(_config_from_flagfile(
      os.path.join(CONFIGS, name + ".flags")))
  preset = training.resolve(training.RunConfig(dataset=config.dataset))
  changed = {line.split(":")[0] for line in fields.diff(preset, config)}
  assert changed == VARIANTS[name]


def test_every_file_dataset_has_a_flagfile():
  names = {os.path.basename(p)[:-6] for p in glob.glob(
      os.path.join(CONFIGS, "*.flags"))}
  assert {"digits", "synthetic", "fashion_mnist", "emnist", "cifar10",
          "cifar100"} <= names
