"""The AugFL round across processes (jax.distributed), against one process.

Two local processes with 4 fake CPU devices each run two AugFL rounds with
the client axis sharded over all 8 devices (``"sharded:map"``): each process
supplies only its own clients' data and the server's sums over clients are
an all-reduce across the processes. The result must be the single-process
round's (vmap on one device) to float32 rounding.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import chex
import jax
import numpy as np
import pytest

from augfl_jax.algorithms import augfl
from augfl_jax.core import distributed
from augfl_jax.processes import local
from tests import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_CLIENTS = 16  # 2 per device
ROUNDS = 2

_WORKER = textwrap.dedent("""
    import os, sys
    process_id, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.distributed.initialize(coordinator_address=f"localhost:{port}",
                               num_processes=2, process_id=process_id,
                               initialization_timeout=120)
    import numpy as np
    from jax.experimental import multihost_utils
    from augfl_jax.algorithms import augfl
    from augfl_jax.core import client_axis as clients, distributed
    from tests import tiny
    assert jax.process_count() == 2 and jax.device_count() == 8
    assert jax.local_device_count() == 4
    C, ROUNDS = %(num_clients)d, %(rounds)d
    strategy = clients.as_strategy("sharded:map")
    # Every process knows the setting; each loads only its own clients.
    everyone = tiny.client_data(seed=0, num_clients=C, pad_to=6)
    lo, hi = distributed.local_client_range(C, strategy)
    assert (lo, hi) == (8 * process_id, 8 * process_id + 8), (lo, hi)
    mine = jax.tree.map(lambda a: np.asarray(a)[lo:hi], everyone)
    data = distributed.shard_local_clients(mine, strategy)
    state = augfl.init_state(tiny.init(jax.random.PRNGKey(0)), C)
    state = state.replace(
        params=distributed.replicate(state.params, strategy),
        duals=distributed.shard_clients(state.duals, strategy),
        client_params=distributed.shard_clients(state.client_params, strategy),
        client_rounds=distributed.shard_clients(state.client_rounds, strategy),
        round=distributed.replicate(state.round, strategy))
    round_fn = augfl.make_round(tiny.loss_fn, augfl.AugFLConfig(), strategy)
    for _ in range(ROUNDS):
      state, metrics = round_fn(state, data)
    assert not state.duals["w1"].is_fully_addressable  # split over processes
    assert state.params["w1"].sharding.is_fully_replicated
    full = multihost_utils.process_allgather((state, metrics), tiled=True)
    if process_id == 0:
      leaves = jax.tree.leaves(full)
      np.savez(out, *[np.asarray(a) for a in leaves])
    print("PROCESS_OK", process_id, flush=True)
""") % {"num_clients": NUM_CLIENTS, "rounds": ROUNDS}


def _single_process_reference():
  data = tiny.client_data(seed=0, num_clients=NUM_CLIENTS, pad_to=6)
  state = augfl.init_state(tiny.init(jax.random.PRNGKey(0)), NUM_CLIENTS)
  round_fn = augfl.make_round(tiny.loss_fn, augfl.AugFLConfig(), "vmap")
  for _ in range(ROUNDS):
    state, metrics = round_fn(state, data)
  return state, metrics


@pytest.mark.slow
def test_round_on_two_processes_matches_one_process(tmp_path):
  out = tmp_path / "result.npz"
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  port = str(local.free_port())
  procs = [subprocess.Popen(
      [sys.executable, "-c", _WORKER, str(i), port, str(out)], cwd=ROOT,
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = []
  try:
    for proc in procs:
      logs.append(proc.communicate(timeout=420)[0])
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  for i, (proc, log) in enumerate(zip(procs, logs)):
    assert proc.returncode == 0 and f"PROCESS_OK {i}" in log, log[-4000:]
  ref = _single_process_reference()
  treedef = jax.tree.structure(ref)
  with np.load(out) as f:
    got = jax.tree.unflatten(treedef, [f[f"arr_{i}"]
                                       for i in range(treedef.num_leaves)])
  chex.assert_trees_all_close(got, jax.tree.map(np.asarray, ref),
                              rtol=1e-5, atol=1e-6)


def test_placement_in_one_process():
  strategy = "sharded"
  n = jax.device_count()
  tree = {"a": np.arange(4 * n, dtype=np.float32).reshape(2 * n, 2)}
  placed = distributed.shard_clients(tree, strategy)
  np.testing.assert_array_equal(placed["a"], tree["a"])
  assert distributed.local_client_range(2 * n, strategy) == (0, 2 * n)
  local = distributed.shard_local_clients(tree, strategy)
  np.testing.assert_array_equal(local["a"], tree["a"])
  rep = distributed.replicate({"s": np.float32(3.0)}, strategy)
  assert rep["s"].sharding.is_fully_replicated and float(rep["s"]) == 3.0
  if n > 1:
    with pytest.raises(ValueError, match="multiple of"):
      distributed.shard_clients({"a": np.zeros((n + 1, 2))}, strategy)
