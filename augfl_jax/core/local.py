"""Local training on one client's padded data: minibatches and the one
minibatch-epoch loop of the library (``train``, any optax optimizer).

A client's data is a ``Batch`` of ``[n, ...]`` leaves of which ``mask.sum()``
rows are real. Minibatches are drawn from the real rows only: a permutation
puts the real rows first, in random order, so an epoch of ``ceil(n / B)``
static steps makes ``ceil(n_real / B)`` real steps and the rest are no-ops
(an all-padding minibatch has zero loss and zero gradient). This matches a
PyTorch ``DataLoader(shuffle=True, drop_last=False)`` over the real examples
while keeping every shape static.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from augfl_jax.core.types import Batch, Params, PRNGKey

__all__ = [
    "concat_batches", "epoch_batches", "epoch_split", "pad_batch",
    "real_first_permutation", "sample_batch", "sgd", "step", "train"
]


def concat_batches(a: Batch, b: Batch) -> Batch:
  """Concatenates two batches along the example axis (e.g. support + query)."""
  return jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=0), a, b)


def real_first_permutation(key: PRNGKey, mask: jax.Array) -> jax.Array:
  """``[n]`` indices: the real rows (``mask > 0``) in random order, then
  padding."""
  scores = jax.random.uniform(key, mask.shape) + 2.0 * (mask <= 0)
  return jnp.argsort(scores)


def sample_batch(key: PRNGKey, batch: Batch, batch_size: int) -> Batch:
  """``batch_size`` real rows drawn without replacement (padded if too few)."""
  n = batch["mask"].shape[0]
  order = real_first_permutation(key, batch["mask"])
  if batch_size > n:
    batch = pad_batch(batch, batch_size)
    order = jnp.concatenate([order, jnp.arange(n, batch_size)])
  return jax.tree.map(lambda leaf: leaf[order[:batch_size]], batch)


def pad_batch(batch: Batch, size: int) -> Batch:
  """Appends padding rows (zeros, mask 0) up to ``size`` rows."""
  extra = size - batch["mask"].shape[0]
  return jax.tree.map(
      lambda leaf: jnp.concatenate(
          [leaf, jnp.zeros((extra,) + leaf.shape[1:], leaf.dtype)]), batch)


def epoch_batches(key: PRNGKey, batch: Batch, batch_size: int) -> Batch:
  """One shuffled epoch as ``[steps, B, ...]`` leaves, real rows first.

  ``B = min(batch_size, n)`` for ``n`` rows (real and padding): a batch
  size beyond the data is one full batch of its ``n`` rows, not ``n`` rows
  padded to ``batch_size`` (the same masked loss, without the padding's
  work).
  """
  full, tail = epoch_split(key, batch, batch_size)
  if tail is None:
    return full
  last = pad_batch(tail, full["mask"].shape[1])
  return jax.tree.map(lambda f, t: jnp.concatenate([f, t[None]]), full, last)


def epoch_split(key: PRNGKey, batch: Batch, batch_size: int
               ) -> tuple[Batch, Batch | None]:
  """One shuffled epoch (real rows first, in random order) as its ``n //
  B`` full minibatches (``[n // B, B, ...]`` leaves) and the last ``n % B``
  rows (``[n % B, ...]``; None when ``B`` divides ``n``), with ``B =
  min(batch_size, n)``: :func:`epoch_batches`' minibatches, the last one
  without the padding rows it appends to fill it (no real example, so the
  same masked loss and gradient, without their work).
  """
  n = batch["mask"].shape[0]
  batch_size = min(batch_size, n)
  steps, rest = divmod(n, batch_size)
  order = real_first_permutation(key, batch["mask"])
  shuffled = jax.tree.map(lambda leaf: leaf[order], batch)
  full = jax.tree.map(
      lambda leaf: leaf[:steps * batch_size].reshape(
          (steps, batch_size) + leaf.shape[1:]), shuffled)
  if not rest:
    return full, None
  return full, jax.tree.map(lambda leaf: leaf[steps * batch_size:], shuffled)


def sgd(lr: float, momentum: float = 0.0) -> optax.GradientTransformation:
  """``torch.optim.SGD(lr, momentum)`` (no dampening, no Nesterov):
  ``optax.sgd(lr)`` for ``momentum == 0`` (no buffer), else
  ``optax.sgd(lr, momentum)``: ``buf <- momentum buf + g; w <- w - lr buf``."""
  return optax.sgd(lr, momentum=momentum if momentum > 0 else None)


def step(loss_fn: Callable[..., tuple[jax.Array, Any]],
         tx: optax.GradientTransformation, params: Params,
         opt_state: optax.OptState, batch: Batch, *args: Any
        ) -> tuple[Params, optax.OptState, Any]:
  """One step of ``tx`` on ``loss_fn(params, batch, *args) -> (objective,
  aux)``: ``g = grad objective``, ``(u, opt_state) = tx.update(g, opt_state,
  params)``, ``params + u``.

  Returns:
    ``(params, opt_state, aux)``.
  """
  (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, batch, *args)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, aux


def train(loss_fn: Callable[..., Any], tx: optax.GradientTransformation,
          params: Params, data: Batch, key: PRNGKey, *, epochs: int,
          batch_size: int, has_aux: bool = False, keyed: bool = False
         ) -> tuple[Params, jax.Array]:
  """``epochs`` shuffled minibatch epochs of ``tx`` on one client's data.

  Each epoch is :func:`epoch_batches` (``ceil(n / B)`` static steps, real
  rows first, no ``drop_last``), its last minibatch without the rows that
  pad it to ``B`` (:func:`epoch_split`); a minibatch without a real example
  leaves the parameters AND the optimizer state as they are (so momentum
  never moves the model on padding), and is not computed (under ``vmap``
  it is, and its step discarded). The optimizer state starts fresh, as a
  ``torch.optim`` optimizer built for the round.

  Args:
    loss_fn: ``loss_fn(params, batch) -> scalar`` masked mean on a
      ``[B, ...]`` minibatch; ``keyed``: ``loss_fn(params, batch, key)``
      with a fresh key per step; ``has_aux``: returns ``(objective,
      reported)``, the objective differentiated and the reported loss
      averaged (e.g. FedBC's Lagrangian and its task loss).
    tx: the optimizer, e.g. :func:`sgd`.
    params: the starting parameters.
    data: the client's ``Batch`` (``[n, ...]`` leaves).
    key: one key per epoch is split from it; the epoch's key shuffles, or
      with ``keyed`` is split into a shuffle key and the steps' keys.
    epochs, batch_size: E and B.

  Returns:
    ``(params, mean_loss)``, the reported loss averaged over the real
    examples seen.
  """

  def objective(p, batch, step_key):
    out = loss_fn(p, batch, step_key) if keyed else loss_fn(p, batch)
    return out if has_aux else (out, out)

  def real_step(carry, minibatch, step_key, real):
    params, opt_state, loss_sum, count = carry
    params, opt_state, loss = step(objective, tx, params, opt_state,
                                   minibatch, step_key)
    return params, opt_state, loss_sum + loss * real, count + real

  def one_step(carry, inputs):
    minibatch, step_key = inputs
    real = jnp.sum(minibatch["mask"])
    return jax.lax.cond(real > 0, real_step, lambda c, *_: c, carry,
                        minibatch, step_key, real), None

  def epoch(carry, epoch_key):
    shuffle_key, steps_key = (jax.random.split(epoch_key) if keyed
                              else (epoch_key, None))
    full, tail = epoch_split(shuffle_key, data, batch_size)
    steps = full["mask"].shape[0]
    step_keys = (None if not keyed else jax.random.split(
        steps_key, steps + (tail is not None)))
    carry, _ = jax.lax.scan(one_step, carry, (
        full, None if step_keys is None else step_keys[:steps]))
    if tail is not None:
      carry, _ = one_step(carry, (
          tail, None if step_keys is None else step_keys[steps]))
    return carry, None

  init = (params, tx.init(params), jnp.zeros(()), jnp.zeros(()))
  (params, _, loss_sum, count), _ = jax.lax.scan(
      epoch, init, jax.random.split(key, epochs))
  return params, loss_sum / jnp.maximum(count, 1.0)
