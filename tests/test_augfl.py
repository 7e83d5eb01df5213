"""AugFL's equations against independent computations on a tiny model."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from augfl_jax.algorithms import augfl
from augfl_jax.core import hvp, tree
from tests import tiny

ALPHA, RHO = 0.05, 0.7


def _flat(t):
  return jax.flatten_util.ravel_pytree(t)[0]


def _client_terms(theta, support, query, delta, exact=False):
  """r_i and g_i computed without the library (exact Hessian when asked)."""
  g_s = jax.grad(tiny.loss_fn)(theta, support)
  phi = jax.tree.map(lambda p, g: p - ALPHA * g, theta, g_s)
  r = jax.grad(tiny.loss_fn)(phi, query)
  flat_theta, unravel = jax.flatten_util.ravel_pytree(theta)
  if exact:
    hess = jax.hessian(lambda f: tiny.loss_fn(unravel(f), support))(flat_theta)
    g = unravel(hess @ _flat(r))
  else:
    gp = jax.grad(tiny.loss_fn)(
        jax.tree.map(lambda p, v: p + delta * v, theta, r), support)
    gm = jax.grad(tiny.loss_fn)(
        jax.tree.map(lambda p, v: p - delta * v, theta, r), support)
    g = jax.tree.map(lambda a, b: (a - b) / (2 * delta), gp, gm)
  return r, g


def _first_round_closed_form(theta0, clients, lam=0.0, reg=None):
  """theta^1 from zero duals: theta^0 - (2 sum_i w_i (r_i - alpha g_i) +
  lam reg) / (rho N), each client's terms from :func:`_client_terms`."""
  w = clients.num_examples / jnp.sum(clients.num_examples)
  total = optax.tree.zeros_like(theta0)
  for i in range(clients.num_clients):
    c = tree.take(clients, i)
    r, g = _client_terms(theta0, c.support, c.query, 1 / 110)
    total = jax.tree.map(lambda t, a, b: t + w[i] * (a - ALPHA * b),
                         total, r, g)
  reg_term = reg if reg is not None else optax.tree.zeros_like(theta0)
  return jax.tree.map(
      lambda p, t, h: p - (2 * t + lam * h) / (RHO * clients.num_clients),
      theta0, total, reg_term)


def _float64(t):
  """``t`` with its float32 leaves in float64 (under jax_enable_x64)."""
  return jax.tree.map(
      lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, t)


@pytest.mark.parametrize("method", ["finite_difference", "exact"])
def test_dual_after_client_step_is_minus_weighted_meta_gradient(method):
  rng = np.random.default_rng(0)
  theta = tiny.init(jax.random.key(0))
  support, query = tiny.batch(rng, 7, 3), tiny.batch(rng, 6, 4)
  old_dual = jax.tree.map(lambda p: jnp.full_like(p, 0.3), theta)
  w, delta = 0.25, 1 / 110
  theta_i, dual, _ = augfl.client_update(
      tiny.loss_fn, theta, old_dual, support, query, weight=w, alpha=ALPHA,
      rho=RHO, delta=delta, hvp=method)
  r, g = _client_terms(theta, support, query, delta,
                       exact=method == "exact")
  expected = jax.tree.map(lambda a, b: -w * (a - ALPHA * b), r, g)
  chex.assert_trees_all_close(dual, expected, atol=1e-6, rtol=1e-5)
  # Eq. (11) directly.
  expected_theta = jax.tree.map(
      lambda p, y, a, b: p - (y + w * (a - ALPHA * b)) / RHO,
      theta, old_dual, r, g)
  chex.assert_trees_all_close(theta_i, expected_theta, atol=1e-6, rtol=1e-5)


def test_server_update_matches_direct_sum():
  rng = np.random.default_rng(1)
  thetas = {"a": jnp.asarray(rng.normal(size=(3, 2, 2)), jnp.float32)}
  duals = {"a": jnp.asarray(rng.normal(size=(3, 2, 2)), jnp.float32)}
  rhos = jnp.asarray([0.5, 1.0, 2.0])
  reg = {"a": jnp.asarray(rng.normal(size=(2, 2)), jnp.float32)}
  got = augfl.server_update(thetas, duals, rhos, reg_grad=reg, lam=3.0)
  direct = sum(duals["a"][i] + rhos[i] * thetas["a"][i] for i in range(3))
  expected = (direct - 3.0 * reg["a"]) / 3.5
  np.testing.assert_allclose(got["a"], expected, rtol=1e-6, atol=1e-6)
  no_reg = augfl.server_update(thetas, duals, rhos)
  np.testing.assert_allclose(no_reg["a"], direct / 3.5, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lam", [0.0, 5.0])
def test_first_round_from_zero_duals_closed_form(lam):
  clients = tiny.client_data(seed=2)
  theta0 = tiny.init(jax.random.key(1))
  config = augfl.AugFLConfig(alpha=ALPHA, rho=RHO, lam=lam)
  state = augfl.init_state(theta0, clients.num_clients)
  reg = jax.tree.map(lambda p: jnp.sin(p), theta0) if lam else None
  new_state, _ = augfl.make_round(tiny.loss_fn, config)(state, clients, reg)
  expected = _first_round_closed_form(theta0, clients, lam, reg)
  chex.assert_trees_all_close(new_state.params, expected, atol=1e-6, rtol=1e-5)
  np.testing.assert_array_equal(new_state.client_rounds, 1)


def test_a_float64_round_is_float64_throughout():
  """Under jax_enable_x64 with float64 parameters and data, the round's
  delta_t and sum_i rho_i are float64 too: the first round equals its
  closed form to float64 rounding (a float32 1 / (rho N) alone is 1e-8
  off)."""
  with jax.enable_x64(True):
    clients = _float64(tiny.client_data(seed=2))
    theta0 = _float64(tiny.init(jax.random.key(1)))
    config = augfl.AugFLConfig(alpha=ALPHA, rho=RHO, lam=0.0)
    state = augfl.init_state(theta0, clients.num_clients)
    new_state, _ = augfl.make_round(tiny.loss_fn, config)(state, clients)
    expected = _first_round_closed_form(theta0, clients)
    for got, want in zip(jax.tree.leaves(new_state.params),
                         jax.tree.leaves(expected)):
      assert got.dtype == jnp.float64
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_delta_schedule_starts_at_one_over_110():
  config = augfl.AugFLConfig()
  np.testing.assert_allclose(augfl.delta_schedule(jnp.array([1., 2.]), config),
                             [1 / 110, 1 / 120])


def test_round_counters_drive_delta():
  """Round 2 uses delta = 1/120: compare with a client step done by hand."""
  clients = tiny.client_data(seed=3, num_clients=2)
  theta0 = tiny.init(jax.random.key(2))
  config = augfl.AugFLConfig(alpha=ALPHA, rho=RHO)
  round_fn = augfl.make_round(tiny.loss_fn, config)
  state, _ = round_fn(augfl.init_state(theta0, 2), clients)
  state2, _ = round_fn(state, clients)
  w = clients.num_examples / jnp.sum(clients.num_examples)
  c = tree.take(clients, 0)
  theta_i, dual, _ = augfl.client_update(
      tiny.loss_fn, state.params, tree.take(state.duals, 0), c.support,
      c.query, weight=w[0], alpha=ALPHA, rho=RHO, delta=1 / 120)
  chex.assert_trees_all_close(tree.take(state2.client_params, 0), theta_i,
                              atol=1e-6, rtol=1e-5)
  chex.assert_trees_all_close(tree.take(state2.duals, 0), dual,
                              atol=1e-6, rtol=1e-5)


def test_finite_difference_hvp_converges_to_exact_hessian():
  with jax.enable_x64(True):
    rng = np.random.default_rng(4)
    theta = _float64(tiny.init(jax.random.key(3)))
    data = _float64(tiny.batch(rng, 8))
    v = jax.tree.map(lambda p: jnp.cos(3 * p), theta)
    flat, unravel = jax.flatten_util.ravel_pytree(theta)
    exact = jax.hessian(lambda f: tiny.loss_fn(unravel(f), data))(flat) @ _flat(v)
    grad_fn = lambda p: jax.grad(tiny.loss_fn)(p, data)
    errors = []
    for delta in [1e-1, 1e-2, 1e-3]:
      est = _flat(hvp.finite_difference_hvp(grad_fn, theta, v, delta))
      errors.append(float(jnp.linalg.norm(est - exact)))
    # Central differences: error O(delta^2), so ~100x smaller per 10x delta.
    assert errors[1] < errors[0] / 30 and errors[2] < errors[1] / 30, errors
    assert errors[1] < 1e-3 * float(jnp.linalg.norm(exact)), errors
    np.testing.assert_allclose(_flat(hvp.exact_hvp(grad_fn, theta, v)), exact,
                               rtol=1e-10, atol=1e-12)


def test_finite_difference_hvp_in_float32_at_the_papers_delta():
  rng = np.random.default_rng(4)
  theta = tiny.init(jax.random.key(3))
  data = tiny.batch(rng, 8)
  v = jax.tree.map(lambda p: jnp.cos(3 * p), theta)
  grad_fn = lambda p: jax.grad(tiny.loss_fn)(p, data)
  exact = _flat(hvp.exact_hvp(grad_fn, theta, v))
  est = _flat(hvp.finite_difference_hvp(grad_fn, theta, v, 1 / 110))
  assert jnp.linalg.norm(est - exact) < 1e-3 * jnp.linalg.norm(exact)


def test_padding_changes_nothing():
  rng = np.random.default_rng(5)
  theta = tiny.init(jax.random.key(4))
  s, q = tiny.batch(rng, 6), tiny.batch(rng, 5)

  def pad(b, extra):
    return {"x": jnp.concatenate([b["x"], jnp.full((extra, tiny.D), 7e3)]),
            "y": jnp.concatenate([b["y"], jnp.zeros(extra, jnp.int32)]),
            "mask": jnp.concatenate([b["mask"], jnp.zeros(extra)])}

  dual = optax.tree.zeros_like(theta)
  kw = dict(weight=0.5, alpha=ALPHA, rho=RHO, delta=1 / 110)
  a = augfl.client_update(tiny.loss_fn, theta, dual, s, q, **kw)
  b = augfl.client_update(tiny.loss_fn, theta, dual, pad(s, 4), pad(q, 9), **kw)
  chex.assert_trees_all_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("strategy", ["map", "chunked"])
def test_strategies_and_python_loop_agree(strategy):
  from augfl_jax.core import client_axis
  clients = tiny.client_data(seed=6, num_clients=5)
  theta0 = tiny.init(jax.random.key(5))
  config = augfl.AugFLConfig(alpha=ALPHA, rho=RHO)
  state0 = augfl.init_state(theta0, 5)
  ref, ref_metrics = augfl.make_round(tiny.loss_fn, config, "vmap")(
      state0, clients)
  other = client_axis.ClientStrategy(strategy, chunk_size=2)
  got, metrics = augfl.make_round(tiny.loss_fn, config, other)(state0, clients)
  # Same float32 arithmetic in another order: agreement to ~1e-6.
  chex.assert_trees_all_close(got, ref, atol=1e-6, rtol=1e-5)
  chex.assert_trees_all_close(metrics, ref_metrics, atol=1e-6, rtol=1e-5)

  # A plain Python loop over the single-client function.
  w = clients.num_examples / jnp.sum(clients.num_examples)
  thetas, duals = [], []
  for i in range(5):
    c = tree.take(clients, i)
    t_i, y_i, _ = augfl.client_update(
        tiny.loss_fn, theta0, tree.take(state0.duals, i), c.support, c.query,
        weight=w[i], alpha=ALPHA, rho=RHO, delta=1 / 110)
    thetas.append(t_i)
    duals.append(y_i)
  loop_params = augfl.server_update(tiny.stack(thetas), tiny.stack(duals),
                                    jnp.full((5,), RHO))
  chex.assert_trees_all_close(loop_params, ref.params, atol=1e-6, rtol=1e-5)


def test_partial_participation_keeps_stale_clients():
  clients = tiny.client_data(seed=7, num_clients=4)
  theta0 = tiny.init(jax.random.key(6))
  config = augfl.AugFLConfig(alpha=ALPHA, rho=RHO)
  round_fn = augfl.make_round(tiny.loss_fn, config)
  state0 = augfl.init_state(theta0, 4)
  full, _ = round_fn(state0, clients)
  everyone, _ = round_fn(state0, clients, participants=jnp.arange(4))
  chex.assert_trees_all_close(full, everyone, atol=1e-6, rtol=1e-6)

  some = jnp.array([1, 3])
  part, _ = round_fn(state0, clients, participants=some)
  np.testing.assert_array_equal(part.client_rounds, [0, 1, 0, 1])
  # Non-sampled clients keep y_i = 0 and theta_i = theta^0 in the aggregate.
  chex.assert_trees_all_close(tree.take(part.client_params, 0), theta0)
  expected = augfl.server_update(part.client_params, part.duals,
                                 jnp.full((4,), RHO))
  chex.assert_trees_all_close(part.params, expected, atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_close(tree.take(part.client_params, 1),
                              tree.take(full.client_params, 1),
                              atol=1e-6, rtol=1e-6)


def test_lam_positive_without_reg_grad_is_an_error():
  clients = tiny.client_data(seed=8, num_clients=2)
  theta0 = tiny.init(jax.random.key(7))
  round_fn = augfl.make_round(tiny.loss_fn, augfl.AugFLConfig(lam=1.0))
  with pytest.raises(ValueError, match="reg_grad"):
    round_fn(augfl.init_state(theta0, 2), clients)


@pytest.mark.parametrize("bad", [dict(alpha=0.0), dict(rho=-1.0),
                                 dict(lam=-1.0), dict(hvp="taylor")])
def test_config_rejects_bad_values(bad):
  with pytest.raises(ValueError):
    augfl.AugFLConfig(**bad)
