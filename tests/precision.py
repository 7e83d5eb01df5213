"""The float32 precision the test suite runs at, per backend.

The suite's float32 tolerances (atol 1e-6 .. 1e-5 on most comparisons) are
written for float32 arithmetic. XLA's default matmul precision is float32 on
CPU, but not on accelerators: on NVIDIA GPUs since Ampere a float32 dot or
convolution runs in TF32 (10-bit mantissa, relative error ~5e-4) and on TPUs
in bfloat16 passes, unless a precision is asked for. A closed-form test that
passes on CPU with errors ~1e-7 then fails on a GPU with errors ~1e-4, and a
finite-difference Hessian-vector product (Eq. (10)) divides that rounding by
``2 delta`` (x55 at the paper's delta = 1/110).

Policy: on every backend other than CPU the session runs with
``jax_default_matmul_precision = "highest"`` (float32 dots and convolutions),
set by the autouse session fixture in ``tests/conftest.py`` and exported as
``JAX_DEFAULT_MATMUL_PRECISION`` to the subprocesses tests start (the
command-line and multi-process tests). CPU is left alone: it already
computes float32 dots in float32, and the library's defaults are what the
suite should test there. With the policy in force every backend computes
the same float32 functions; what still differs is the order of float32
sums (rounding ~1e-7 relative), which the tolerances allow for, including
after the x55 of the finite-difference HVP (its effect on a client model is
scaled by alpha * w_i / rho ~ 0.01 in the AugFL tests).
"""

from __future__ import annotations

HIGHEST = "highest"
ENV_VAR = "JAX_DEFAULT_MATMUL_PRECISION"


def matmul_precision_policy(backend: str) -> str | None:
  """The ``jax_default_matmul_precision`` the suite uses on ``backend``.

  None (leave JAX's default) on ``"cpu"``; ``"highest"`` on every other
  backend (``"gpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``, plugins).
  """
  return None if backend == "cpu" else HIGHEST
