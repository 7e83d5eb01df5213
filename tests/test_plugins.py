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



# A method of one's own whose config cannot be built from its defaults (a
# default that breaks its own field's rule, a field without a default), that
# is no dataclass, or whose field no flag can take.
_CONFIG = ("import dataclasses\n"
           "from augfl_jax import algorithms\n"
           "from augfl_jax.algorithms import averaging, fedavg\n"
           "from augfl_jax.core import fields\n\n"
           "@dataclasses.dataclass(frozen=True)\n"
           "class OwnConfig(fields.Config):\n"
           "  {field}\n"
           "  local_epochs: int = fields.field(1, 'local epochs', ge=1)\n"
           "  batch_size: int = fields.field(10, 'minibatch size', ge=1)\n\n"
           "algorithms.register(algorithms.AlgorithmSpec(\n"
           "    'own', OwnConfig, 'none',\n"
           "    averaging.constructor('own', fedavg.make_round), "
           "label='Own'))\n")
BROKEN = {
    "no_default": (
        _CONFIG.format(field="lr: float = fields.field(help='step', gt=0)"),
        "error: --imports: no_default does not import (ValueError: "
        "algorithm 'own': its config OwnConfig cannot be built from its "
        "defaults (TypeError: OwnConfig.__init__() missing 1 required "
        "positional argument: 'lr'); give every field a default)"),
    "dict_field": (
        _CONFIG.format(field="lr: dict = fields.field(default_factory=dict)"),
        "error: --imports: dict_field does not import (TypeError: algorithm "
        "'own': OwnConfig.lr is of type dict, which no flag --own.lr can "
        "take; make it one of bool, int, float, str, tuple (or None))"),
    "bad_default": (
        "import dataclasses\n"
        "from augfl_jax import algorithms\n"
        "from augfl_jax.algorithms import averaging, fedavg\n"
        "from augfl_jax.core import fields\n\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class BadConfig(fields.Config):\n"
        "  lr: float = fields.field(-1.0, 'client step size', gt=0)\n"
        "  local_epochs: int = fields.field(1, 'local epochs', ge=1)\n"
        "  batch_size: int = fields.field(10, 'minibatch size', ge=1)\n\n"
        "algorithms.register(algorithms.AlgorithmSpec(\n"
        "    'badlr', BadConfig, 'none',\n"
        "    averaging.constructor('badlr', fedavg.make_round), label='Bad'))\n",
        "error: --imports: bad_default does not import (ValueError: algorithm "
        "'badlr': the default of BadConfig.lr breaks its own rule (badlr.lr "
        "must be > 0, got -1.0): give the field a default its rule allows)"),
    "plain_config": (
        "from augfl_jax import algorithms\n"
        "from augfl_jax.algorithms import averaging, fedavg\n\n"
        "class PlainConfig:\n"
        "  lr = 0.05\n\n"
        "algorithms.register(algorithms.AlgorithmSpec(\n"
        "    'plain', PlainConfig, 'none',\n"
        "    averaging.constructor('plain', fedavg.make_round), "
        "label='Plain'))\n",
        "error: --imports: plain_config does not import (TypeError: algorithm "
        "'plain': its config class <class 'plain_config.PlainConfig'> is not "
        "a dataclass; make it a frozen dataclass of fields.Config, with a "
        "default for every field)"),
}


@pytest.fixture
def broken(tmp_path):
  """:data:`BROKEN`'s modules in ``tmp_path/broken``, importable (the
  registry and ``sys.modules`` restored afterwards)."""
  directory = tmp_path / "broken"
  directory.mkdir()
  for name, (code, _) in BROKEN.items():
    (directory / f"{name}.py").write_text(code)
  before = dict(algorithms._REGISTRY)  # pylint: disable=protected-access
  sys.path.insert(0, str(directory))
  yield str(directory)
  sys.path.remove(str(directory))
  for name in BROKEN:
    sys.modules.pop(name, None)
  algorithms._REGISTRY.clear()  # pylint: disable=protected-access
  algorithms._REGISTRY.update(before)  # pylint: disable=protected-access


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_plugin_whose_config_defaults_do_not_build_is_one_line(
    broken, capsys, name):
  del broken
  with pytest.raises(SystemExit) as e:
    cli.import_requested(["run", f"--imports={name}"])
  assert e.value.code == 2
  assert capsys.readouterr().err == BROKEN[name][1] + "\n"
  assert not {"badlr", "plain", "own"} & set(algorithms.REGISTRY)
  training.config.config_class()()  # the commands build their flags


@pytest.mark.slow
@pytest.mark.parametrize("command", ["experiments.run", "experiments.table2",
                                     "experiments.pretrain_pm"])
def test_every_command_stops_at_a_broken_plugin_in_one_line(
    broken, tmp_path, command):
  result = subprocess.run(
      [sys.executable, "-m", command, "--imports=bad_default",
       f"--output_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
      text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": os.pathsep.join([broken, ROOT])})
  assert result.returncode == 2
  assert result.stderr == BROKEN["bad_default"][1] + "\n"
  assert not os.path.exists(tmp_path / "out")

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
