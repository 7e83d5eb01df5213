"""The input checks of AugFL's client step (``augfl.client_update``): values
where they are concrete (before jit, or outside it), dtypes always (under jit
too), each failing with one sentence that says what to pass instead.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from augfl_jax.types import Params

__all__ = ["check_client_args", "concrete"]


def concrete(value) -> float | None:
  """``value`` as a float when it is known now (not traced), else None."""
  if isinstance(value, jax.core.Tracer):
    return None
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


def check_client_args(theta: Params, dual: Params, *, alpha, rho) -> None:
  """The checks of :func:`augfl_jax.augfl.client_update` (its docstring):
  ``rho > 0`` and a finite ``alpha`` where they are concrete, 32-bit float
  parameters and duals of ``theta``'s tree and dtypes always."""
  rho_, alpha_ = concrete(rho), concrete(alpha)
  if rho_ is not None and not rho_ > 0:
    raise ValueError(f"rho must be > 0 (theta_i = theta - step / rho), got "
                     f"{rho_}")
  if alpha_ is not None and not math.isfinite(alpha_):
    raise ValueError(f"alpha must be a finite number, got {alpha_}")
  for path, leaf in jax.tree_util.tree_flatten_with_path(theta)[0]:
    dtype = jnp.result_type(leaf)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
      # Eq. (10)'s difference of gradients at theta +- delta r, delta ~ 1e-2,
      # cancels every digit a 16-bit float has (float16: 3, bfloat16: 2).
      raise ValueError(
          f"theta{jax.tree_util.keystr(path)} is {dtype}: AugFL's client "
          "step needs float32 (or float64) parameters (the finite-"
          "difference Hessian-vector product of Eq. (10) loses every digit "
          "of a 16-bit float); keep a float32 copy of theta, e.g. "
          "jax.tree.map(lambda x: x.astype(jnp.float32), theta)")
  theta_dtypes = jax.tree.map(jnp.result_type, theta)
  dual_dtypes = jax.tree.map(jnp.result_type, dual)
  if jax.tree.structure(theta_dtypes) != jax.tree.structure(dual_dtypes) or (
      jax.tree.leaves(theta_dtypes) != jax.tree.leaves(dual_dtypes)):
    raise ValueError("dual must have theta's tree and dtypes (y_i lives "
                     "where theta does, Eq. (12)); got "
                     f"{jax.tree.leaves(dual_dtypes)[:3]} for theta's "
                     f"{jax.tree.leaves(theta_dtypes)[:3]}")
