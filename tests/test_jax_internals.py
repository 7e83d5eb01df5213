"""JAX's private names in one guarded place
(``augfl_jax.processes.jax_internals``): each is there, with the parameters
the code passes, in the JAX installed (an upgrade that moves one fails
here, not in a run across processes); no other module touches
``jax._src``; and a run tells one process from a cluster's by JAX's public
``jax.distributed.initialize()``."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import types

import jax
from jax._src import distributed as jax_distributed
from jax._src.lib import _jax

from augfl_jax.processes import jax_internals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_internal_is_there_with_the_parameters_the_code_passes():
  assert jax_internals.problems() == []


def test_the_check_names_an_internal_that_changed(monkeypatch):
  """What a JAX upgrade could change, the check reports, one sentence
  each."""
  monkeypatch.setattr(_jax, "get_distributed_runtime_service",
                      lambda address, num_nodes: None)
  monkeypatch.setattr(jax_distributed, "_jax", types.SimpleNamespace())
  monkeypatch.setattr(jax.distributed, "initialize",
                      lambda coordinator_address=None: None)
  assert jax_internals.problems() == [
      "jax._src.distributed._jax is not jax._src.lib._jax",
      "get_distributed_runtime_service takes no heartbeat_timeout",
      "jax.distributed.initialize takes no heartbeat_timeout_seconds",
      "jax.distributed.initialize takes no initialization_timeout"]
  monkeypatch.setattr(_jax.DistributedRuntimeClient, "key_value_dir_get",
                      lambda self, prefix, limit: None, raising=False)
  assert ("DistributedRuntimeClient.key_value_dir_get takes (self, prefix, "
          "limit), not (self, key, ...)") in jax_internals.problems()


def test_no_module_but_jax_internals_touches_jax_s_private_modules():
  touching = []
  for folder in ("augfl_jax", "experiments", "benchmarks"):
    for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"),
                          recursive=True):
      with open(path) as f:
        if re.search(r"\bjax\._src\b|\bfrom jax import _src\b", f.read()):
          touching.append(os.path.relpath(path, ROOT))
  assert touching == [os.path.join("augfl_jax", "processes",
                                   "jax_internals.py")]


_DETECT = """
import json, os
from jax._src import clusters
from augfl_jax.processes import group
said = {"no cluster": group.initialize()}
os.environ["JAX_COORDINATOR_ADDRESS"] = "localhost:1"  # and nothing else
try:
  said["address alone"] = group.initialize()
except ValueError as e:
  said["address alone"] = str(e)
del os.environ["JAX_COORDINATOR_ADDRESS"]

class OptIn(clusters.ClusterEnv):  # present, but JAX detects it only when named
  name, opt_in_only_method = "opt_in_test", True

  @classmethod
  def is_env_present(cls):
    return True

said["an opt-in cluster"] = group.initialize()
import jax
said["processes"] = jax.process_count()
print(json.dumps(said))
"""


def test_one_process_is_told_from_a_cluster_by_jax_s_own_detection():
  """Without a cluster JAX detects, the run is one process; any other error
  of ``jax.distributed.initialize()`` (here: JAX's coordinator variable set
  alone) is raised, not taken for one process; an opt-in cluster type
  (mpi4py's kind), which JAX detects only when named, is no cluster
  (before, a copy of JAX's private filter took it for one, and the run
  failed)."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "OMPI_", "JAX_COORDINATOR",
                              "TPU_", "CLOUD_TPU"))}
  result = subprocess.run(
      [sys.executable, "-c", _DETECT], cwd=ROOT, capture_output=True,
      text=True, timeout=120, check=False,
      env=dict(env, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1]) == {
      "no cluster": False,
      "address alone": "Number of processes must be defined.",
      "an opt-in cluster": False, "processes": 1}


def test_a_process_that_used_jax_before_runs_as_it_is(monkeypatch):
  """A command's ``main`` called where JAX has run already (a test, a
  notebook) runs alone, without asking ``jax.distributed.initialize``,
  which would raise; a process that has not run JAX yet is told so."""
  from augfl_jax.processes import group  # pylint: disable=g-import-not-at-top
  jax.numpy.zeros(1).block_until_ready()
  assert jax_internals.backends_started()
  def must_not_be_called(**kwargs):
    raise AssertionError(f"jax.distributed.initialize({kwargs})")
  monkeypatch.setattr(jax.distributed, "initialize", must_not_be_called)
  assert group.initialize() is False
  result = subprocess.run(
      [sys.executable, "-c", "from augfl_jax.processes import jax_internals"
       " as j; print(j.backends_started())"], cwd=ROOT, capture_output=True,
      text=True, timeout=120, check=False, env=dict(os.environ,
                                                     PYTHONPATH=ROOT))
  assert result.stdout.strip() == "False", result.stderr[-2000:]
