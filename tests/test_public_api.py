"""The package's face: ``__all__`` names the public API, each name resolves,
nothing heavy is imported before it is used, and every module states its
own public names."""

import importlib
import importlib.util
import os
import pkgutil
import subprocess
import sys

import augfl_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_importing_the_package_loads_nothing_heavy_until_used():
  code = (
      "import sys, augfl_jax\n"
      "heavy = ('jax', 'orbax.checkpoint', 'tensorflow', 'flax')\n"
      "print(sorted(m for m in heavy if m in sys.modules))\n"
      "from augfl_jax import augfl, make_round\n"
      "assert make_round is augfl.make_round is augfl.admm.make_round\n"
      "print('orbax.checkpoint' in sys.modules)\n"
      "for name in augfl_jax.__all__: getattr(augfl_jax, name)\n"
      "print('orbax.checkpoint' in sys.modules)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split("\n")[:3] == ["[]", "False", "True"]


def test_the_face_names_the_round_the_registry_and_the_run():
  for name in ("make_round", "client_update", "server_update", "AugFLConfig",
               "AugFLState", "REGISTRY", "register", "build", "run",
               "RunConfig", "prepare", "core", "algorithms", "training",
               "intervals", "evaluation", "fields", "tree", "pretrain"):
    assert name in augfl_jax.__all__
  assert sorted(augfl_jax.__all__) == sorted(set(augfl_jax.__all__))
  assert set(augfl_jax.__all__) <= set(dir(augfl_jax))


def test_every_module_states_its_public_names():
  for info in pkgutil.walk_packages(augfl_jax.__path__, "augfl_jax."):
    module = importlib.import_module(info.name)
    names = getattr(module, "__all__", None)
    assert names is not None, f"{info.name} has no __all__"
    missing = [n for n in names if not hasattr(module, n) and
               importlib.util.find_spec(f"{info.name}.{n}") is None]
    assert not missing, f"{info.name}.__all__ names {missing}"
