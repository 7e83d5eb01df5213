"""Input checks that every round shares: a value known now (not traced),
a loss that can run on the clients' examples, a model's output against the
library's contract (:data:`MODEL_CONTRACT`), and the first leaves of a
tree, named in a message. Each check fails with one sentence that says
what to pass instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from augfl_jax.core.types import Params

__all__ = ["MODEL_CONTRACT", "ModelContractError", "check_loss_runs",
           "check_model_output", "concrete", "describe_value",
           "first_leaves", "model_without_mask"]

# What every client model (and PM) of the library is (augfl_jax.models).
MODEL_CONTRACT = ("a client model returns (features [n, d], logits [n, K]) "
                  "from __call__(x, mask=None) and takes mask= (1 = a real "
                  "example, 0 = padding)")


class ModelContractError(ValueError):
  """A model whose ``__call__`` breaks :data:`MODEL_CONTRACT`."""


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


def describe_value(value) -> str:
  """``float32[]``, ``int32[16]``, ``a tuple of 3 (float32[], ...)``."""
  if isinstance(value, (tuple, list)):
    kind = "a tuple" if isinstance(value, tuple) else "a list"
    return (f"{kind} of {len(value)} "
            f"({', '.join(map(describe_value, value))})")
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return f"{value.dtype}[{','.join(str(d) for d in value.shape)}]"
  return type(value).__name__


def check_model_output(out, name: str, n: int | None = None) -> None:
  """Raises :class:`ModelContractError` naming the model ``name`` and what it
  returned unless ``out`` is ``(features [n, d], logits [n, K])`` (``n``:
  the examples it was given, when known); shapes only, so it costs
  nothing under ``jit``."""
  ok = (isinstance(out, (tuple, list)) and len(out) == 2
        and all(hasattr(v, "shape") and len(v.shape) == 2 for v in out)
        and out[0].shape[0] == out[1].shape[0]
        and (n is None or out[1].shape[0] == n))
  if not ok:
    raise ModelContractError(f"{MODEL_CONTRACT}; {name} returned "
                             f"{describe_value(out)}")


def model_without_mask(error: TypeError, name: str
                      ) -> ModelContractError | None:
  """The :class:`ModelContractError` for the model ``name`` whose call with
  ``mask=`` raised ``error``, when ``error`` says it takes no ``mask``;
  ``None`` for another ``TypeError``."""
  text = str(error).strip().splitlines()[0] if str(error).strip() else ""
  if "mask" not in text:
    return None
  return ModelContractError(f"{MODEL_CONTRACT}; {name} takes no mask= "
                            f"(TypeError: {text[:200]})")


def check_loss_runs(loss_fn, params: Params, batch, what: str) -> None:
  """Raises ``ValueError`` in the library's words when ``loss_fn(params,
  batch)`` cannot be traced (examples of another shape than the model was
  initialised for, parameters of another model; a model that breaks its
  contract: :class:`ModelContractError`, as it is); shapes only, nothing is
  computed."""
  try:
    jax.eval_shape(loss_fn, params, batch)
  except ModelContractError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    shape = jnp.shape(batch["x"]) if "x" in batch else "?"
    raise ValueError(
        f"the loss cannot run on {what} (examples x of shape {shape}) with "
        f"these parameters ({type(e).__name__}: {reason}); the examples "
        "must have the shape the model was initialised for, and the "
        "parameters must be that model's") from None
