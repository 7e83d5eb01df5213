"""The suite's float32 precision policy (tests/precision.py), checked on CPU.

A GPU session cannot be had everywhere, so what can be checked without one
is checked here: the policy per backend, that the session runs at it, and
that "highest" reaches the compiled program (the operand precision of a dot
and a convolution), which is what keeps a GPU from rounding to TF32.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from tests import precision


@pytest.mark.parametrize("backend,want", [
    ("cpu", None), ("gpu", "highest"), ("cuda", "highest"),
    ("rocm", "highest"), ("tpu", "highest")])
def test_policy_per_backend(backend, want):
  assert precision.matmul_precision_policy(backend) == want


def test_session_runs_at_the_policy(float32_matmul_precision):
  want = precision.matmul_precision_policy(jax.default_backend())
  assert float32_matmul_precision == want
  if want is not None:
    assert jax.config.jax_default_matmul_precision == want
    assert os.environ[precision.ENV_VAR] == want


def _lowered(fn, *args) -> str:
  return jax.jit(fn).lower(*args).as_text()


def test_highest_reaches_dots_and_convolutions():
  """Under the accelerator policy, the lowered dot and convolution carry
  HIGHEST operand precision (XLA then computes them in float32 on a GPU)."""
  x = jnp.ones((4, 8, 8, 3))
  k = jnp.ones((3, 3, 3, 5))
  dot = lambda a: a.reshape(4, -1) @ a.reshape(4, -1).T
  conv = lambda a, b: jax.lax.conv_general_dilated(
      a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  with jax.default_matmul_precision(precision.matmul_precision_policy("gpu")):
    for text in (_lowered(dot, x), _lowered(conv, x, k)):
      assert "HIGHEST" in text, text
  # JAX's default (what the policy leaves alone on CPU) asks for none.
  with jax.default_matmul_precision(None):
    assert "HIGHEST" not in _lowered(dot, x)
