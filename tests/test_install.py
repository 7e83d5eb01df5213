"""What `pip install -e .` gives: the library alone, without TensorFlow
(an extra, ``tfds``, for tfds prepared copies only), and no top-level
``experiments`` or ``benchmarks`` package."""

import configparser
import importlib.metadata
import os
import subprocess
import sys

import pytest

from tests.test_data import fake_tfds_copy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run first in a subprocess: TensorFlow and tfds cannot be imported, as in a
# venv of `pip install -e .`.
WITHOUT_TF = ("import sys\n"
              "sys.modules['tensorflow'] = None\n"
              "sys.modules['tensorflow_datasets'] = None\n")


def _python(code, *args):
  return subprocess.run([sys.executable, "-c", WITHOUT_TF + code, *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)


def _requirements(text):
  return [line.strip() for line in text.strip().splitlines()]


def test_setup_installs_the_library_without_tensorflow():
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(ROOT, "setup.cfg"))
  required = _requirements(cfg["options"]["install_requires"])
  assert not [r for r in required if r.startswith("tensorflow")]
  extras = cfg["options.extras_require"]
  tfds = _requirements(extras["tfds"])
  assert {r.split(">")[0] for r in tfds} == {"tensorflow-cpu",
                                              "tensorflow-datasets"}
  assert set(tfds) <= set(_requirements(extras["test"]))  # CI tests tfds
  assert _requirements(cfg["options.packages.find"]["include"]) == [
      "augfl_jax", "augfl_jax.*"]


def _floors(required):
  """``{name: lowest version}`` of setup.cfg's ``name>=version[,<...]``."""
  floors = {}
  for line in required:
    if line and not line.startswith("#"):
      name, _, rest = line.partition(">=")
      floors[name.strip()] = rest.split(",")[0].strip()
  return floors


def _version(text):
  return tuple(int(part) for part in text.split(".")[:3])


def test_setup_admits_from_the_versions_the_suite_has_passed():
  """Every floor of setup.cfg is one BUILD.md names as passed (one list,
  no admitted version older than a tested one), and the versions the
  suite runs on here are admitted."""
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(ROOT, "setup.cfg"))
  floors = _floors(_requirements(cfg["options"]["install_requires"]))
  with open(os.path.join(ROOT, "BUILD.md")) as f:
    line = next(l for l in f if l.startswith("Floors passed: "))
  passed = dict(item.split() for item in
                line[len("Floors passed: "):].rstrip(".\n").split(", "))
  assert floors == passed
  for name, floor in floors.items():
    assert _version(importlib.metadata.version(name)) >= _version(floor), name


@pytest.mark.slow
def test_a_run_needs_no_tensorflow(tmp_path):
  """Every module of the library imports, and a whole run (its events
  included) finishes, where TensorFlow cannot be imported."""
  result = _python(
      "import importlib, pkgutil, augfl_jax\n"
      "for m in pkgutil.walk_packages(augfl_jax.__path__, 'augfl_jax.'):\n"
      "  importlib.import_module(m.name)\n"
      "from augfl_jax import training\n"
      "config = training.RunConfig(algorithm='fedavg', rounds=2, "
      "eval_every=2)\n"
      "s = training.run(config, sys.argv[1], log=lambda line: None)\n"
      "print(s['rounds'])\n", str(tmp_path))
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ["2"]
  assert os.listdir(tmp_path / "tb")


def test_a_tfds_copy_without_tensorflow_names_the_extra(tmp_path):
  root = fake_tfds_copy(tmp_path / "tfds", "cifar10")
  result = _python(
      "from experiments import run\n"
      "sys.argv = ['run'] + sys.argv[1:]\n"
      "from experiments import cli\n"
      "cli.main_runner(run.main)\n",
      "--dataset=cifar10", f"--data.data_dir={root}",
      f"--output_dir={tmp_path / 'out'}")
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  assert lines[0] == (
      f"error: dataset 'cifar10': its tfds prepared copy in {root} is read "
      "with TensorFlow and tensorflow-datasets (tensorflow, "
      "tensorflow_datasets not installed): install the tfds extra, pip "
      "install -e \".[tfds]\" in the augfl_jax checkout")
  assert not os.path.exists(tmp_path / "out")
