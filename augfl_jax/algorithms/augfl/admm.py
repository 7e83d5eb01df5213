"""AugFL's inexact-ADMM round: Algorithm 1, Eqs. (7) and (10)-(13) of the paper.

Objective (2)-(3): ``min_theta sum_i w_i L_i(phi_i(theta), D_i^q) + lam R_h(theta)``
with ``phi_i(theta) = theta - alpha grad L_i(theta, D_i^s)``.

One round (``make_round``) runs ``client_update`` for every participating client
(lifted over the client axis by ``augfl_jax.core.client_axis``), then
``server_update``.
The pretrained model only enters through ``reg_grad = grad R_h(theta^t)``, which
the server computes itself (``augfl_jax.transfer``): no client function takes
the pretrained model or the server data as an argument.

Partial participation (not in the paper): only the clients in ``participants``
compute steps 1-6; the server aggregates Eq. (13) over ALL clients with the
latest ``(theta_i, y_i)`` each one sent, stale for those not sampled this round.
A client that never took part contributes ``y_i = 0, theta_i = theta^0``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from augfl_jax.algorithms.augfl import checks as augfl_checks
from augfl_jax.core import checks
from augfl_jax.core import client_axis
from augfl_jax.core import hvp as hvp_lib
from augfl_jax.core import tree
from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.core.types import Batch, ClientData, LossFn, Params

__all__ = [
    "AugFLConfig", "AugFLState", "client_update", "client_weights",
    "delta_schedule", "init_state", "make_round", "RoundFn", "server_update"
]


@dataclasses.dataclass(frozen=True)
class AugFLConfig(fields.Config):
  """Hyper-parameters of AugFL (defaults: the paper's §VI-A, lam 0)."""

  alpha: float = field(0.03, "inner step size alpha of Eq. (7) (the paper's "
      "0.03)", gt=0, resume="named")
  rho: float = field(0.7, "ADMM penalty rho_i of Eqs. (11)-(13), the same for "
      "every client (the paper's 0.7)", gt=0)
  lam: float = field(0.0, "weight lambda of the server regulariser R_h in Eq. "
      "(13); 0 is AugFL w/o PM (the paper's 5)", ge=0, resume="named")
  hvp: str = field("finite_difference", "the Hessian-vector product of Eq. "
      "(10): finite_difference (the paper's) or exact (jvp of grad)",
      choices=hvp_lib.HVP_METHODS)
  delta_slope: float = field(10.0, "delta_t = 1 / (delta_slope t + "
      "delta_offset), t the rounds the client has taken part in", ge=0)
  delta_offset: float = field(100.0, "see delta_slope (delta_1 = 1/110, as "
      "the reference)", gt=0)
  uniform_weights: bool = field(False, "w_i = 1/N instead of |D_i| / sum_j "
      "|D_j|")
  dense_updates: str = field("auto", "per-client quantities of dense "
      "kernels: factored (low-rank factors, the same arithmetic: "
      "algorithms/augfl/factored.py), materialised (parameter-sized trees), "
      "or auto (factored when the kernels worth factoring hold half the "
      "parameters and the HVP is finite_difference)",
      choices=("auto", "factored", "materialised"),
      absent="materialised")  # runs saved before the field were
  lam_warmup: int = field(0, "rounds K over which the weight of R_h rises "
      "linearly, lam_t = lam min(1, t / K) in round t; 0: lam from round 1 "
      "(the paper's)", ge=0, resume="named")
  reg_max_norm: float = field(math.inf, "bound on the norm of the server "
      "step's R_h part, lam_t ||grad R_h|| / sum_i rho_i (scaled down to it "
      "when longer); inf: no bound (the paper's)", gt=0, allow_inf=True,
      resume="named")
  diagnostics: bool = field(False, "also record, each round, the training "
      "clients' support and query losses before and after their adaptation "
      "step (one more support gradient and three forward passes a client: "
      "about a third more per round); the server step's norms are recorded "
      "always", resume="free")


@flax.struct.dataclass
class AugFLState:
  """Server and per-client state (client leaves have a leading axis ``C``).

  Attributes:
    params: the meta-model theta^t.
    duals: y_i, ``[C, ...]`` like ``params``.
    client_params: theta_i, the latest local model each client sent,
      ``[C, ...]``.
    client_rounds: ``[C]`` int32, rounds each client has taken part in (the t
      of ``delta_t``).
    round: scalar int32, server rounds completed.
  """

  params: Params
  duals: Params
  client_params: Params
  client_rounds: jax.Array
  round: jax.Array


def init_state(params: Params, num_clients: int) -> AugFLState:
  """Zero duals, theta_i = theta^0, no rounds taken (``ValueError`` unless
  ``num_clients`` is an int >= 1)."""
  return AugFLState(
      params=params,
      duals=tree.broadcast_to_clients(optax.tree.zeros_like(params),
                                      num_clients),
      client_params=tree.broadcast_to_clients(params, num_clients),
      client_rounds=jnp.zeros((num_clients,), jnp.int32),
      round=jnp.zeros((), jnp.int32))


def delta_schedule(t: jax.Array, config: AugFLConfig) -> jax.Array:
  """``delta_t = 1 / (delta_slope t + delta_offset)`` (1/110 at t = 1)."""
  return 1.0 / (config.delta_slope * t + config.delta_offset)


def client_update(loss_fn: LossFn, theta: Params, dual: Params, support: Batch,
                  query: Batch, *, weight: float | jax.Array,
                  alpha: float | jax.Array, rho: float | jax.Array,
                  delta: float | jax.Array, hvp: str = "finite_difference"
                 ) -> tuple[Params, Params, dict[str, jax.Array]]:
  """One client's step of Algorithm 1 (Eqs. (7), (10), (11), (12)).

  Handles exactly one client; ``augfl_jax.core.client_axis`` lifts it over
  clients.

  1. ``g_s = grad L(theta, D^s)``, ``phi = theta - alpha g_s``        (7)
  2. ``r = grad L(phi, D^q)``
  3. ``g = H(theta, D^s) r`` by central differences with step delta    (10)
  4. ``theta_i = theta - (y + w (r - alpha g)) / rho``                 (11)
  5. ``y <- y + rho (theta_i - theta)``                                (12)

  Args:
    loss_fn: ``loss_fn(params, batch) -> scalar``, a masked mean.
    theta: the received meta-model theta^t.
    dual: this client's y_i (same tree as ``theta``).
    support: D_i^s, a ``Batch`` of ``[S, ...]`` leaves.
    query: D_i^q, ``[Q, ...]``.
    weight: w_i.
    alpha: inner step size.
    rho: rho_i.
    delta: finite-difference step delta_t.
    hvp: ``"finite_difference"`` or ``"exact"`` for step 3.

  Returns:
    ``(theta_i, new_dual, metrics)``; metrics: ``query_loss`` = L(phi, D^q),
    ``support_loss`` = L(theta, D^s).

  Raises:
    ValueError: ``rho`` is not > 0 or ``alpha`` not finite (checked when
      they are concrete: Python numbers, as ``make_round`` passes them, or
      arrays outside jit); ``theta`` has a 16-bit float leaf, ``dual``
      leaves whose shapes or dtypes differ from ``theta``'s, or a
      ``support`` set the loss cannot run on with ``theta`` (these are
      checked always, under jit too).
  """
  augfl_checks.check_client_args(theta, dual, alpha=alpha, rho=rho)
  checks.check_loss_runs(loss_fn, theta, support, "the client's support set")
  support_grad_fn = lambda p: jax.grad(loss_fn)(p, support)
  support_loss, g_s = jax.value_and_grad(loss_fn)(theta, support)
  phi = optax.tree.add_scale(theta, -alpha, g_s)
  query_loss, r = jax.value_and_grad(loss_fn)(phi, query)
  g = hvp_lib.hvp(support_grad_fn, theta, r, delta=delta, method=hvp)
  meta_grad = optax.tree.add_scale(r, -alpha, g)  # r - alpha g
  step = optax.tree.add_scale(dual, weight, meta_grad)  # y + w (r - alpha g)
  theta_i = optax.tree.add_scale(theta, -1.0 / rho, step)
  new_dual = optax.tree.add_scale(dual, rho,
                                  optax.tree.sub(theta_i, theta))
  return theta_i, new_dual, {"query_loss": query_loss,
                             "support_loss": support_loss}


def server_update(client_params: Params, duals: Params, rhos: jax.Array, *,
                  reg_grad: Params | None = None,
                  lam: float | jax.Array = 0.0) -> Params:
  """Eq. (13): ``[sum_i (y_i + rho_i theta_i) - lam grad R_h] / sum_i rho_i``.

  Args:
    client_params: theta_i stacked, leaves ``[C, ...]``.
    duals: y_i stacked, ``[C, ...]``.
    rhos: ``[C]``.
    reg_grad: ``grad R_h(theta^t, theta_p)`` (leaves ``[...]``), or None for
      no regulariser.
    lam: lambda.

  Returns:
    theta^{t+1}.

  Raises:
    ValueError: ``duals`` not of ``client_params``' tree and shapes, or
      ``rhos`` not ``[C]`` (checked always, under jit too).
  """
  augfl_checks.check_server_args(client_params, duals, rhos)
  # Both sums over clients are tensordots: XLA:CPU runs a reduce over the
  # leading axis of [C, ...] (jnp.sum(axis=0)) about 8x slower than the
  # equivalent dot (benchmarks/RESULTS.md).
  total = optax.tree.add(tree.weighted_sum(client_params, rhos),
                         tree.weighted_sum(duals, jnp.ones_like(rhos)))
  if reg_grad is not None:
    total = optax.tree.add_scale(total, -lam, reg_grad)
  return optax.tree.scale(1.0 / jnp.sum(rhos), total)


def client_weights(num_examples: jax.Array, uniform: bool) -> jax.Array:
  """w_i: ``|D_i| / sum_j |D_j|``, or ``1 / N`` when ``uniform`` (``[C]``)."""
  if uniform:
    return jnp.full_like(num_examples, 1.0 / num_examples.shape[0])
  return num_examples / jnp.sum(num_examples)


RoundFn = Callable[..., tuple[AugFLState, dict[str, jax.Array]]]


def make_round(loss_fn: LossFn, config: AugFLConfig,
               strategy: str | client_axis.ClientStrategy | None = None
               ) -> RoundFn:
  """A jitted AugFL round over all (or the participating) clients.

  Returns ``round_fn(state, clients, reg_grad=None, participants=None)
  -> (state, metrics)`` where ``clients`` is the ``ClientData`` of ALL ``C``
  training clients (leaves ``[C, ...]``), ``reg_grad`` is
  ``grad R_h(state.params)`` (required when ``config.lam > 0``) and
  ``participants`` an optional ``[K]`` int array of the client ids taking part
  (default: all): distinct ids in ``[0, C)``, else ``ValueError`` before the
  round runs; when ``round_fn`` is itself traced (called inside another
  jit), the ids cannot be checked and bad ones give a wrong round without a
  word (``augfl_jax.core.tree.check_participants`` says how). Metrics: ``loss``
  (the meta-objective's data term, ``sum_i w_i L(phi_i, D_i^q) / sum_i
  w_i`` over participants),
  ``support_loss`` (likewise at theta^t) and ``client_loss`` (``[K]``).
  ``strategy`` says how the client axis runs
  (``augfl_jax.core.client_axis``); None
  is the backend's ``clients.default_strategy()`` (``"map"`` on CPU,
  ``"vmap"`` elsewhere), resolved here.
  """
  strategy = client_axis.as_strategy(strategy)

  def round_fn(state: AugFLState, clients: ClientData,
               reg_grad: Params | None = None,
               participants: jax.Array | None = None):
    if config.lam > 0 and reg_grad is None:
      raise ValueError("config.lam > 0 needs reg_grad = grad R_h(theta^t)")
    num_clients = clients.num_examples.shape[0]
    select, merge = tree.client_subset(participants)
    weights = select(client_weights(clients.num_examples,
                                    config.uniform_weights))
    rounds = select(state.client_rounds) + 1
    # delta_t and sum_i rho_i in theta's precision (float64 under
    # jax_enable_x64; a float32 1 / 40 is 1.5e-8 off).
    dtype = jnp.result_type(*jax.tree.leaves(state.params))
    per_client = dict(
        dual=select(state.duals),
        support=select(clients.support),
        query=select(clients.query),
        weight=weights,
        delta=delta_schedule(rounds.astype(dtype), config))

    def one_client(c):
      return client_update(
          loss_fn, state.params, c["dual"], c["support"], c["query"],
          weight=c["weight"], alpha=config.alpha, rho=config.rho,
          delta=c["delta"], hvp=config.hvp)

    thetas, duals, client_metrics = client_axis.map_clients(
        one_client, per_client, strategy)
    client_params = merge(state.client_params, thetas)
    all_duals = merge(state.duals, duals)
    rhos = jnp.full((num_clients,), config.rho, dtype)
    params = server_update(client_params, all_duals, rhos,
                           reg_grad=reg_grad, lam=config.lam)
    new_state = AugFLState(
        params=params, duals=all_duals, client_params=client_params,
        client_rounds=merge(state.client_rounds, rounds),
        round=state.round + 1)
    w = per_client["weight"]
    metrics = {
        "loss": jnp.sum(w * client_metrics["query_loss"]) / jnp.sum(w),
        "support_loss":
            jnp.sum(w * client_metrics["support_loss"]) / jnp.sum(w),
        "client_loss": client_metrics["query_loss"],
    }
    return new_state, metrics

  # Concrete participants are checked before jit (tree.check_participants
  # says what traced ones do instead).
  return tree.checked_round(jax.jit(round_fn), position=3)
