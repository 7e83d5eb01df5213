"""AugFL's round with the dense layers' per-client quantities as factors.

The same arithmetic as ``admm.make_round`` in another order (finite-
difference HVP). For a dense kernel each client's ``g_s``, ``r`` and the
two finite-difference gradients are ``A^T B`` (``augfl_jax.core.
dense_factors``), so

* ``phi = theta - alpha A_s^T B_s`` and ``theta +- delta A_q^T B_q`` are
  applied to inputs as low-rank corrections of the shared kernel;
* ``d_i = r_i - alpha g_i`` is ``U_i^T V_i`` with ``U_i = [A_q; A_+; A_-]``
  and ``V_i = [B_q; -alpha/(2 delta) B_+; alpha/(2 delta) B_-]``;
* after step 5 ``y_i = -w_i d_i`` (SPEC §2): a client's new dual does not
  depend on its old one;
* Eq. (13) with every client taking part: ``theta^{t+1} = theta^t -
  [Y^prev - 2 Y + lam grad R_h] / sum_i rho_i`` with ``Y = sum_i y_i = -sum_i
  w_i d_i``, for a dense kernel one matmul of the stacked factors (``[r C,
  d_in]^T [r C, d_out]``). So the state keeps ``Y`` (one tree) and no
  per-client dual: nothing in it grows with the clients but their round
  counters.

Which kernels are factored: those whose factors are smaller than the kernel,
``r (d_in + d_out) < d_in d_out`` with ``r`` the rows of ``U_i`` (the
query rows plus twice the support rows the layer sees): the 3136x512 kernel
of the cnn at n = 15 (r = 45), not its 512x10 head. Every other parameter
(convolutions, norms, biases, small kernels) stays materialised.

Partial participation: a client j that does not take part enters Eq. (13)
with ``s_j = y_j + rho theta_j = rho theta^{t_j} - y_j^prev + 2 y_j``,
where ``theta^{t_j}`` is the global model of the round it last took part
in: one dense tree per client, which no factor replaces. A state made with
``init_state(..., partial=True)`` keeps ``terms`` (the ``s_j``, ``[C, ...]``)
and each client's dual (its factored kernels as factors) and the server
sums the terms; without it only full participation is allowed.

``AUTO_MIN_SHARE`` and :func:`choose` state when ``auto`` factors.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from augfl_jax.algorithms.augfl import admm
from augfl_jax.core import checks
from augfl_jax.core import client_axis
from augfl_jax.core import dense_factors as df
from augfl_jax.core import tree
from augfl_jax.core.types import ClientData, LossFn, Params

__all__ = ["AUTO_MIN_SHARE", "FactoredState", "choose", "client_direction",
           "configured_state", "factored_layers", "init_state", "make_round",
           "make_configured_round", "state_bytes"]

# ``auto`` factors when the kernels that would be factored hold at least
# this share of the parameters (benchmarks/RESULTS.md §15): the cnn (98.0%,
# 1.30x), the cnn on 8x8 inputs (84.2%, 1.20x) and the mlp on 28x28 inputs
# (96.6%, 2.36x) measured faster factored; a model without a kernel worth
# factoring stays materialised (a few milliseconds a round to gain).
AUTO_MIN_SHARE = 0.5


@flax.struct.dataclass
class FactoredState:
  """AugFL's state with the factored kernels' duals as factors.

  Attributes:
    params: theta^t.
    client_rounds: ``[C]`` int32, rounds each client has taken part in.
    round: scalar int32, server rounds completed.
    dual_sum: full participation: ``Y = sum_i y_i``, like ``params``
      (None under partial participation).
    duals: partial participation: each y_i as ``(rest, factors)``: its
      other leaves ``[C, ...]`` (params without the factored kernels) and
      ``{layer path: Factors(u [C, r, d_in], v [C, r, d_out])}``, its
      factored kernels ``u_i^T v_i`` (None under full participation).
    terms: partial participation: each client's ``y_j + rho theta_j``,
      ``[C, ...]`` like ``params`` (None under full participation).
  """

  params: Params
  client_rounds: jax.Array
  round: jax.Array
  dual_sum: Any = None
  duals: Any = None
  terms: Any = None


def _rows(shapes) -> int:
  return sum(math.prod(s.shape[:-1]) for s in shapes)


def factored_layers(loss_fn: LossFn, params: Params, support: Any,
                    query: Any) -> tuple[dict, dict]:
  """``(layers, layers_q)``: the ``nn.Dense`` layers worth factoring, with
  the output shapes of their calls on one client's ``support`` and
  ``query`` (``df.dense_kernels``): those whose ``r`` rows of factors hold
  fewer numbers than the kernel."""
  layers = df.dense_kernels(loss_fn, params, support)
  layers_q = df.dense_kernels(loss_fn, params, query)
  _, kernels = df.split_kernels(params, layers)
  keep = [p for p, k in kernels.items()
          if (_rows(layers_q.get(p, ())) + 2 * _rows(layers[p])) *
          (k.shape[0] + k.shape[1]) < k.shape[0] * k.shape[1]]
  return ({p: layers[p] for p in keep},
          {p: layers_q.get(p, []) for p in keep})


def choose(config: admm.AugFLConfig, loss_fn: LossFn, params: Params,
           clients: ClientData | None) -> str:
  """``"factored"`` or ``"materialised"``, as ``config.dense_updates`` says.

  ``auto`` is ``factored`` when the HVP is the finite-difference one, the
  clients' shapes are known (``clients`` given), and the kernels that
  :func:`factored_layers` picks hold at least ``AUTO_MIN_SHARE`` of the
  parameters; else ``materialised``.

  Raises:
    ValueError: ``factored`` with ``hvp="exact"`` or without ``clients``.
  """
  mode = config.dense_updates
  if mode == "materialised":
    return mode
  if config.hvp != "finite_difference" or clients is None:
    if mode == "auto":
      return "materialised"
    raise ValueError(
        "--augfl.dense_updates=factored needs the finite-difference HVP "
        f"(--augfl.hvp=finite_difference, got {config.hvp})"
        if clients is not None else
        "dense_updates='factored' needs the clients' data to size the "
        "state: start the algorithm with algo.start(params, clients, key) "
        "or use factored.init_state(loss_fn, params, clients)")
  if mode == "factored":
    return mode
  first = tree.take(clients, 0)
  layers, _ = factored_layers(loss_fn, params, first.support, first.query)
  _, kernels = df.split_kernels(params, layers)
  total = sum(a.size for a in jax.tree.leaves(params))
  share = sum(k.size for k in kernels.values()) / total
  return "factored" if share >= AUTO_MIN_SHARE else "materialised"


def init_state(loss_fn: LossFn, params: Params, clients: ClientData,
               rho: float = 0.0, partial: bool = False) -> FactoredState:
  """Zero duals, no rounds taken. Full participation: ``Y = 0``. With
  ``partial`` (rounds of a subset of clients): each client's dual, its
  factored kernels sized by one client of ``clients`` (every client has the
  same padded shapes), and ``terms`` = ``rho theta^0`` (``rho`` > 0 then)."""
  num = clients.num_examples.shape[0]
  start = FactoredState(params=params,
                        client_rounds=jnp.zeros((num,), jnp.int32),
                        round=jnp.zeros((), jnp.int32))
  if not partial:
    return start.replace(dual_sum=optax.tree.zeros_like(params))
  if not rho > 0:
    raise ValueError(f"a partial-participation state needs rho > 0, got {rho}")
  first = tree.take(clients, 0)
  layers, layers_q = factored_layers(loss_fn, params, first.support,
                                     first.query)
  rest, kernels = df.split_kernels(params, layers)
  factors = {}
  for p, k in kernels.items():
    rows = _rows(layers_q[p]) + 2 * _rows(layers[p])
    factors[p] = df.Factors(jnp.zeros((num, rows, k.shape[0]), k.dtype),
                            jnp.zeros((num, rows, k.shape[1]), k.dtype))
  return start.replace(
      duals=(tree.broadcast_to_clients(optax.tree.zeros_like(rest), num),
             factors),
      terms=tree.broadcast_to_clients(optax.tree.scale(rho, params), num))


def state_bytes(state: Any) -> int:
  """Bytes of a state's arrays (``AugFLState`` or ``FactoredState``)."""
  return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(state))


def client_direction(loss_fn: LossFn, layers: dict, layers_q: dict,
                     theta: Params, support: Any, query: Any, *,
                     alpha, delta) -> tuple[Any, dict, jax.Array, jax.Array]:
  """Steps 1-3 of one client with the ``layers`` kernels as factors.

  Returns:
    ``(d_rest, d_factors, query_loss, support_loss)``: ``d = r - alpha g``
    (Eqs. (7), (10)), its other leaves and ``{path: Factors}`` with ``r =
    query rows + 2 support rows`` rows.
  """
  theta_rest, kernels = df.split_kernels(theta, layers)
  at = lambda rest: df.join_kernels(rest, kernels)
  support_loss, gs_rest, gs_f = df.value_and_grad(
      loss_fn, theta, support, layers=layers)
  query_loss, r_rest, r_f = df.value_and_grad(
      loss_fn, at(optax.tree.add_scale(theta_rest, -alpha, gs_rest)), query,
      corrections={p: f.scale(-alpha) for p, f in gs_f.items()},
      layers=layers_q)

  def support_grad(sign):  # grad L(theta + sign delta r, D^s)
    _, rest, factors = df.value_and_grad(
        loss_fn, at(optax.tree.add_scale(theta_rest, sign * delta, r_rest)),
        support, corrections={p: f.scale(sign * delta)
                              for p, f in r_f.items()}, layers=layers)
    return rest, factors

  (gp_rest, gp_f), (gm_rest, gm_f) = support_grad(1.0), support_grad(-1.0)
  g_rest = optax.tree.scale(0.5 / delta, optax.tree.sub(gp_rest, gm_rest))
  d_rest = optax.tree.add_scale(r_rest, -alpha, g_rest)
  c = alpha * 0.5 / delta
  d_f = {p: df.concat([r_f[p], gp_f[p].scale(-c), gm_f[p].scale(c)])
         for p in r_f}
  return d_rest, d_f, query_loss, support_loss


def _per_client(stacked: Any, s: jax.Array) -> Any:
  """Each client's rows of ``stacked`` (leaves ``[K, ...]``) times ``s[k]``."""
  return jax.tree.map(
      lambda a: a * s.reshape((-1,) + (1,) * (a.ndim - 1)).astype(a.dtype),
      stacked)


def _dense(rest: Any, factors: dict) -> Any:
  """Per-client trees ``[K, ...]`` from other leaves and factors."""
  return df.join_kernels(rest, {p: jnp.einsum("cri,cro->cio", f.u, f.v)
                                for p, f in factors.items()})


def make_round(loss_fn: LossFn, config: admm.AugFLConfig,
               strategy: str | client_axis.ClientStrategy | None = None):
  """A jitted factored AugFL round: ``round_fn(state, clients,
  reg_grad=None, participants=None) -> (state, metrics)``, the contract and
  metrics of ``round.make_round`` on a :class:`FactoredState`.

  Raises:
    ValueError: ``config.hvp`` is not ``finite_difference``; when the
      round runs: ``lam > 0`` without ``reg_grad``, participants with a
      state made without ``partial=True``, bad participants, or a support
      set the loss cannot run on.
  """
  if config.hvp != "finite_difference":
    raise ValueError("the factored round needs the finite-difference HVP "
                     f"(hvp='finite_difference', got {config.hvp!r})")
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: FactoredState, clients: ClientData, reg_grad=None,
               participants=None):
    if config.lam > 0 and reg_grad is None:
      raise ValueError("config.lam > 0 needs reg_grad = grad R_h(theta^t)")
    if participants is not None and state.terms is None:
      raise ValueError("partial participation needs a state made with "
                       "init_state(..., partial=True)")
    select, merge = tree.client_subset(participants)
    num = clients.num_examples.shape[0]
    support, query = select(clients.support), select(clients.query)
    first = tree.take(clients, 0)  # every client has the same shapes
    checks.check_loss_runs(loss_fn, state.params, first.support,
                           "the client's support set")
    layers, layers_q = factored_layers(loss_fn, state.params, first.support,
                                       first.query)
    weights = select(admm.client_weights(clients.num_examples,
                                                config.uniform_weights))
    rounds = select(state.client_rounds) + 1
    dtype = jnp.result_type(*jax.tree.leaves(state.params))
    deltas = admm.delta_schedule(rounds.astype(dtype), config)

    def one_client(c):
      return client_direction(loss_fn, layers, layers_q, state.params,
                              c["support"], c["query"], alpha=config.alpha,
                              delta=c["delta"])

    d_rest, d_f, query_loss, support_loss = client_axis.map_clients(
        one_client, dict(support=support, query=query, delta=deltas),
        strategy)
    w = weights.astype(dtype)
    new_rest = _per_client(d_rest, -w)  # y_i = -w_i d_i
    new_f = {p: df.Factors(f.u, _per_client(f.v, -w)) for p, f in d_f.items()}
    new_state = state.replace(
        client_rounds=merge(state.client_rounds, rounds),
        round=state.round + 1)
    if state.terms is None:
      # Y = sum_i y_i; theta^{t+1} = theta^t - [Y^prev - 2 Y + lam grad
      # R_h] / (C rho)
      dual_sum = df.join_kernels(
          tree.weighted_sum(new_rest, jnp.ones((num,), dtype)),
          {p: jnp.einsum("cri,cro->io", f.u, f.v) for p, f in new_f.items()})
      total = optax.tree.add_scale(state.dual_sum, -2.0, dual_sum)
      if reg_grad is not None:
        total = optax.tree.add_scale(total, config.lam, reg_grad)
      new_state = new_state.replace(
          params=optax.tree.add_scale(state.params,
                                      -1.0 / (num * config.rho), total),
          dual_sum=dual_sum)
    else:
      # s_i = rho theta^t - y_i^prev + 2 y_i for the participants; Eq. (13)
      # over every client's latest s_j
      old_rest, old_f = select(state.duals)
      fresh = jax.tree.map(
          lambda theta, y_old, y_new: config.rho * theta - y_old + 2 * y_new,
          state.params, _dense(old_rest, old_f), _dense(new_rest, new_f))
      terms = merge(state.terms, fresh)
      total = tree.weighted_sum(terms, jnp.ones((num,), dtype))
      if reg_grad is not None:
        total = optax.tree.add_scale(total, -config.lam, reg_grad)
      new_state = new_state.replace(
          params=optax.tree.scale(1.0 / (num * config.rho), total),
          duals=merge(state.duals, (new_rest, new_f)), terms=terms)
    return new_state, {
        "loss": jnp.sum(w * query_loss) / jnp.sum(w),
        "support_loss": jnp.sum(w * support_loss) / jnp.sum(w),
        "client_loss": query_loss}

  return tree.checked_round(jax.jit(round_fn), position=3)


def configured_state(config: admm.AugFLConfig, loss_fn: LossFn,
                     params: Params, clients: ClientData,
                     partial: bool = False
                     ) -> admm.AugFLState | FactoredState:
  """The first state, over the training ``clients``, of the round that
  ``config.dense_updates`` resolves to (:func:`choose`): a
  :class:`FactoredState` or an ``AugFLState``; ``partial``: rounds will
  take a subset of the clients."""
  if choose(config, loss_fn, params, clients) == "factored":
    return init_state(loss_fn, params, clients, config.rho, partial)
  return admm.init_state(params, clients.num_examples.shape[0])


def make_configured_round(loss_fn: LossFn, config: admm.AugFLConfig,
                          strategy: str | client_axis.ClientStrategy | None
                          = None):
  """``round_fn(state, clients, reg_grad=None, participants=None)`` that runs
  :func:`make_round` on a :class:`FactoredState` and ``round.make_round`` on
  an ``AugFLState`` (each compiled when first used)."""
  materialised = admm.make_round(loss_fn, config, strategy)
  factored = (make_round(loss_fn, config, strategy)
              if config.hvp == "finite_difference" else None)

  def round_fn(state, clients, reg_grad=None, participants=None):
    run = factored if isinstance(state, FactoredState) else materialised
    return run(state, clients, reg_grad, participants)

  return round_fn
