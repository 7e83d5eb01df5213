"""benchmarks.fedoa_cost's own parts: the flag file it reads and the
matrix arithmetic it counts."""

import os

import jax
import jax.numpy as jnp
import pytest

from augfl_jax import training
from augfl_jax.core import fields
from benchmarks import fedoa_cost


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_cpu_preset_is_read_as_experiments_run_reads_it(tmp_path,
                                                            monkeypatch):
  monkeypatch.chdir(ROOT)  # its --flagfile line names a path from the root
  changes = fedoa_cost.preset_changes(
      "experiments/configs/fashion_mnist_cpu.flags")
  # its own lines, and those of the flag file it names
  assert changes["pm.model"] == "cnn" and changes["crd.kt_steps"] == 16
  assert changes["dataset"] == "fashion_mnist" and changes["augfl.lam"] == 5.0
  assert isinstance(changes["data.num_clients"], int)
  config = fields.replace(training.RunConfig(), **changes)
  assert config.crd.negative_sampling == "shared"
  bad = tmp_path / "bad.flags"
  bad.write_text("--nosuch=1\n")
  with pytest.raises(ValueError, match="'nosuch' is not a field"):
    fedoa_cost.preset_changes(str(bad))
  with pytest.raises(ValueError, match="cannot read the flag file"):
    fedoa_cost.preset_changes(str(tmp_path / "missing.flags"))


def test_matmul_flops_counts_loops_by_their_trip_count():
  """A [4, 8] x [8, 16] product (1,024 FLOPs) in a scan of 3, under a cond
  whose other branch does half of it, inside a jit; a 3x3 convolution of a
  [1, 5, 5, 2] input to 4 channels (2 * 25 * 4 * 18 FLOPs)."""
  x, w = jnp.ones((4, 8)), jnp.ones((8, 16))

  def f(x, w, k):
    def body(c, _):
      y = jax.lax.cond(c[0, 0] > 0, lambda: x @ w, lambda: jnp.concatenate(
          [x[:2] @ w, jnp.zeros((2, 16))]))
      return c + y[:, :8], None
    c, _ = jax.lax.scan(body, x, None, length=3)
    conv = jax.lax.conv_general_dilated(
        jnp.ones((1, 5, 5, 2)), k, (1, 1), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.jit(lambda c: c.sum())(c) + conv.sum()

  jaxpr = jax.make_jaxpr(f)(x, w, jnp.ones((3, 3, 2, 4)))
  assert fedoa_cost.matmul_flops(jaxpr) == 3 * 1024 + 2 * 25 * 4 * 18
