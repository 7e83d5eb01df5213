"""Computations the library replaced by faster ones, kept as the references
the new code is tested against (same numbers up to float rounding).

* :func:`train`: ``local.train`` as it was: every static minibatch of
  ``local.epoch_batches`` computed, the last one padded to ``B`` rows, and a
  minibatch of padding alone computed and its step discarded.
"""

import jax
import jax.numpy as jnp

from augfl_jax.core import local


def train(loss_fn, tx, params, data, key, *, epochs, batch_size,
          has_aux=False, keyed=False):
  """``local.train`` before minibatches of padding alone were skipped and
  the last minibatch lost its padding rows."""

  def objective(p, batch, step_key):
    out = loss_fn(p, batch, step_key) if keyed else loss_fn(p, batch)
    return out if has_aux else (out, out)

  def one_step(carry, inputs):
    params, opt_state, loss_sum, count = carry
    minibatch, step_key = inputs
    new_params, new_opt_state, loss = local.step(
        objective, tx, params, opt_state, minibatch, step_key)
    real = jnp.sum(minibatch["mask"])
    keep = lambda new, old: jax.tree.map(
        lambda a, b: jnp.where(real > 0, a, b), new, old)
    return (keep(new_params, params), keep(new_opt_state, opt_state),
            loss_sum + loss * real, count + real), None

  def epoch(carry, epoch_key):
    if keyed:
      shuffle_key, steps_key = jax.random.split(epoch_key)
      batches = local.epoch_batches(shuffle_key, data, batch_size)
      step_keys = jax.random.split(steps_key, batches["mask"].shape[0])
    else:
      batches = local.epoch_batches(epoch_key, data, batch_size)
      step_keys = None
    carry, _ = jax.lax.scan(one_step, carry, (batches, step_keys))
    return carry, None

  init = (params, tx.init(params), jnp.zeros(()), jnp.zeros(()))
  (params, _, loss_sum, count), _ = jax.lax.scan(
      epoch, init, jax.random.split(key, epochs))
  return params, loss_sum / jnp.maximum(count, 1.0)

