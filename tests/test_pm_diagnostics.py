"""AugFL w/ PM's per-round diagnostics against independent computations:
the norms of Eq. (13)'s parts from the state the round returns, and the
clients' losses around the adaptation step from a loop over clients."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from augfl_jax import models
from augfl_jax.algorithms.augfl import pm_aided
from augfl_jax.algorithms import augfl
from augfl_jax.models.mlp import MLP
from tests import tiny

C = 4


def _setup(lam=2.0, diagnostics=True, dense_updates="materialised"):
  model = MLP(num_classes=tiny.K, hidden=(6,))
  params = models.init_params(model, jax.random.key(0), (tiny.D,))
  reg_grad = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
  pm = (lambda key, p: jnp.zeros(()),
        lambda p, state: (reg_grad, state + 1, {"r_h": jnp.ones(())}))
  config = augfl.AugFLConfig(lam=lam, rho=0.7, alpha=0.05,
                             diagnostics=diagnostics,
                             dense_updates=dense_updates)
  algo = pm_aided.augfl_pm(model, config, strategy="vmap",
                           pm=pm if lam > 0 else None)
  clients = tiny.client_data(num_clients=C)
  state = algo.init_from_clients(params, clients, jax.random.key(1), False)
  return model, config, algo, clients, state, reg_grad


def _norm(tree):
  return float(np.sqrt(sum(np.sum(np.asarray(l, np.float64) ** 2)
                           for l in jax.tree.leaves(tree))))


@pytest.mark.parametrize("lam", [2.0, 0.0])
def test_server_step_norms_are_those_of_eq13s_parts(lam):
  _, config, algo, clients, state, reg_grad = _setup(lam=lam)
  for _ in range(2):  # the second round has non-zero duals
    old = state
    state, metrics = algo.round(state, clients)
  new = state.augfl
  # Eq. (13)'s consensus from the returned duals and client models.
  rho_sum = config.rho * C
  consensus = jax.tree.map(
      lambda y, t: (np.asarray(y, np.float64).sum(0)
                    + config.rho * np.asarray(t, np.float64).sum(0))
      / rho_sum, new.duals, new.client_params)
  theta = jax.tree.map(lambda p: np.asarray(p, np.float64), old.augfl.params)
  reg_step = jax.tree.map(lambda g: lam / rho_sum * np.asarray(g, np.float64),
                          reg_grad)
  # the parts add up to theta^{t+1}
  chex.assert_trees_all_close(
      jax.tree.map(lambda c, s: c - s, consensus, reg_step), new.params,
      rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      metrics["server_consensus_norm"],
      _norm(jax.tree.map(lambda c, t: c - t, consensus, theta)), rtol=1e-4)
  np.testing.assert_allclose(metrics["server_reg_norm"], _norm(reg_step),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(
      metrics["server_update_norm"],
      _norm(jax.tree.map(lambda n, t: np.asarray(n, np.float64) - t,
                         new.params, theta)), rtol=1e-4)


def test_factored_round_reports_the_same_norms():
  metrics = {}
  for dense_updates in ("materialised", "factored"):
    _, _, algo, clients, state, _ = _setup(dense_updates=dense_updates)
    state, _ = algo.round(state, clients)
    _, metrics[dense_updates] = algo.round(state, clients)
  for name in ("server_update_norm", "server_consensus_norm",
               "server_reg_norm"):
    np.testing.assert_allclose(metrics["factored"][name],
                               metrics["materialised"][name], rtol=1e-4)


def test_adaptation_losses_match_a_loop_over_clients():
  model, config, algo, clients, state, _ = _setup()
  _, metrics = algo.round(state, clients)
  loss_fn = models.make_loss_fn(model)
  theta = state.augfl.params
  per_client = []
  for i in range(C):
    support = jax.tree.map(lambda a: a[i], clients.support)
    query = jax.tree.map(lambda a: a[i], clients.query)
    phi = jax.tree.map(lambda p, g: p - config.alpha * g, theta,
                       jax.grad(loss_fn)(theta, support))
    per_client.append([loss_fn(theta, support), loss_fn(phi, support),
                       loss_fn(theta, query), loss_fn(phi, query)])
  n = np.asarray(clients.num_examples)
  expected = (n / n.sum()) @ np.asarray(per_client)
  got = [metrics[k] for k in ("adapt_support_before", "adapt_support_after",
                              "adapt_query_before", "adapt_query_after")]
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # the round's own losses are two of them
  np.testing.assert_allclose(metrics["support_loss"], expected[0], rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], expected[3], rtol=1e-5)
  # one adaptation step lowers the support loss it descends
  assert expected[1] < expected[0]


def test_diagnostics_off_records_no_client_losses_and_change_no_round():
  _, _, on, clients, state, _ = _setup(diagnostics=True)
  _, _, off, _, _, _ = _setup(diagnostics=False)
  new_on, m_on = on.round(state, clients)
  new_off, m_off = off.round(state, clients)
  assert not any(k.startswith("adapt_") for k in m_off)
  assert "server_update_norm" in m_off
  chex.assert_trees_all_equal(new_on, new_off)


def test_diagnostics_is_a_free_field_on_resume():
  from augfl_jax.core import fields  # pylint: disable=g-import-not-at-top
  assert "diagnostics" in fields.select(augfl.AugFLConfig(), resume="free")


def test_reg_scale_warms_lam_up_and_bounds_the_step():
  grad = {"w": jnp.asarray([3.0, 4.0])}  # norm 5
  config = augfl.AugFLConfig(lam=2.0, lam_warmup=4)
  # lam_t = lam min(1, t / 4); rho_sum 10: step norm lam_t * 5 / 10
  for t, expected in [(1, 0.25), (2, 0.5), (4, 1.0), (9, 1.0)]:
    np.testing.assert_allclose(
        pm_aided.reg_scale(jnp.asarray(t), grad, config, 10.0), expected)
  bounded = augfl.AugFLConfig(lam=2.0, reg_max_norm=0.5)  # step 1.0 > 0.5
  np.testing.assert_allclose(
      pm_aided.reg_scale(jnp.asarray(1), grad, bounded, 10.0), 0.5)
  short = augfl.AugFLConfig(lam=2.0, reg_max_norm=3.0)  # step 1.0 <= 3
  np.testing.assert_allclose(
      pm_aided.reg_scale(jnp.asarray(1), grad, short, 10.0), 1.0)
  both = augfl.AugFLConfig(lam=2.0, lam_warmup=2, reg_max_norm=0.25)
  # t = 1: warmed step 0.5, bounded to 0.25: 0.5 * 0.5
  np.testing.assert_allclose(
      pm_aided.reg_scale(jnp.asarray(1), grad, both, 10.0), 0.25)


@pytest.mark.parametrize("options", [dict(lam_warmup=3),
                                     dict(reg_max_norm=0.01)])
def test_the_options_scale_the_server_steps_r_h_part(options):
  """theta^{t+1} with an option equals the paper's round given the scaled
  gradient: the round of a regulariser whose gradient is reg_scale times
  the PM's."""
  model = MLP(num_classes=tiny.K, hidden=(6,))
  params = models.init_params(model, jax.random.key(0), (tiny.D,))
  reg_grad = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
  clients = tiny.client_data(num_clients=C)

  def algo(config, factor):
    pm = (lambda key, p: jnp.zeros(()),
          lambda p, s: (optax.tree.scale(factor, reg_grad), s, {}))
    return pm_aided.augfl_pm(model, config, strategy="vmap", pm=pm)

  base = dict(lam=2.0, rho=0.7, alpha=0.05, dense_updates="materialised")
  with_option = algo(augfl.AugFLConfig(**base, **options), 1.0)
  state = with_option.init_from_clients(params, clients, jax.random.key(1),
                                        False)
  new, metrics = with_option.round(state, clients)
  scale = float(metrics["server_reg_scale"])
  assert 0 < scale < 1
  paper = algo(augfl.AugFLConfig(**base), scale)
  expected, paper_metrics = paper.round(state, clients)
  chex.assert_trees_all_close(new.augfl.params, expected.augfl.params,
                              rtol=1e-6, atol=1e-7)
  assert "server_reg_scale" not in paper_metrics
  if "reg_max_norm" in options:
    np.testing.assert_allclose(metrics["server_reg_norm"], 0.01, rtol=1e-5)
