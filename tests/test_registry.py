"""The algorithm registry: every algorithm, its config and its PM role,
declared once in its own module; ``algorithms.build`` dispatches through it."""

import ast
import dataclasses
import inspect
import os
import re

import jax
import pytest

from augfl_jax import algorithms, models, training
from augfl_jax.algorithms import augfl
from augfl_jax.algorithms import base, fedavg
from augfl_jax.algorithms import fedbc
from augfl_jax.algorithms import fedpcl
from augfl_jax.core import fields

# The roles of the paper's methods (see base.PM_ROLES).
ROLES = {
    "augfl": "regularizer", "kt_only": "regularizer",
    "fedavg": "none", "fedavgm": "none", "fedadam": "none",
    "fedyogi": "none", "per_fedavg": "none", "fedbc": "none",
    "per_fedbc": "none", "fedproto": "none", "fedcp": "none",
    "fedlp": "initialization", "fedpcl": "encoder",
    "fedit": "backbone", "fedoa": "backbone",
}


# The labels of the paper's methods in tables and plots.
LABELS = {"augfl": "AugFL w/ PM", "kt_only": "KT-only", "fedavg": "FedAvg",
          "fedavgm": "FedAvgM", "fedadam": "FedAdam", "fedyogi": "FedYogi",
          "fedlp": "FedLP", "per_fedavg": "Per-FedAvg", "fedbc": "FedBC",
          "per_fedbc": "Per-FedBC", "fedproto": "FedProto",
          "fedpcl": "FedPCL", "fedcp": "FedCP", "fedit": "FedIT",
          "fedoa": "FedOA"}


def test_registry_covers_every_algorithm_with_a_valid_role():
  assert set(algorithms.REGISTRY) == set(ROLES)
  for name, spec in algorithms.REGISTRY.items():
    assert isinstance(spec, base.AlgorithmSpec) and spec.name == name
    assert spec.pm_role in base.PM_ROLES and spec.pm_role == ROLES[name]
  assert algorithms.REGISTRY["per_fedbc"].config_class is fedbc.FedBCConfig
  assert algorithms.REGISTRY["fedlp"].config_class is fedavg.FedAvgConfig
  assert algorithms.REGISTRY["kt_only"].config_class is augfl.AugFLConfig
  with pytest.raises(ValueError, match="pm_role"):
    base.AlgorithmSpec("x", fedavg.FedAvgConfig, "teacher", fedavg.fedavg,
                       label="X")
  with pytest.raises(ValueError, match="label"):
    base.AlgorithmSpec("x", fedavg.FedAvgConfig, "none", fedavg.fedavg,
                       label="")
  with pytest.raises(TypeError):  # a label is required
    base.AlgorithmSpec("x", fedavg.FedAvgConfig, "none", fedavg.fedavg)  # pylint: disable=no-value-for-parameter


@pytest.mark.parametrize("name", sorted(algorithms.REGISTRY))
def test_each_spec_states_every_fact_a_runner_needs(name):
  """A registered method lacking one of them fails here: its config is a
  checked frozen dataclass with a RunConfig section, its build takes the
  runner's arguments, and its label, PM use and adaptation step answer for
  its default configuration."""
  spec = algorithms.REGISTRY[name]
  assert dataclasses.is_dataclass(spec.config_class)
  assert spec.config_class.__dataclass_params__.frozen
  assert issubclass(spec.config_class, fields.Config)  # rules checked
  config = training.RunConfig(algorithm=name)
  section = training.config.algorithm_config(config)
  assert type(section) is spec.config_class  # pylint: disable=unidiomatic-typecheck
  assert set(inspect.signature(spec.build).parameters) >= {
      "model", "config", "strategy", "eval_alpha", "eval_steps", "pm"}
  assert spec.label_of(section) == LABELS[name]
  assert spec.active_role(section, "crd") == spec.pm_role
  alpha = spec.eval_alpha(section) if spec.eval_alpha else None
  assert alpha == {"augfl": 0.03, "kt_only": 0.03, "per_fedavg": 0.03,
                   "per_fedbc": 0.03}.get(name)


def test_augfl_without_its_weight_or_regulariser_has_no_pm():
  spec = algorithms.REGISTRY["augfl"]
  assert spec.active_role(augfl.AugFLConfig(lam=0.0)) == "none"
  assert spec.active_role(augfl.AugFLConfig(lam=5.0), "none") == "none"
  assert spec.active_role(augfl.AugFLConfig(lam=5.0), "l2") == "regularizer"
  assert spec.label_of(augfl.AugFLConfig(lam=0.0)) == "AugFL w/o PM"


def test_every_config_class_has_one_run_config_section():
  sections = {name: training.config.section_name(training.RunConfig(), name)
              for name in algorithms.REGISTRY}
  by_class = {}
  for name, section in sections.items():
    by_class.setdefault(algorithms.REGISTRY[name].config_class,
                        set()).add(section)
  assert all(len(s) == 1 for s in by_class.values())
  assert len(set(sections.values())) == len(by_class)


def test_register_adds_a_method_and_refuses_a_taken_name():
  spec = algorithms.REGISTRY["fedavg"]
  assert algorithms.register(spec) is spec  # the same spec: no change
  twin = dataclasses.replace(spec, label="FedAvg again")
  with pytest.raises(ValueError, match="'fedavg' is registered already"):
    algorithms.register(twin)
  with pytest.raises(TypeError, match="AlgorithmSpec"):
    algorithms.register("fedavg")
  with pytest.raises(TypeError):
    algorithms.REGISTRY["x"] = spec  # read-only; register() adds


def test_the_package_init_names_no_algorithm():
  """No name tuples, no special cases in ``algorithms/__init__.py``: what it
  knows of an algorithm comes from the registry (docstrings aside)."""
  init = ast.parse(inspect.getsource(algorithms))
  docstrings = {id(node.value) for node in ast.walk(init)
                if isinstance(node, ast.Expr)}
  strings = {node.value for node in ast.walk(init)
             if isinstance(node, ast.Constant) and id(node) not in docstrings}
  assert not strings & set(algorithms.REGISTRY)


def _method_words() -> set[str]:
  """The registry's names and the fields of the methods' configs that no
  section of a run's own (``data``, ``pm``, ``eval``, ...) shares."""
  run = training.RunConfig()
  sections = {training.config.section_name(run, n) for n in algorithms.REGISTRY}
  own = {name.rpartition(".")[2] for name, *_ in fields.walk(run)
         if name.partition(".")[0] not in sections}
  methods = {name.rpartition(".")[2] for spec in algorithms.REGISTRY.values()
             for name, *_ in fields.walk(spec.config_class())}
  return set(algorithms.REGISTRY) | methods - own


def _exempt(tree: ast.Module, path: str) -> set[int]:
  """The nodes of ``tree`` that may name a method: docstrings and, in
  ``config.py``, the import of the methods' modules and ``RunConfig``'s
  declarations of their sections (each by its config's type, with its
  default and help)."""
  nodes = [node.value for node in ast.walk(tree) if isinstance(node, ast.Expr)]
  if path == "config.py":
    sections = {training.config.section_name(training.RunConfig(), n)
                for n in algorithms.REGISTRY}
    nodes += [node for node in tree.body if isinstance(node, ast.ImportFrom)
              and node.module == "augfl_jax.algorithms"]
    run_config = next(node for node in tree.body if isinstance(
        node, ast.ClassDef) and node.name == "RunConfig")
    nodes += [node for node in run_config.body if isinstance(
        node, ast.AnnAssign) and node.target.id in sections]
  return {id(inner) for node in nodes for inner in ast.walk(node)}


def _named(node: ast.AST, words: set[str]) -> str | None:
  """What ``node`` names of ``words``: a word of a string (a help text, a
  message, a ``getattr``), an attribute, a keyword, a name, or a module of
  a method imported."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    found = set(re.findall(r"[A-Za-z_]\w*", node.value)) & words
    return node.value if found else None
  name = (node.attr if isinstance(node, ast.Attribute) else
          node.arg if isinstance(node, ast.keyword) else
          node.id if isinstance(node, ast.Name) else None)
  if name in words:
    return name
  if isinstance(node, ast.ImportFrom) and (
      node.module or "").startswith("augfl_jax.algorithms."):
    return node.module
  return None


def test_training_names_no_algorithm():
  """``training/`` names no algorithm and none of a method's own fields
  (docstrings aside; in strings, attributes, keywords, names or imports)
  but where ``RunConfig`` declares the methods' sections, and the default
  of ``--algorithm``: what it knows of a method comes from its spec, and
  its help texts that list the methods or datasets come from the
  registries."""
  root = os.path.dirname(training.__file__)
  words, named = _method_words(), []
  assert {"lam", "dense_updates", "rho"} <= words
  for path in sorted(os.listdir(root)):
    if not path.endswith(".py"):
      continue
    tree = ast.parse(open(os.path.join(root, path)).read())
    exempt = _exempt(tree, path)
    named += [(path, found) for node in ast.walk(tree)
              if id(node) not in exempt
              and (found := _named(node, words)) is not None]
  assert named == [("config.py", training.RunConfig().algorithm)]


def _mlp():
  return models.MLP(num_classes=3, hidden=(4,))


def test_build_errors():
  model = _mlp()
  with pytest.raises(ValueError, match="unknown algorithm"):
    algorithms.build("fedsgd", model, fedavg.FedAvgConfig())
  with pytest.raises(TypeError, match="needs a FedAvgConfig"):
    algorithms.build("fedlp", model, fedbc.FedBCConfig())
  with pytest.raises(ValueError, match="takes no server regulariser"):
    algorithms.build("fedavg", model, fedavg.FedAvgConfig(),
                     regularizer=(None, None))
  with pytest.raises(ValueError, match="needs encoder_apply"):
    algorithms.build("fedpcl", model, fedpcl.FedPCLConfig())
  with pytest.raises(ValueError, match="takes no encoder_apply"):
    algorithms.build("fedavg", model, fedavg.FedAvgConfig(),
                     encoder_apply=lambda x, mask: x)
  with pytest.raises(ValueError, match="lam > 0 needs a server regulariser"):
    algorithms.build("kt_only", model, augfl.AugFLConfig(lam=1.0))
  # The constructors check their pm argument themselves.
  with pytest.raises(ValueError, match="fedlp takes no pm"):
    fedavg.fedlp(model, fedavg.FedAvgConfig(), pm=lambda x, mask: x)
  with pytest.raises(ValueError, match="fedpcl needs pm"):
    fedpcl.fedpcl(model, fedpcl.FedPCLConfig())


def test_build_returns_the_named_algorithm():
  model = _mlp()
  params = models.init_params(model, jax.random.key(0), (5,))
  for name, config in (("fedlp", fedavg.FedAvgConfig()),
                       ("per_fedbc", fedbc.FedBCConfig()),
                       ("augfl", augfl.AugFLConfig())):
    algo = algorithms.build(name, model, config)
    assert isinstance(algo, base.FederatedAlgorithm) and algo.name == name
    state = algo.init(params, 2, jax.random.key(1))
    jax.tree.map(lambda a, b: None, algo.global_params(state), params)
