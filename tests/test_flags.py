"""The commands' flags: old names pointing to the new ones, --help grouped
by section (exit 0), and the warning for flags the run does not read."""

import ast
import glob
import json
import os
import re
import subprocess
import sys

import pytest
from absl import flags

from augfl_jax.core import fields
from augfl_jax import algorithms, training
from augfl_jax.commands import runner
from experiments import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of experiments.run (and pretrain_pm) before RunConfig had
# sections, from the history of experiments/run.py, experiments/config.py
# and experiments/pretrain_pm.py (their HELP and RunConfig fields).
OLD_NAMES = (
    "M", "adapt_steps", "alpha", "batch_size", "beta", "ce_weight",
    "classes_per_client", "crd_weight", "data_dir", "dirichlet_alpha",
    "epochs", "feat_dim", "holdout_fraction", "hvp", "inner_steps",
    "kd_weight", "kt_batch_size", "kt_loop", "kt_steps", "lam", "lambda_max",
    "local_epochs", "local_steps", "lr", "lr_gamma", "lr_lambda", "momentum",
    "nce_k", "num_clients", "partition", "per_fedavg_variant", "pm_dir",
    "pm_epochs", "pm_kwargs", "pm_model", "pm_norm", "rho", "server_size",
    "start_from", "uniform_weights", "variant")


@pytest.fixture(scope="module")
def run_flag_values():
  """experiments.run's flags, in a FlagValues of their own."""
  values = flags.FlagValues()
  cli.define_config_flags(flag_values=values)
  return values


def test_every_old_flag_name_has_a_new_one(run_flag_values):
  for old in OLD_NAMES:
    assert old not in run_flag_values, old
    new = cli.renamed_to(old, run_flag_values)
    assert new, old
    for name in new:  # the same quantity: the old name is its last part,
      assert name in run_flag_values  # or RENAMED says what it became
      assert (name.rpartition(".")[2] == old or old in runner.RENAMED)
  assert cli.renamed_to("lam", run_flag_values) == [
      "augfl.lam", "fedproto.lam", "fedcp.lam", "fedoa.lam"]
  assert cli.renamed_to("alpha", run_flag_values)[0] == "augfl.alpha"
  assert cli.renamed_to("alpha", run_flag_values)[-1] == "eval.alpha"
  assert cli.renamed_to("adapt_steps", run_flag_values) == [
      "eval.steps"]
  assert cli.renamed_to("nosuchflag", run_flag_values) == []


def _cli(module, *args):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args,line", [
    (["--lam=1"], "error: unknown flag --lam; it is now --augfl.lam, or "
     "--fedproto.lam, --fedcp.lam, --fedoa.lam (each section has its own)"),
    (["--num_clients=10"],
     "error: unknown flag --num_clients; it is now --data.num_clients"),
    (["--rho", "0.5"], "error: unknown flag --rho; it is now --augfl.rho"),
    (["--pm_model=cnn"], "error: unknown flag --pm_model; it is now "
     "--pm.model"),
    (["--nosuchflag=1"], "error: Unknown command line flag 'nosuchflag'"),
])
def test_an_old_flag_name_gets_its_new_name_in_one_line(tmp_path, args,
                                                         line):
  result = _cli("experiments.run", *args, f"--output_dir={tmp_path}")
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [line]
  assert not os.listdir(tmp_path)


def _group_titles(text):
  """The one-line titles of the groups (a line ending with ":" followed by
  a flag's line)."""
  lines = text.splitlines()
  return [l[:-1] for l, after in zip(lines, lines[1:])
          if l.endswith(":") and not l.startswith(" ")
          and after.startswith("  --")]


def _described(text):
  """The flags the help describes, in order."""
  return [l.split(":")[0].strip()[2:] for l in text.splitlines()
          if l.startswith("  --")]


def test_run_help_groups_every_flag_once_common_first_and_exits_0():
  result = _cli("experiments.run", "--help")
  assert result.returncode == 0, result.stderr
  text = result.stdout
  assert text.startswith("Runs one federated experiment")
  titles = _group_titles(text)
  assert titles[:3] == ["common flags", "other run flags", "run control"]
  assert "--augfl.*: AugFL and KT-only (Eqs. 7, 10-13); lam 0 is AugFL w/o " \
      "PM (read by --algorithm=augfl, kt_only)" in " ".join(
          l.strip() for l in text.splitlines())
  described = _described(text)
  assert described[:5] == list(cli.COMMON)
  config_names = [n for n, *_ in fields.walk(training.RunConfig())]
  assert sorted(described) == sorted(config_names +
                                     list(cli.RUN_CONTROL) +
                                     list(cli.DISTRIBUTED))
  # A flag without a default value states its default in its help, as
  # --output_dir does, the same as the docstring and default_output_dir.
  assert "(default: None)" not in text
  joined = " ".join(text.split())
  assert "``--output_dir`` (default ``runs/<dataset>_<algorithm>_seed<seed>``)" \
      in joined
  assert "--output_dir: where the command writes its files (default " \
      "runs/<dataset>_<algorithm>_seed<seed>, a / in the dataset's name as " \
      "_)" in joined
  assert cli.default_output_dir(training.RunConfig(
      dataset="emnist", algorithm="fedavg", seed=3)) == (
          "runs/emnist_letters_fedavg_seed3")
  assert all(len(l) <= 80 for l in text.splitlines()
             if l.startswith("  --"))  # wrapped (words longer stay whole)


@pytest.mark.parametrize("module,own,output_dir", [
    ("experiments.table2", ["datasets", "finished_only", "methods",
                            "replace_results", "results_dir", "seeds"],
     "runs/table2"),
    ("experiments.sweep", ["grid", "reference", "replace_results", "seeds"],
     "runs/sweep_<algorithm>"),
    ("experiments.ablations", ["lams", "pm_epochs", "seeds", "study"],
     "runs/ablation_<study>_<dataset>"),
    ("experiments.ood", ["algorithms", "angles", "clients_per_domain",
                         "datasets", "examples_per_client", "held_out",
                         "seeds", "shared_images"], "runs/ood"),
    ("experiments.pretrain_pm", [], None),
])
def test_a_command_help_shows_its_own_flags_then_the_run_flags(
    module, own, output_dir):
  result = _cli(module, "--help")
  assert result.returncode == 0, result.stderr
  text = result.stdout
  titles = _group_titles(text)
  described = _described(text)
  if own:
    assert titles[0] == f"the flags of python -m {module}"
    assert described[:len(own)] == own
  assert "common flags" in titles and "--pm.*: the pretrained model" in titles
  assert "dataset" in described and "pm.epochs" in described
  assert len(described) == len(set(described))
  joined = " ".join(l.strip() for l in text.splitlines())
  if output_dir is None:
    assert "output_dir" not in described
  else:
    assert ("--output_dir: where the command writes its files (default "
            f"{output_dir}") in joined
    doc = " ".join(text[:text.index("\n" + titles[0] + ":")].split())
    stated = re.findall(r"``--output_dir`` \(default ``([^`]*)``", doc)
    assert stated == ([output_dir.split(",")[0]]
                      if module in ("experiments.table2", "experiments.ood")
                      else [])  # the docstrings that state it agree


def test_helpfull_adds_absl_flags():
  result = _cli("experiments.run", "--helpfull")
  assert result.returncode == 0, result.stderr
  assert "absl.logging's flags" in _group_titles(result.stdout)
  assert "verbosity" in _described(result.stdout)


def _config(values, *args):
  values.unparse_flags()
  values(["prog", *args])
  return training.prepare(cli.config_from_flags(values))


def test_flags_of_sections_the_run_does_not_read_are_named(run_flag_values):
  values = run_flag_values
  warning = lambda *args: cli.unread_flags_warning(
      _config(values, *args), values)
  assert warning("--algorithm=fedavg", "--augfl.lam=1", "--pm.model=cnn",
                 "--fedbc.lr=0.1", "--crd.nce_k=8", "--fedavg.lr=0.1") == (
                     "warning: ignored, as the run does not read them: "
                     "--pm.model (the run has no PM); --crd.nce_k (the run "
                     "has no CRD regulariser); --augfl.lam, --fedbc.lr "
                     "(--algorithm=fedavg reads --fedavg.*)")
  assert warning("--augfl.lam=1", "--pm.epochs=2", "--crd.nce_k=8") is None
  assert warning("--augfl.lam=0", "--pm.epochs=2") == (
      "warning: ignored, as the run does not read them: --pm.epochs (the "
      "run has no PM)")
  assert warning("--algorithm=fedlp", "--pm.epochs=2") is None
  assert warning("--algorithm=kt_only", "--augfl.rho=0.5") is None


@pytest.mark.parametrize("algorithm", sorted(algorithms.REGISTRY))
def test_unread_sections_follow_the_pm_role(algorithm):
  config = training.validate(training.RunConfig(algorithm=algorithm))
  unread = training.unread_sections(config)
  own = training.config.section_name(config)
  assert own not in unread and {"data", "eval"}.isdisjoint(unread)
  assert {training.config.section_name(config, name)
          for name in algorithms.REGISTRY} - {own} <= set(unread)
  role = training.pm_role(config)
  assert ("pm" in unread) == (role == "none")
  assert ("crd" in unread) == (role != "regularizer")
  lam0 = fields.replace(config, **{"augfl.lam": 0.0})
  if own == "augfl":
    assert {"pm", "crd"} <= set(training.unread_sections(lam0))


@pytest.mark.parametrize("algorithm,lam,read", [
    ("fedavg", None, ["data", "eval", "fedavg"]),
    ("augfl", 5.0, ["data", "pm", "crd", "eval", "augfl"]),
    ("augfl", 0.0, ["data", "eval", "augfl"])])
def test_config_json_marks_the_sections_the_run_reads(algorithm, lam, read):
  """``read_sections``, from the plan's unread sections; the configuration
  reads back from it, and from one without it (an older run's), the same;
  curves do not take it for a field."""
  from experiments import curves  # pylint: disable=g-import-not-at-top
  config = training.RunConfig(algorithm=algorithm)
  if lam is not None:
    config = fields.replace(config, **{"augfl.lam": lam})
  plan = training.prepare(config)
  saved = json.loads(json.dumps(training.config.to_config_json(
      plan.config, plan.unread)))
  assert saved["read_sections"] == read
  assert saved == {**fields.to_dict(plan.config), "read_sections": read}
  assert training.config.to_config_json(plan.config) == saved
  cls = training.config.config_class()
  assert training.config.from_config_json(cls, saved) == plan.config
  del saved["read_sections"]
  assert training.config.from_config_json(cls, saved) == plan.config
  assert "read_sections" not in curves._read_sections(  # pylint: disable=protected-access
      {**saved, "read_sections": read})


@pytest.mark.slow
def test_what_a_run_does_not_read_does_not_change_it(tmp_path):
  """FedAvg with other values in every section it is said not to read
  gives the same numbers, bit for bit."""
  def metrics(name, **changes):
    config = fields.replace(training.RunConfig(
        algorithm="fedavg", rounds=2, eval_every=2), **changes)
    training.run(config, str(tmp_path / name), log=lambda line: None)
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in open(tmp_path / name / "metrics.jsonl")]
  changed = {"augfl.lam": 0.0, "augfl.alpha": 0.5, "pm.model": "mlp",
             "pm.epochs": 1, "crd.nce_k": 7, "fedbc.lr": 1.0,
             "per_fedavg.beta": 0.5, "fedoa.lam": 3.0,
             "fedavgm.server_momentum": 0.5, "fedadam.server_lr": 0.5,
             "fedyogi.tau": 0.5}
  assert {n.partition(".")[0] for n in changed} == set(
      training.unread_sections(training.validate(training.RunConfig(
          algorithm="fedavg")))) - {"fedproto", "fedpcl", "fedcp", "fedit"}
  assert metrics("base") == metrics("changed", **changed)


@pytest.mark.parametrize("args,flag,meant", [
    (["--algorithm=FedAvg"], "algorithm", "fedavg"),
    (["--algorithm=per-fedavg"], "algorithm", "per_fedavg"),
    (["--algorithm=fedavgg"], "algorithm", "fedavg"),
    (["--dataset=fashion-mnist"], "dataset", "fashion_mnist"),
    (["--dataset=Fashion_MNIST"], "dataset", "fashion_mnist"),
    (["--model=CNN"], "model", "cnn"),
    (["--pm.model=resnet8X4"], "pm.model", "resnet8x4"),
    (["--algorithm=sgd"], "algorithm", None),
    (["--dataset=imagenet"], "dataset", None),
])
def test_an_unknown_name_gets_its_near_miss_and_imports(run_flag_values,
                                                        args, flag, meant):
  run_flag_values.unparse_flags()
  run_flag_values(["prog", *args])
  with pytest.raises(ValueError) as e:
    cli.config_from_flags(run_flag_values)
  message = str(e.value)
  name = args[0].partition("=")[2]
  assert message.startswith(f"unknown --{flag} {name!r}; ")
  assert "\n" not in message
  assert ((f"did you mean {meant}?" in message) if meant
          else "did you mean" not in message), message
  assert "--imports=my_module" in message
  assert "--imports=path/to/my_module.py" in message
  run_flag_values.unparse_flags()
  run_flag_values(["prog", f"--{flag}={meant or 'mlp'}"] if flag.endswith(
      "model") or meant else ["prog"])
  cli.config_from_flags(run_flag_values)  # the right name is taken


def _imported(path):
  """The modules the file ``path`` imports (``from augfl_jax import data``:
  ``augfl_jax.data``), inside functions too."""
  names = []
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names += ([f"{node.module}.{alias.name}" for alias in node.names]
                if node.module == "augfl_jax" else [node.module])
  return names


def test_the_command_plumbing_stands_below_training():
  """``augfl_jax.commands`` imports no run configuration (``training``, the
  methods) and no command folder: ``experiments/``, ``benchmarks/`` and
  one's own commands import it, and the library under it defines no
  flags."""
  paths = sorted(glob.glob(os.path.join(ROOT, "augfl_jax", "commands",
                                        "*.py")))
  assert [os.path.basename(p) for p in paths] == [
      "__init__.py", "flag_help.py", "output_files.py", "runner.py"]
  rooms = {name.split(".")[1] for path in paths for name in _imported(path)
           if name.startswith("augfl_jax.")}
  assert rooms <= {"commands", "core", "data", "storage"}, rooms
  assert not [name for path in paths for name in _imported(path)
              if name.split(".")[0] in ("experiments", "benchmarks")]
  library = [path for path in glob.glob(os.path.join(
      ROOT, "augfl_jax", "**", "*.py"), recursive=True)
             if "flags.DEFINE_" in open(path).read()]
  assert library == []


def test_the_benchmarks_import_nothing_of_experiments():
  """The two command folders stand side by side: what both use is
  ``augfl_jax.commands`` (a benchmark starts ``experiments.run`` as a
  process, never imports it)."""
  imported = [(os.path.basename(path), name)
              for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks",
                                                        "*.py")))
              for name in _imported(path)
              if name.split(".")[0] == "experiments"]
  assert imported == []
