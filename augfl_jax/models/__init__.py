"""Flax models and the loss / eval / feature functions built from them.

Every model is a ``flax.linen.Module`` with only a ``"params"`` collection
whose ``__call__(x, mask=None)`` returns ``(features [n, d], logits [n, K])``;
``features`` is the penultimate representation (what CRD distils). ``mask``
(``[n]``, 1 = real example, 0 = padding) zeroes the padded rows and keeps them
out of batch-norm statistics, so padded rows change no real output, loss or
gradient. ``norm="batch"`` always means statistics of the batch at hand (as
the reference runs its ResNets in training mode), also at evaluation.

All functions returned here are pure in ``params`` and safe under
``jax.jit``, ``jax.grad`` and ``jax.vmap`` over a leading client axis.
Where a model is first initialised or applied here, a model that breaks
this contract (returns the logits alone, takes no ``mask=``) is refused
with ``core.checks.ModelContractError`` naming the contract and what the
model did (checked on shapes, at no cost under ``jit``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from augfl_jax.models.authors import (
    AuthorsCNN, authors_cifar_cnn, authors_fmnist_cnn)
from augfl_jax.models.cnn import CNN
from augfl_jax.models.conv import (
    CONV_IMPLS, default_conv_impl, resolve_conv_impl)
from augfl_jax.models.logreg import LogisticRegression
from augfl_jax.models.mlp import MLP
from augfl_jax.models.norm import NORMS, MaskedBatchNorm, masked_moments
from augfl_jax.models.resnet import (
    BasicBlock, ResNet, resnet8, resnet8x4, resnet20, resnet32, resnet32x4)
from augfl_jax.core import checks
from augfl_jax.core.types import Batch, Params, PRNGKey

__all__ = [
    "CNN", "MLP", "LogisticRegression", "ResNet", "BasicBlock", "AuthorsCNN",
    "MaskedBatchNorm", "NORMS", "masked_moments", "model_fields",
    "register_model", "authors_fmnist_cnn", "authors_cifar_cnn",
    "CONV_IMPLS", "default_conv_impl", "resolve_conv_impl",
    "resnet8", "resnet20", "resnet32", "resnet8x4", "resnet32x4",
    "create_model", "available_models", "init_params", "init_batch_stats",
    "num_params",
    "masked_mean", "make_loss_fn", "make_eval_fn", "make_features_fn",
]

_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "cnn": CNN,
    "mlp": MLP,
    "logreg": LogisticRegression,
    "resnet8": resnet8,
    "resnet20": resnet20,
    "resnet32": resnet32,
    "resnet8x4": resnet8x4,
    "resnet32x4": resnet32x4,
    "authors_fmnist_cnn": authors_fmnist_cnn,
    "authors_cifar_cnn": authors_cifar_cnn,
}



def available_models() -> tuple[str, ...]:
  """Names accepted by ``create_model``."""
  return tuple(_REGISTRY)


def register_model(name: str, constructor: Callable[..., nn.Module]
                  ) -> None:
  """Adds a model to :func:`create_model` (a user's, from their own module:
  ``experiments.run --imports=my_module`` imports it first).
  ``constructor(num_classes=K, **fields)`` returns a Flax module whose
  ``__call__(x, mask=None)`` returns ``(features, logits)`` (the module
  docstring); a ``norm`` or ``conv_impl`` field, when it has one, receives
  the run's. The same constructor again changes nothing.

  Raises:
    ValueError: ``name`` is taken by another model.
  """
  if _REGISTRY.get(name, constructor) is not constructor:
    raise ValueError(f"model {name!r} is registered already; choose "
                     "another name")
  _REGISTRY[name] = constructor


def model_fields(name: str) -> frozenset[str]:
  """The fields model ``name`` takes (``norm``, ``conv_impl``, widths...),
  read from the module it builds."""
  module = create_model(name, 2)
  return frozenset(f.name for f in dataclasses.fields(module)) - {
      "parent", "name", "num_classes"}


def create_model(name: str, num_classes: int, **kwargs: Any) -> nn.Module:
  """Builds the model called ``name``.

  Args:
    name: one of ``available_models()``.
    num_classes: number of classes K (size of the logits).
    **kwargs: model fields, e.g. ``norm="group"`` or ``widths=(16, 32)``.

  Returns:
    An unbound ``nn.Module``.

  Raises:
    ValueError: unknown name or ``num_classes < 1``.
  """
  if name not in _REGISTRY:
    raise ValueError(
        f"Unknown model {name!r}; available models: "
        f"{', '.join(available_models())}.")
  if num_classes < 1:
    raise ValueError(f"num_classes must be >= 1, got {num_classes}.")
  return _REGISTRY[name](num_classes=num_classes, **kwargs)


def init_params(
    model: nn.Module, key: PRNGKey, input_shape: tuple[int, ...]) -> Params:
  """Initialises the parameters of ``model``.

  Args:
    model: a model from this package.
    key: PRNG key.
    input_shape: the shape of ONE example, e.g. ``(28, 28, 1)``; the model
      is initialised on a zero batch of 2 such examples.

  Returns:
    ``variables["params"]`` (a batch-norm model's running statistics, which
    only PM pretraining keeps, come from :func:`init_batch_stats`).

  Raises:
    ValueError: if the model created collections other than ``"params"``
      and ``"batch_stats"``.
  """
  variables = _init(model, key, input_shape)
  return variables["params"]


def _init(model: nn.Module, key: PRNGKey, input_shape: tuple[int, ...]):
  """The variables of ``model`` on a zero batch of 2 (of all examples),
  its output checked against the contract (module docstring)."""
  x = jnp.zeros((2,) + tuple(input_shape), jnp.float32)
  out, variables = _call(model.init_with_output, model, key, x,
                         jnp.ones((2,), jnp.float32))
  checks.check_model_output(out, type(model).__name__, 2)
  extra = set(variables) - {"params", "batch_stats"}
  if extra:
    raise ValueError("Models must only have 'params' and 'batch_stats' "
                     f"collections; found {sorted(extra)}.")
  return variables


def init_batch_stats(model: nn.Module, input_shape: tuple[int, ...]
                    ) -> Params:
  """The initial running statistics of ``model``'s batch-norm layers
  (``mean`` 0, ``var`` 1; ``{}`` for a model without batch norm)."""
  return _init(model, jax.random.key(0), input_shape).get("batch_stats", {})


def _call(method: Callable[..., Any], model: nn.Module, first: Any,
          x: jax.Array, mask: jax.Array | None, **kwargs: Any) -> Any:
  """``method(first, x, mask=mask, **kwargs)`` (``model.init_with_output``
  or ``model.apply``); a model that takes no ``mask=`` is a
  ``ModelContractError``."""
  try:
    return method(first, x, mask=mask, **kwargs)
  except TypeError as e:
    error = checks.model_without_mask(e, type(model).__name__)
    if error is None:
      raise
    raise error from None


def _apply(model: nn.Module, params: Params, x: jax.Array,
           mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """``model.apply({"params": params}, x, mask=mask)``, its output checked
  against the contract (module docstring)."""
  out = _call(model.apply, model, {"params": params}, x, mask)
  checks.check_model_output(out, type(model).__name__, x.shape[0])
  return out


def num_params(params: Params) -> int:
  """Total number of scalars in ``params``."""
  return sum(math.prod(p.shape) for p in jax.tree_util.tree_leaves(params))


def masked_mean(values: jax.Array, mask: jax.Array | None) -> jax.Array:
  """``sum_j mask_j v_j / max(sum_j mask_j, 1)`` over ``[n]`` values.

  Padded entries are removed with ``jnp.where``, so a NaN/inf there cannot
  leak into the result or its gradient.
  """
  if mask is None:
    return jnp.mean(values)
  mask = mask.astype(values.dtype)
  total = jnp.sum(jnp.where(mask > 0, mask * values, 0.0))
  return total / jnp.maximum(jnp.sum(mask), 1.0)


def _labels_and_mask(batch: Batch) -> tuple[jax.Array, jax.Array | None]:
  mask = batch.get("mask")
  y = batch["y"].astype(jnp.int32)
  if mask is not None:
    y = jnp.where(mask > 0, y, 0)  # padded labels may be anything (e.g. -1)
  return y, mask


def make_features_fn(
    model: nn.Module,
) -> Callable[[Params, jax.Array, jax.Array | None],
              tuple[jax.Array, jax.Array]]:
  """``features_fn(params, x [n, ...], mask [n] | None) -> (features, logits)``.

  ``features`` is ``[n, d]`` (penultimate), ``logits`` ``[n, K]``.
  """

  def features_fn(params: Params, x: jax.Array,
                  mask: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    return _apply(model, params, x, mask)

  return features_fn


def make_loss_fn(model: nn.Module) -> Callable[[Params, Batch], jax.Array]:
  """``loss_fn(params, batch) -> scalar``: masked mean softmax cross-entropy.

  ``sum_j mask_j CE(logits_j, y_j) / max(sum_j mask_j, 1)`` where the logits
  come from ``model.apply({"params": params}, batch["x"],
  mask=batch["mask"])``.

  Without ``"mask"`` EVERY row counts as a real example: the loss is the
  plain mean over all rows, padding included, and normalisation layers
  take their statistics over every row. Pass a padded batch with its mask
  (``augfl_jax.data.pad_stack`` makes both).

  Labels must lie in ``[0, K)`` for the model's ``K`` classes. They are not
  checked here (the function runs under jit): an out-of-range label gives a
  NaN or a finite, meaningless loss. ``augfl_jax.data.build_federated`` and
  ``pad_stack(..., num_classes=K)`` check them where the data are built.
  """

  def loss_fn(params: Params, batch: Batch) -> jax.Array:
    y, mask = _labels_and_mask(batch)
    _, logits = _apply(model, params, batch["x"], mask)
    # at least float32 (16-bit logits upcast), float64 kept
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), y)
    return masked_mean(ce, mask)

  return loss_fn


def make_eval_fn(
    model: nn.Module,
) -> Callable[[Params, Batch], tuple[jax.Array, jax.Array]]:
  """``eval_fn(params, batch) -> (loss, correct)``, float32 scalars.

  ``loss`` is the masked mean cross-entropy (as ``make_loss_fn``), ``correct``
  the number of real examples whose argmax logit equals the label (divide by
  ``sum(mask)`` for the accuracy). Without ``"mask"`` every row counts, and
  labels must lie in ``[0, K)`` (both as ``make_loss_fn``).
  """

  def eval_fn(params: Params, batch: Batch) -> tuple[jax.Array, jax.Array]:
    y, mask = _labels_and_mask(batch)
    _, logits = _apply(model, params, batch["x"], mask)
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    hit = (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)
    if mask is not None:
      hit = jnp.where(mask > 0, hit, 0.0)
    return masked_mean(ce, mask), jnp.sum(hit)

  return eval_fn
