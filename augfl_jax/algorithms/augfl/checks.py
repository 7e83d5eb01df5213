"""The input checks of AugFL's client and server steps
(:func:`~augfl_jax.algorithms.augfl.admm.client_update`,
:func:`~augfl_jax.algorithms.augfl.admm.server_update`): values where they
are concrete (before jit, or outside it), shapes and dtypes always (under
jit too), each failing with one sentence that says what to pass instead.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from augfl_jax.core import checks
from augfl_jax.core.types import Params

__all__ = ["check_client_args", "check_server_args"]


def check_client_args(theta: Params, dual: Params, *, alpha, rho) -> None:
  """The checks of :func:`augfl_jax.algorithms.augfl.admm.client_update`
  (its docstring):
  ``rho > 0`` and a finite ``alpha`` where they are concrete, 32-bit float
  parameters and duals of ``theta``'s tree and dtypes always."""
  rho_, alpha_ = checks.concrete(rho), checks.concrete(alpha)
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
  kind = lambda leaf: (jnp.shape(leaf), jnp.result_type(leaf))
  theta_kinds = jax.tree.map(kind, theta)
  dual_kinds = jax.tree.map(kind, dual)
  if jax.tree.structure(theta) != jax.tree.structure(dual) or (
      jax.tree.leaves(theta_kinds) != jax.tree.leaves(dual_kinds)):
    raise ValueError("dual must have theta's tree and dtypes, and its "
                     "shapes (y_i lives where theta does, Eq. (12)); got "
                     f"{checks.first_leaves(dual)} for theta's "
                     f"{checks.first_leaves(theta)}")


def check_server_args(client_params: Params, duals: Params,
                      rhos) -> None:
  """The checks of :func:`augfl_jax.algorithms.augfl.admm.server_update`:
  ``duals`` of
  ``client_params``' tree and shapes, and one rho per client (``[C]``)."""
  shapes = lambda tree: jax.tree.leaves(jax.tree.map(jnp.shape, tree))
  if (jax.tree.structure(client_params) != jax.tree.structure(duals) or
      shapes(client_params) != shapes(duals)):
    raise ValueError("duals must have client_params' tree and shapes (one "
                     f"y_i per theta_i); got {checks.first_leaves(duals)} for "
                     f"client_params' {checks.first_leaves(client_params)}")
  num_clients = jnp.shape(jax.tree.leaves(client_params)[0])[0]
  if jnp.shape(rhos) != (num_clients,):
    raise ValueError(f"rhos must hold one rho per client, shape "
                     f"({num_clients},), got shape {jnp.shape(rhos)}")
