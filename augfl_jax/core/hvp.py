"""Hessian-vector products of a loss, without forming the Hessian.

Both functions take ``grad_fn(params) -> grad`` (the gradient of a scalar loss
at fixed data) and a ``vector`` with the same tree structure as ``params``.

* ``finite_difference_hvp`` is AugFL's Eq. (10): two extra gradients,
  ``[grad(p + delta v) - grad(p - delta v)] / (2 delta)``; its error is
  O(delta^2) for a smooth loss.
* ``exact_hvp`` is forward-over-reverse differentiation
  (``jax.jvp`` of ``grad_fn``), exact up to float rounding.
"""

from __future__ import annotations

from typing import Callable

import jax
import optax

from augfl_jax.core.types import Params

__all__ = ["exact_hvp", "finite_difference_hvp", "GradFn", "hvp", "HVP_METHODS"]

GradFn = Callable[[Params], Params]
HVP_METHODS = ("finite_difference", "exact")


def finite_difference_hvp(grad_fn: GradFn, params: Params, vector: Params,
                          delta: float | jax.Array) -> Params:
  """Central-difference estimate of ``H(params) @ vector`` (Eq. (10))."""
  plus = grad_fn(optax.tree.add_scale(params, delta, vector))
  minus = grad_fn(optax.tree.add_scale(params, -delta, vector))
  return optax.tree.scale(0.5 / delta, optax.tree.sub(plus, minus))


def exact_hvp(grad_fn: GradFn, params: Params, vector: Params) -> Params:
  """``H(params) @ vector`` by ``jax.jvp`` of the gradient (forward-over-reverse)."""
  return jax.jvp(grad_fn, (params,), (vector,))[1]


def hvp(grad_fn: GradFn, params: Params, vector: Params, *,
        delta: float | jax.Array, method: str = "finite_difference") -> Params:
  """Dispatches to ``finite_difference_hvp`` or ``exact_hvp`` by ``method``."""
  if method == "finite_difference":
    return finite_difference_hvp(grad_fn, params, vector, delta)
  if method == "exact":
    return exact_hvp(grad_fn, params, vector)
  raise ValueError(f"hvp method must be one of {HVP_METHODS}, got {method!r}")
