"""Makes the repository root importable when pytest runs from a checkout, and
the fixtures that several test modules share."""

from __future__ import annotations

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)


@pytest.fixture
def exact_matmuls():
  """float32 matmuls everywhere (GPUs may default to TF32), so that vmap and
  map agree to float32 rounding on any backend."""
  import jax  # pylint: disable=g-import-not-at-top
  with jax.default_matmul_precision("highest"):
    yield


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  """The CLI's default compilation cache, pointed into the session's temp
  directory (``XDG_CACHE_HOME``, yielded) for this process and its
  subprocesses; a module opts in with
  ``pytestmark = pytest.mark.usefixtures("compile_cache")``."""
  from experiments import flags as run_flags  # pylint: disable=g-import-not-at-top
  xdg = tmp_path_factory.getbasetemp() / "xdg"
  run_flags.enable_compilation_cache(str(xdg / "augfl_jax" / "jax_cache"))
  yield str(xdg)
  run_flags.disable_compilation_cache()
