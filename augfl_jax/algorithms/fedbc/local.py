"""FedBC's and Per-FedBC's local training on the Lagrangian (8),
``L_i(z, w, lambda_i) = f_i(w) + lambda_i (||w - z||^2 - gamma_i)``, and
one client's update (``client_update``: local training, then the dual step
``dual_update``); the round and the server are in ``fedbc``.

Local training (public code ``LocalUpdate.train``): ``local_epochs`` epochs of
minibatch SGD (``batch_size``, optional heavy-ball ``momentum`` as
``torch.optim.SGD``, 0.5 in the public code, 0 by default here so FedBC with
constant lambda is exactly FedProx) on D_i = D_i^s ∪ D_i^q, by
``augfl_jax.core.local.train``.

Per-FedBC (``personalized=True``, Algorithm 3, App. D.4, public code
``train_MAML``): first-order MAML on the Lagrangian. Each outer step draws
``inner_steps + 1`` minibatches; J inner steps
``w_{j+1} = w_j - alpha (grad f(w_j) + 2 lambda^t (w_j - z^t))``, then
``w <- w - beta grad f(w_J)`` (no penalty in the outer gradient, no
second-order term). A client makes ``local_epochs * ceil(|D_i| / batch_size)``
outer steps, as the public code does (static shapes: the padded maximum, the
surplus steps are no-ops). Dual update and aggregation are FedBC's. Minibatches
are drawn independently per step (``augfl_jax.core.local.sample_batch``)
instead of
from a cycling DataLoader.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from augfl_jax.algorithms.fedbc.config import FedBCConfig
from augfl_jax.core import local
from augfl_jax.core.types import Batch, ClientData, LossFn, Params, PRNGKey

__all__ = [
    "client_update", "dual_update", "lagrangian", "lagrangian_sgd",
    "per_fedbc_local", "per_fedbc_step", "squared_distance"
]


def squared_distance(a: Params, b: Params) -> jax.Array:
  """``||a - b||^2`` summed over every leaf (scalar)."""
  return sum(jnp.sum(jnp.square(x - y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def lagrangian(loss_fn: LossFn, w: Params, batch: Batch, z: Params,
               lam: jax.Array, gamma: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(L_i(z, w, lam), f_i(w))``: Eq. (8)'s client term on ``batch``."""
  f = loss_fn(w, batch)
  return f + lam * (squared_distance(w, z) - gamma), f


def _keep_if(cond: jax.Array, new: Params, old: Params) -> Params:
  return jax.tree.map(lambda n, o: jnp.where(cond, n, o), new, old)


def lagrangian_sgd(loss_fn: LossFn, w: Params, data: Batch, key: PRNGKey, *,
                   z: Params, lam: jax.Array, gamma: jax.Array,
                   config: FedBCConfig) -> tuple[Params, jax.Array]:
  """Algorithm 2 with SGD: E epochs of minibatch SGD on ``L_i(z, ., lam)``.

  ``w <- w - lr (g + 2 lam (w - z))`` per minibatch (with momentum
  ``buf <- m buf + grad; w <- w - lr buf`` when ``config.momentum > 0``),
  by ``local.train``: a minibatch without a real example changes nothing
  (the penalty would otherwise act on it).

  Returns:
    ``(w, mean task loss f_i)`` over the real examples seen.
  """
  return local.train(
      lambda p, b: lagrangian(loss_fn, p, b, z, lam, gamma),
      local.sgd(config.lr, config.momentum), w, data, key,
      epochs=config.local_epochs, batch_size=config.batch_size,
      has_aux=True)


def per_fedbc_step(loss_fn: LossFn, w: Params, batches: Batch, *, z: Params,
                   lam: jax.Array, gamma: jax.Array, config: FedBCConfig
                  ) -> tuple[Params, jax.Array]:
  """One outer step of Algorithm 3 (lines 7-11), first order.

  Args:
    batches: ``inner_steps + 1`` minibatches stacked (leaves ``[J + 1, B,
      ...]``): J for the inner steps, the last for the outer gradient.

  Returns:
    ``(w - beta grad f(w_J, D_J), f(w_J, D_J))`` with
    ``w_{j+1} = w_j - alpha grad_w L_i(z, w_j, lam)`` on minibatch j.
  """
  inner = jax.tree.map(lambda leaf: leaf[:-1], batches)
  outer = jax.tree.map(lambda leaf: leaf[-1], batches)

  def inner_step(v, minibatch):
    grads = jax.grad(lambda p: lagrangian(loss_fn, p, minibatch, z, lam,
                                          gamma)[0])(v)
    return optax.tree.add_scale(v, -config.alpha, grads), None

  adapted, _ = jax.lax.scan(inner_step, w, inner)
  f, grads = jax.value_and_grad(loss_fn)(adapted, outer)
  return optax.tree.add_scale(w, -config.beta, grads), f


def per_fedbc_local(loss_fn: LossFn, w: Params, data: Batch, key: PRNGKey, *,
                    z: Params, lam: jax.Array, gamma: jax.Array,
                    config: FedBCConfig) -> tuple[Params, jax.Array]:
  """``local_epochs * ceil(|D_i| / B)`` Per-FedBC outer steps on one client.

  Returns:
    ``(w, mean outer loss)``.
  """
  bs = config.batch_size
  per_epoch = -(-data["mask"].shape[0] // bs)
  active = config.local_epochs * jnp.ceil(jnp.sum(data["mask"]) / bs)

  def step(w, xs):
    index, step_key = xs
    keys = jax.random.split(step_key, config.inner_steps + 1)
    batches = jax.vmap(lambda k: local.sample_batch(k, data, bs))(keys)
    new_w, f = per_fedbc_step(loss_fn, w, batches, z=z, lam=lam, gamma=gamma,
                              config=config)
    on = index < active
    return _keep_if(on, new_w, w), f * on

  num = config.local_epochs * per_epoch
  w, losses = jax.lax.scan(step, w,
                           (jnp.arange(num), jax.random.split(key, num)))
  return w, jnp.sum(losses) / jnp.maximum(active, 1.0)


def dual_update(sq_dist: jax.Array, lam: jax.Array, gamma: jax.Array,
                config: FedBCConfig) -> tuple[jax.Array, jax.Array]:
  """Eq. (11) and the tolerance step, both from the OLD (lam, gamma).

  ``lam' = clip(lam + lr_lambda (sq_dist - gamma), 0, lambda_max)``,
  ``gamma' = gamma + lr_gamma lam``; ``sq_dist = ||x_i^{t+1} - z^t||^2``.
  """
  new_lam = jnp.clip(lam + config.lr_lambda * (sq_dist - gamma), 0.0,
                     config.lambda_max)
  return new_lam, gamma + config.lr_gamma * lam


def client_update(loss_fn: LossFn, config: FedBCConfig, z: Params,
                  x: Params, lam: jax.Array, gamma: jax.Array,
                  client: ClientData, key: PRNGKey):
  """One client's primal and dual updates (Algorithm 1 lines 7-8).

  Args:
    z: the global model z^t. x: the client's last local model x_i^t (used
      only with ``start_from="x"``). lam, gamma: scalars lambda_i^t, gamma_i^t.
    client: ONE client's data; it trains on support ∪ query.

  Returns:
    ``(x_i^{t+1}, lambda_i^{t+1}, gamma_i^{t+1}, loss, ||x_i^{t+1} - z^t||^2)``.
  """
  data = local.concat_batches(client.support, client.query)
  start = x if config.start_from == "x" else z
  train = (per_fedbc_local if config.personalized else
           lagrangian_sgd)
  new_x, loss = train(loss_fn, start, data, key, z=z, lam=lam, gamma=gamma,
                      config=config)
  sq_dist = squared_distance(new_x, z)
  new_lam, new_gamma = dual_update(sq_dist, lam, gamma, config)
  return new_x, new_lam, new_gamma, loss, sq_dist
