"""The algorithm registry: every algorithm, its config and its PM role,
declared once in its own module; ``algorithms.build`` dispatches through it."""

import ast
import dataclasses
import inspect

import jax
import pytest

from augfl_jax import algorithms, models
from augfl_jax.algorithms.augfl import round as augfl
from augfl_jax.algorithms import base, fedavg
from augfl_jax.algorithms.fedbc import round as fedbc
from augfl_jax.algorithms.fedpcl import round as fedpcl

# The roles of the paper's methods (see base.PM_ROLES).
ROLES = {
    "augfl": "regularizer", "kt_only": "regularizer",
    "fedavg": "none", "per_fedavg": "none", "fedbc": "none",
    "per_fedbc": "none", "fedproto": "none", "fedcp": "none",
    "fedlp": "initialization", "fedpcl": "encoder",
    "fedit": "backbone", "fedoa": "backbone",
}


def test_registry_covers_every_algorithm_with_a_valid_role():
  assert isinstance(algorithms.REGISTRY, dict)
  assert set(algorithms.REGISTRY) == set(ROLES)
  assert algorithms.ALGORITHMS == tuple(algorithms.REGISTRY)
  for name, spec in algorithms.REGISTRY.items():
    assert isinstance(spec, base.AlgorithmSpec) and spec.name == name
    assert spec.pm_role in base.PM_ROLES and spec.pm_role == ROLES[name]
    assert dataclasses.is_dataclass(spec.config_class)
    assert spec.config_class.__dataclass_params__.frozen
    spec.config_class()  # the defaults are valid
    assert set(inspect.signature(spec.build).parameters) >= {
        "model", "config", "strategy", "eval_alpha", "eval_steps", "pm"}
  for role in base.PM_ROLES:
    assert algorithms.names_with_role(role) == tuple(
        n for n in algorithms.ALGORITHMS if ROLES[n] == role)
  assert algorithms.USES_REGULARIZER == ("augfl", "kt_only")
  assert algorithms.PM_BACKBONE == ("fedit", "fedoa")
  assert algorithms.CONFIGS["per_fedbc"] is fedbc.FedBCConfig
  assert algorithms.CONFIGS["fedlp"] is fedavg.FedAvgConfig
  assert algorithms.CONFIGS["kt_only"] is augfl.AugFLConfig
  with pytest.raises(ValueError, match="unknown PM role"):
    algorithms.names_with_role("teacher")
  with pytest.raises(ValueError, match="pm_role"):
    base.AlgorithmSpec("x", fedavg.FedAvgConfig, "teacher", fedavg.fedavg)


def test_the_package_init_names_no_algorithm():
  """No name tuples, no special cases in ``algorithms/__init__.py``: what it
  knows of an algorithm comes from the registry (docstrings aside)."""
  init = ast.parse(inspect.getsource(algorithms))
  docstrings = {id(node.value) for node in ast.walk(init)
                if isinstance(node, ast.Expr)}
  strings = {node.value for node in ast.walk(init)
             if isinstance(node, ast.Constant) and id(node) not in docstrings}
  assert not strings & set(algorithms.ALGORITHMS)


@pytest.mark.parametrize("module", algorithms.MODULES,
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_module_declares_its_roles_once(module):
  """One module-level ``*PM_ROLE = "..."`` per role the module uses, and its
  specs take their roles from those constants (FedAvg's module holds FedAvg
  and FedLP: two roles)."""
  tree = ast.parse(inspect.getsource(module))
  declared = {}
  for node in tree.body:
    if isinstance(node, ast.Assign):
      for target in node.targets:
        if isinstance(target, ast.Name) and target.id.endswith("PM_ROLE"):
          assert target.id not in declared, f"{target.id} declared twice"
          declared[target.id] = ast.literal_eval(node.value)
  assert "PM_ROLE" in declared
  assert len(set(declared.values())) == len(declared)
  for spec in module.SPECS:
    assert spec.pm_role in declared.values()
    assert spec.name in algorithms.REGISTRY
    assert algorithms.REGISTRY[spec.name] is spec


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
