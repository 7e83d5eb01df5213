"""Computations the library replaced by faster ones, kept as the references
the new code is tested against (same numbers up to float rounding).

* :func:`train`: ``local.train`` as it was: every static minibatch of
  ``local.epoch_batches`` computed, the last one padded to ``B`` rows, and a
  minibatch of padding alone computed and its step discarded.
* :func:`personal_objective`: FedOA's personal objective as it was: the
  personal and the anchor model in one ``vmap`` over the stacked pair of
  adapters (the backward pass running through both), so that identical
  adapters gave bitwise identical features. (It computed the loss and the
  distance in float32 also in a float64 run; here, as now, in the
  features' precision, at least float32.)
"""

import jax
import jax.numpy as jnp
import optax

from augfl_jax import models
from augfl_jax.algorithms.fedoa import personal
from augfl_jax.core import local
from augfl_jax.models import lora


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


def personal_objective(model, config, backbone, anchor):
  """FedOA's ``objective(personal, batch)`` before the anchor's features
  left the differentiated path."""
  features_fn = models.make_features_fn(model)
  frozen = jax.lax.stop_gradient(backbone)
  anchor = jax.lax.stop_gradient(anchor)

  def objective(adapter, batch):
    mask = batch["mask"]
    y = jnp.where(mask > 0, batch["y"].astype(jnp.int32), 0)
    both = jax.tree.map(lambda p, a: jnp.stack([p, a]), adapter, anchor)
    h, logits = jax.vmap(lambda a: features_fn(
        lora.merge(frozen, a, config.lora), batch["x"], mask))(both)
    h_p, h_g, logits = h[0], h[1], logits[0]
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    ce = models.masked_mean(optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(dtype), y), mask)
    reg = personal.feature_distance(
        h_p.astype(dtype), jax.lax.stop_gradient(h_g).astype(dtype), mask,
        config)
    return ce + config.lam * reg

  return objective
