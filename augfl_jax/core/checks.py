"""Input checks that every round shares: a value known now (not traced),
a loss that can run on the clients' examples, and the first leaves of a
tree, named in a message. Each check fails with one sentence that says
what to pass instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from augfl_jax.core.types import Params

__all__ = ["check_loss_runs", "concrete", "first_leaves"]


def concrete(value) -> float | None:
  """``value`` as a float when it is known now (not traced), else None."""
  if isinstance(value, jax.core.Tracer):
    return None
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


def first_leaves(tree: Params) -> str:
  """The paths, shapes and dtypes of ``tree``'s first three leaves."""
  return ", ".join(
      f"{jax.tree_util.keystr(path)} {jnp.shape(leaf)} "
      f"{jnp.result_type(leaf)}"
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0][:3])


def check_loss_runs(loss_fn, params: Params, batch, what: str) -> None:
  """Raises ``ValueError`` in the library's words when ``loss_fn(params,
  batch)`` cannot be traced (examples of another shape than the model was
  initialised for, parameters of another model); shapes only, nothing is
  computed."""
  try:
    jax.eval_shape(loss_fn, params, batch)
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    shape = jnp.shape(batch["x"]) if "x" in batch else "?"
    raise ValueError(
        f"the loss cannot run on {what} (examples x of shape {shape}) with "
        f"these parameters ({type(e).__name__}: {reason}); the examples "
        "must have the shape the model was initialised for, and the "
        "parameters must be that model's") from None
