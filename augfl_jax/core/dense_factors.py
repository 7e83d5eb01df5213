"""Gradients of a loss whose ``nn.Dense`` kernels are kept as low-rank factors.

For a dense kernel ``K`` (``[d_in, d_out]``) applied to rows ``x`` (``[m,
d_in]``), the gradient of a loss over those rows is ``A^T B`` with ``A = x``
and ``B`` the output cotangents (``[m, d_out]``): rank at most ``m``. So a
client's per-round quantities of a dense layer (its support gradient, the
model ``phi = theta - alpha A^T B`` it evaluates, the finite-difference
points ``theta +- delta r``) can be carried as factors and applied to
inputs as ``x K + (x U^T) V`` instead of materialising ``d_in x d_out``
matrices.

``value_and_grad`` runs a user's ``loss_fn(params, batch)`` unchanged, under
``flax.linen.intercept_methods``: each ``nn.Dense.__call__`` computes its
output at the shared kernel, adds the low-rank corrections given for its
layer, and a zero perturbation whose gradient is ``B``; its input is ``A``.
Every other parameter is differentiated as usual.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["Factors", "concat", "dense_kernels", "join_kernels", "materialise",
           "split_kernels", "value_and_grad"]

Path = tuple[str, ...]


class Factors(NamedTuple):
  """``U^T V``: ``u [r, d_in]``, ``v [r, d_out]``."""

  u: jax.Array
  v: jax.Array

  def scale(self, c) -> "Factors":
    return Factors(self.u, c * self.v)


def concat(parts: list[Factors]) -> Factors:
  """The factors of the sum of ``parts``: rows stacked."""
  return Factors(jnp.concatenate([p.u for p in parts]),
                 jnp.concatenate([p.v for p in parts]))


def _dense_call(context) -> bool:
  return (isinstance(context.module, nn.Dense) and
          context.method_name == "__call__")


def dense_kernels(loss_fn: Callable, params: Any, batch: Any
                  ) -> dict[Path, list[jax.ShapeDtypeStruct]]:
  """``{layer path: [output shape of each call]}`` of the ``nn.Dense``
  layers ``loss_fn(params, batch)`` calls (traced abstractly)."""
  found: dict[Path, list] = {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if _dense_call(context):
      found.setdefault(tuple(context.module.path), []).append(
          jax.ShapeDtypeStruct(out.shape, out.dtype))
    return out

  def run(p, b):
    with nn.intercept_methods(interceptor):
      return loss_fn(p, b)

  jax.eval_shape(run, params, batch)
  return found


def split_kernels(params: Any, paths) -> tuple[Any, dict[Path, jax.Array]]:
  """``params`` without the kernels of ``paths``, and those kernels."""
  rest = jax.tree.map(lambda x: x, params)  # a copy of the nested dicts
  kernels = {}
  for path in paths:
    node = rest
    for name in path:
      node = node[name]
    node = dict(node)
    kernels[path] = node.pop("kernel")
    parent = rest
    for name in path[:-1]:
      parent = parent[name]
    parent[path[-1]] = node
  return rest, kernels


def join_kernels(rest: Any, kernels: Mapping[Path, jax.Array]) -> Any:
  """The inverse of :func:`split_kernels`."""
  full = jax.tree.map(lambda x: x, rest)
  for path, kernel in kernels.items():
    parent = full
    for name in path[:-1]:
      parent = parent[name]
    parent[path[-1]] = {**parent[path[-1]], "kernel": kernel}
  return full


def value_and_grad(loss_fn: Callable, params: Any, batch: Any,
                   corrections: Mapping[Path, Factors] | None = None,
                   layers: Mapping[Path, list] | None = None
                   ) -> tuple[jax.Array, Any, dict[Path, Factors]]:
  """The loss at ``params`` with each dense kernel ``K + U^T V`` and its
  gradient, the dense kernels' part as factors.

  Args:
    loss_fn: ``loss_fn(params, batch) -> scalar``, unchanged.
    params: the model's parameters (the shared ``K`` of each dense layer).
    batch: the examples.
    corrections: ``{layer path: Factors}``, added to those kernels.
    layers: the layers to factor, ``{path: output shapes}`` as
      :func:`dense_kernels` gives them (default: all of them); other
      ``nn.Dense`` kernels are differentiated as any parameter.

  Returns:
    ``(loss, grads of the other parameters (the tree of params without the
    dense kernels), {layer path: Factors(A, B)})`` with ``A^T B`` the
    gradient of that kernel.
  """
  corrections = corrections or {}
  layers = dense_kernels(loss_fn, params, batch) if layers is None else layers
  rest, kernels = split_kernels(params, layers)
  eps = {path: [jnp.zeros(s.shape, s.dtype) for s in shapes]
         for path, shapes in layers.items()}

  def loss(rest, eps):
    inputs: dict[Path, list] = {path: [] for path in layers}

    def interceptor(next_fun, args, kwargs, context):
      path = tuple(context.module.path)
      if not _dense_call(context) or path not in layers:
        return next_fun(*args, **kwargs)
      x = args[0]
      y = next_fun(*args, **kwargs)
      if path in corrections:
        u, v = corrections[path]
        y = y + (x @ u.T.astype(x.dtype)) @ v.astype(y.dtype)
      calls = inputs[path]
      y = y + eps[path][len(calls)]
      calls.append(x)
      return y

    with nn.intercept_methods(interceptor):
      value = loss_fn(join_kernels(rest, kernels), batch)
    return value, inputs

  (value, inputs), (grad_rest, grad_eps) = jax.value_and_grad(
      loss, argnums=(0, 1), has_aux=True)(rest, eps)
  factors = {
      path: concat([Factors(x.reshape(-1, x.shape[-1]),
                             b.reshape(-1, b.shape[-1]))
                     for x, b in zip(inputs[path], grad_eps[path])])
      for path in layers}
  return value, grad_rest, factors


def materialise(rest: Any, factors: Mapping[Path, Factors]) -> Any:
  """The full gradient tree: ``rest`` with each kernel ``A^T B``."""
  return join_kernels(rest, {path: f.u.T @ f.v for path, f in factors.items()})
