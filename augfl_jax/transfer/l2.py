"""The squared-distance regulariser ``R_h = ||theta - theta_p||^2``.

The case of the AugFL paper's analysis (Section IV-C, Theorem 3). It needs
the PM to have exactly the client model's architecture (same pytree, same
shapes); otherwise use CRD.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from augfl_jax.core.types import Params, PRNGKey

__all__ = [
    "check_same_architecture", "l2_grad", "l2_value", "make_l2_regularizer"
]


def l2_value(theta: Params, theta_p: Params) -> jax.Array:
  """``||theta - theta_p||^2`` summed over all leaves (scalar)."""
  return optax.tree.norm(optax.tree.sub(theta, theta_p), squared=True)


def l2_grad(theta: Params, theta_p: Params) -> Params:
  """``grad_theta ||theta - theta_p||^2 = 2 (theta - theta_p)``."""
  return jax.tree.map(lambda a, b: 2.0 * (a - b), theta, theta_p)


def _describe(tree: Params) -> str:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return "{" + ", ".join(f"{jax.tree_util.keystr(path)}: {jnp.shape(leaf)}"
                         for path, leaf in flat) + "}"


def check_same_architecture(theta: Params, theta_p: Params) -> None:
  """Raises ValueError unless both trees have the same structure and shapes."""
  same = jax.tree.structure(theta) == jax.tree.structure(theta_p) and all(
      jnp.shape(a) == jnp.shape(b)
      for a, b in zip(jax.tree.leaves(theta), jax.tree.leaves(theta_p)))
  if not same:
    raise ValueError(
        "the l2 regulariser needs the PM to have the client model's "
        f"architecture; got PM {_describe(theta_p)} and client model "
        f"{_describe(theta)}; use --regularizer=crd")


def make_l2_regularizer(pm_params: Params):
  """``(init_fn, grad_fn)`` of ``R_h = ||theta - theta_p||^2``.

  ``init_fn(key, student_params) -> None`` checks the architectures;
  ``grad_fn(student_params, state) -> (2 (theta - theta_p), state,
  {"r_h": ||theta - theta_p||^2})``, jitted with ``pm_params`` as an argument
  (not a compile-time constant).

  Raises:
    ValueError: (from either function) if ``pm_params`` and the client
      parameters differ in structure or shapes.
  """

  def init_fn(key: PRNGKey, student_params: Params) -> None:
    del key
    check_same_architecture(student_params, pm_params)
    return None

  @jax.jit
  def _grad(theta, theta_p):
    return l2_grad(theta, theta_p), {"r_h": l2_value(theta, theta_p)}

  def grad_fn(student_params: Params, state: Any = None):
    check_same_architecture(student_params, pm_params)
    reg_grad, metrics = _grad(student_params, pm_params)
    return reg_grad, state, metrics

  return init_fn, grad_fn
