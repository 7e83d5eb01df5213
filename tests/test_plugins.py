"""A user's own method, dataset and model, registered from their own modules
(BUILD.md's examples, built here as written), reach ``training.run``,
``experiments.run`` and ``experiments.table2`` with no edit of the
package."""

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from absl import flags

from augfl_jax import algorithms, models, training
from augfl_jax.data import catalog
from experiments import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("my_fedprox", "my_blobs")

pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.fixture
def plugins(tmp_path):
  """BUILD.md's example modules written to ``tmp_path/modules``, importable
  (the registries and ``sys.modules`` are restored afterwards)."""
  text = open(os.path.join(ROOT, "BUILD.md")).read()
  blocks = {m.group(1): m.group(0)[len("```python\n"):-len("```")]
            for m in re.finditer(r"```python\n# (\w+)\.py\n.*?```", text,
                                 re.S)}
  assert set(blocks) == set(MODULES), sorted(blocks)
  directory = tmp_path / "modules"
  directory.mkdir()
  for name, code in blocks.items():
    (directory / f"{name}.py").write_text(code)
  registries = (algorithms._REGISTRY, catalog._REGISTRY, models._REGISTRY)  # pylint: disable=protected-access
  saved = [dict(r) for r in registries]
  sys.path.insert(0, str(directory))
  yield str(directory)
  sys.path.remove(str(directory))
  for name in MODULES:
    sys.modules.pop(name, None)
  for registry, before in zip(registries, saved):
    registry.clear()
    registry.update(before)


def test_a_method_dataset_and_model_of_ones_own_run(plugins, tmp_path):
  for name in MODULES:
    importlib.import_module(name)
  assert algorithms.REGISTRY["fedprox"].label == "FedProx"
  cls = training.config.config_class()
  assert cls is not training.RunConfig and issubclass(cls, training.RunConfig)
  config = cls(algorithm="fedprox", dataset="blobs", rounds=2, eval_every=1)
  plan = training.prepare(config)
  assert (plan.section, plan.config.model) == ("fedprox", "linear")
  summary = training.run(plan, str(tmp_path / "run"), log=lambda s: None)
  assert 0.5 < summary["final_accuracy"] <= 1.0  # four separated blobs
  saved = json.load(open(tmp_path / "run" / "config.json"))
  assert saved["fedprox"] == {"lr": 0.05, "mu": 0.01, "local_epochs": 1,
                              "batch_size": 10}
  # Its fields are flags, checked by their rules; resuming reads its
  # section back from config.json.
  values = flags.FlagValues()
  cli.define_config_flags(flag_values=values)
  values(["run", "--algorithm=fedprox", "--fedprox.mu=-1"])
  with pytest.raises(ValueError, match="fedprox.mu must be >= 0, got -1.0"):
    cli.config_from_flags(values)
  summary = training.run(training.config.config_class()(
      algorithm="fedprox", dataset="blobs", rounds=3, eval_every=1),
                         str(tmp_path / "run"), log=lambda s: None,
                         resume=True)
  assert summary["resumed_from_round"] == 2
  # The base RunConfig has no section for it, and says how to get one.
  with pytest.raises(ValueError, match="config_class"):
    training.prepare(training.RunConfig(algorithm="fedprox"))


@pytest.mark.slow
def test_the_commands_import_a_users_modules(plugins, tmp_path,
                                             compile_cache):
  env = {**os.environ, "XDG_CACHE_HOME": compile_cache,
         "PYTHONPATH": os.pathsep.join([plugins, ROOT])}
  imports = "--imports=" + ",".join(MODULES)
  run = subprocess.run(
      [sys.executable, "-m", "experiments.run", imports, "--dataset=blobs",
       "--algorithm=fedprox", "--fedprox.mu=0.1", "--rounds=2",
       f"--output_dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True,
      text=True, timeout=600, env=env)
  assert run.returncode == 0, run.stderr
  assert json.load(open(tmp_path / "run" / "config.json"))[
      "fedprox"]["mu"] == 0.1
  table = subprocess.run(
      [sys.executable, "-m", "experiments.table2", imports,
       "--datasets=blobs", "--methods=fedavg,fedprox", "--seeds=0",
       "--rounds=2", f"--output_dir={tmp_path / 'table'}",
       f"--results_dir={tmp_path / 'results'}"], cwd=ROOT,
      capture_output=True, text=True, timeout=600, env=env)
  assert table.returncode == 0, table.stderr
  text = open(tmp_path / "results" / "blobs" / "table2.md").read()
  assert "| FedProx |" in text and "* FedProx: fedprox: lr=0.05, mu=0.01" in text
  missing = subprocess.run(
      [sys.executable, "-m", "experiments.run", "--imports=not_a_module"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
  assert missing.returncode == 2
  assert missing.stderr.strip() == (
      "error: --imports: not_a_module does not import (ModuleNotFoundError: "
      "No module named 'not_a_module'); give its file (--imports=path/to/"
      "my_module.py) or put its directory on PYTHONPATH")


def test_imports_in_a_flag_file_and_by_file_define_the_flags(
    plugins, tmp_path, monkeypatch):
  """``--imports`` in a flag file, naming the module's file: its section's
  flags are defined before the flag file's other flags are read."""
  path = os.path.join(plugins, "my_fedprox.py")
  flagfile = tmp_path / "fedprox.flags"
  flagfile.write_text(f"--imports={path}\n--algorithm=fedprox\n"
                      "--fedprox.mu=0.1\n")
  argv = ["run", f"--flagfile={flagfile}"]
  monkeypatch.setattr(sys, "argv", argv)
  assert cli.requested_imports(argv) == [path]
  values = flags.FlagValues()
  cli.define_config_flags(flag_values=values)
  values(argv)
  config = cli.config_from_flags(values)
  assert (config.algorithm, config.fedprox.mu) == ("fedprox", 0.1)
  assert sys.modules["my_fedprox"].__file__ == path
  assert cli.import_requested(argv) == [path]  # once: nothing new


def test_imports_finds_a_module_in_the_current_directory(
    plugins, monkeypatch, capsys):
  """Off ``sys.path`` (no PYTHONPATH), a module in the current directory is
  imported by its name; one found nowhere says how to give it."""
  here = os.path.realpath(plugins)
  monkeypatch.setattr(sys, "path", [
      p for p in sys.path if p not in ("", ".") and os.path.realpath(
          p or ".") not in (here, os.path.realpath(os.getcwd()))])
  monkeypatch.chdir(plugins)
  assert cli.import_requested(["run", "--imports=my_blobs"]) == ["my_blobs"]
  assert "linear" in models.available_models()
  for missing, reason in [("not_a_module", "No module named"),
                          ("elsewhere/my_fedprox.py", "no such file")]:
    with pytest.raises(SystemExit) as e:
      cli.import_requested(["run", f"--imports={missing}"])
    assert e.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: --imports: {missing} does not import ")
    assert reason in line and "\n" not in line
    if missing == "not_a_module":
      assert "--imports=path/to/my_module.py" in line and "PYTHONPATH" in line
