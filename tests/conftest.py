"""Makes the repository root importable when pytest runs from a checkout, and
the fixtures that several test modules share."""

from __future__ import annotations

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)


@pytest.fixture(scope="session", autouse=True)
def float32_matmul_precision():
  """The suite's precision policy (``tests/precision.py``): float32 matmuls
  and convolutions on every backend.

  On a backend other than CPU (where XLA's default float32 dot is TF32 on
  GPUs, bfloat16 passes on TPUs) this sets ``jax_default_matmul_precision``
  to ``"highest"`` for the whole session and exports
  ``JAX_DEFAULT_MATMUL_PRECISION=highest`` to the subprocesses tests start;
  on CPU it changes nothing. Yields the precision set (None on CPU).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from tests import precision  # pylint: disable=g-import-not-at-top
  policy = precision.matmul_precision_policy(jax.default_backend())
  if policy is None:
    yield None
    return
  old_config = jax.config.jax_default_matmul_precision
  old_env = os.environ.get(precision.ENV_VAR)
  jax.config.update("jax_default_matmul_precision", policy)
  os.environ[precision.ENV_VAR] = policy
  try:
    yield policy
  finally:
    jax.config.update("jax_default_matmul_precision", old_config)
    if old_env is None:
      os.environ.pop(precision.ENV_VAR, None)
    else:
      os.environ[precision.ENV_VAR] = old_env


@pytest.fixture
def exact_matmuls():
  """float32 matmuls in this test whatever the session's policy (the
  session fixture above already asks for them on accelerators), so that
  vmap and map agree to float32 rounding on any backend."""
  import jax  # pylint: disable=g-import-not-at-top
  with jax.default_matmul_precision("highest"):
    yield


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  """The CLI's default compilation cache, pointed into the session's temp
  directory (``XDG_CACHE_HOME``, yielded) for this process and its
  subprocesses; a module opts in with
  ``pytestmark = pytest.mark.usefixtures("compile_cache")``."""
  from experiments import cli  # pylint: disable=g-import-not-at-top
  xdg = tmp_path_factory.getbasetemp() / "xdg"
  cli.enable_compilation_cache(str(xdg / "augfl_jax" / "jax_cache"))
  yield str(xdg)
  cli.disable_compilation_cache()
