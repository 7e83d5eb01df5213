"""AugFL's round with the dense layers' per-client quantities as factors.

The same arithmetic as ``round.make_round`` in another order (full
participation, finite-difference HVP). For a dense kernel each client's
``g_s``, ``r`` and the two finite-difference gradients are ``A^T B``
(``augfl_jax.core.dense_factors``), so

* ``phi = theta - alpha A_s^T B_s`` and ``theta +- delta A_q^T B_q`` are
  applied to inputs as low-rank corrections of the shared kernel;
* ``d_i = r_i - alpha g_i`` is ``U_i^T V_i`` with ``U_i = [A_q; A_+; A_-]``
  and ``V_i = [B_q; -alpha/(2 delta) B_+; alpha/(2 delta) B_-]``;
* after step 5 ``y_i = -w_i d_i`` (SPEC §2), stored as those factors;
* Eq. (13) with every client taking part: ``theta^{t+1} = theta^t -
  [sum_i (y_i^prev + 2 w_i d_i) + lam grad R_h] / sum_i rho_i``, the dense
  sums one matmul of the stacked factors.

Partial participation: a client j that does not take part enters Eq. (13)
with ``s_j = y_j + rho theta_j = rho theta^{t_j} - y_j^prev + 2 y_j``,
where ``theta^{t_j}`` is the global model of the round it last took part
in: one dense tree per client, which no factor replaces. A state made with
``init_state(..., partial=True)`` keeps ``terms`` (the ``s_j``, ``[C, ...]``)
and the server sums them; without it only full participation is allowed.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from augfl_jax.algorithms.augfl import round as augfl_round
from augfl_jax.core import client_axis as clients_lib
from augfl_jax.core import dense_factors as df
from augfl_jax.core import tree

__all__ = ["FactoredState", "init_state", "make_round"]


@flax.struct.dataclass
class FactoredState:
  """``params``; the duals' other leaves ``[C, ...]`` and dense factors
  ``{path: Factors([C, r, d_in], [C, r, d_out])}``; ``client_rounds``;
  ``terms``: None (full participation only) or each client's ``y_j + rho
  theta_j``, ``[C, ...]`` like ``params``."""

  params: Any
  dual_rest: Any
  dual_factors: Any
  client_rounds: jax.Array
  round: jax.Array
  terms: Any = None


def init_state(loss_fn, params, clients, rho: float = 0.0,
               partial: bool = False) -> FactoredState:
  one = jax.tree.map(lambda a: a[0], clients.support)
  one_q = jax.tree.map(lambda a: a[0], clients.query)
  layers = df.dense_kernels(loss_fn, params, one)
  layers_q = df.dense_kernels(loss_fn, params, one_q)
  rest, kernels = df._split(params, layers)  # pylint: disable=protected-access
  num = clients.num_examples.shape[0]
  count = lambda shapes: sum(math.prod(s.shape[:-1]) for s in shapes)
  rows = {p: count(layers_q[p]) + 2 * count(layers[p]) for p in layers}
  factors = {p: df.Factors(
      jnp.zeros((num, rows[p], k.shape[0]), k.dtype),
      jnp.zeros((num, rows[p], k.shape[1]), k.dtype))
             for p, k in kernels.items()}
  return FactoredState(
      params=params,
      dual_rest=jax.tree.map(lambda a: jnp.zeros((num,) + a.shape, a.dtype),
                             rest),
      dual_factors=factors,
      client_rounds=jnp.zeros((num,), jnp.int32),
      round=jnp.zeros((), jnp.int32),
      terms=(tree.broadcast_to_clients(optax.tree.scale(rho, params), num)
             if partial else None))


def client_direction(loss_fn, layers, layers_q, theta, support, query, *,
                     alpha, delta):
  """``d = r - alpha g`` of one client: (other leaves, dense factors) and
  the losses."""
  theta_rest, kernels = df._split(theta, layers)  # pylint: disable=protected-access
  at = lambda rest: df._join(rest, kernels)  # pylint: disable=protected-access
  support_loss, gs_rest, gs_f = df.value_and_grad(
      loss_fn, theta, support, layers=layers)
  phi_rest = optax.tree.add_scale(theta_rest, -alpha, gs_rest)
  query_loss, r_rest, r_f = df.value_and_grad(
      loss_fn, at(phi_rest), query,
      corrections={p: f.scale(-alpha) for p, f in gs_f.items()},
      layers=layers_q)
  _, gp_rest, gp_f = df.value_and_grad(
      loss_fn, at(optax.tree.add_scale(theta_rest, delta, r_rest)), support,
      corrections={p: f.scale(delta) for p, f in r_f.items()}, layers=layers)
  _, gm_rest, gm_f = df.value_and_grad(
      loss_fn, at(optax.tree.add_scale(theta_rest, -delta, r_rest)), support,
      corrections={p: f.scale(-delta) for p, f in r_f.items()},
      layers=layers)
  g_rest = optax.tree.scale(0.5 / delta, optax.tree.sub(gp_rest, gm_rest))
  d_rest = optax.tree.add_scale(r_rest, -alpha, g_rest)
  c = alpha * 0.5 / delta
  d_f = {p: df._concat([r_f[p], gp_f[p].scale(-c), gm_f[p].scale(c)])  # pylint: disable=protected-access
         for p in r_f}
  return d_rest, d_f, query_loss, support_loss


def _dense_duals(rest, factors):
  """The duals as full trees ``[K, ...]``."""
  return df._join(rest, {p: jnp.einsum("cri,cro->cio", f.u, f.v)  # pylint: disable=protected-access
                         for p, f in factors.items()})


def make_round(loss_fn, config: augfl_round.AugFLConfig, strategy=None):
  strategy = clients_lib.as_strategy(strategy)

  def round_fn(state: FactoredState, clients, reg_grad=None,
               participants=None):
    if participants is not None and state.terms is None:
      raise ValueError("partial participation needs a state made with "
                       "init_state(..., partial=True)")
    select, merge = tree.client_subset(participants)
    num = clients.num_examples.shape[0]
    support, query = select(clients.support), select(clients.query)
    layers = df.dense_kernels(loss_fn, state.params,
                              jax.tree.map(lambda a: a[0], support))
    layers_q = df.dense_kernels(loss_fn, state.params,
                                jax.tree.map(lambda a: a[0], query))
    weights = select(augfl_round.client_weights(clients.num_examples,
                                                config.uniform_weights))
    rounds = select(state.client_rounds) + 1
    dtype = jnp.result_type(*jax.tree.leaves(state.params))
    deltas = augfl_round.delta_schedule(rounds.astype(dtype), config)

    def one_client(c):
      return client_direction(loss_fn, layers, layers_q, state.params,
                              c["support"], c["query"], alpha=config.alpha,
                              delta=c["delta"])

    d_rest, d_f, query_loss, support_loss = clients_lib.map_clients(
        one_client, dict(support=support, query=query, delta=deltas),
        strategy)
    w = weights.astype(dtype)
    scale = lambda t, s: jax.tree.map(
        lambda a: a * s.reshape((-1,) + (1,) * (a.ndim - 1)), t)
    old_rest, old_f = select(state.dual_rest), select(state.dual_factors)
    new_rest = scale(d_rest, -w)
    new_f = {p: df.Factors(f.u, scale(f.v, -w)) for p, f in d_f.items()}
    if state.terms is None:
      # sum_i (y_i^prev + 2 w_i d_i) = sum_i (y_i^prev - 2 y_i), then
      # theta^{t+1} = theta^t - [that + lam grad R_h] / (C rho)
      total_rest = jax.tree.map(
          lambda y, d: jnp.tensordot(jnp.ones((num,), dtype), y, 1) +
          jnp.tensordot(2 * w, d, 1), old_rest, d_rest)
      total_k = {}
      for p, f in d_f.items():
        u = jnp.concatenate([old_f[p].u, f.u], axis=1)
        v = jnp.concatenate([old_f[p].v, scale(f.v, 2 * w)], axis=1)
        total_k[p] = jnp.einsum("cri,cro->io", u, v)
      total = df._join(total_rest, total_k)  # pylint: disable=protected-access
      if reg_grad is not None:
        total = optax.tree.add_scale(total, config.lam, reg_grad)
      params = optax.tree.add_scale(state.params,
                                    -1.0 / (num * config.rho), total)
      terms = None
    else:
      # s_i = rho theta^t - y_i^prev + 2 y_i for the participants
      fresh = jax.tree.map(
          lambda theta, y_old, y_new: config.rho * theta - y_old + 2 * y_new,
          state.params, _dense_duals(old_rest, old_f),
          _dense_duals(new_rest, new_f))
      terms = merge(state.terms, fresh)
      total = tree.weighted_sum(terms, jnp.ones((num,), dtype))
      if reg_grad is not None:
        total = optax.tree.add_scale(total, -config.lam, reg_grad)
      params = optax.tree.scale(1.0 / (num * config.rho), total)
    new_state = FactoredState(
        params=params,
        dual_rest=merge(state.dual_rest, new_rest),
        dual_factors=merge(state.dual_factors, new_f),
        client_rounds=merge(state.client_rounds, rounds),
        round=state.round + 1, terms=terms)
    return new_state, {"loss": jnp.sum(w * query_loss) / jnp.sum(w),
                       "support_loss": jnp.sum(w * support_loss) / jnp.sum(w)}

  return jax.jit(round_fn)
