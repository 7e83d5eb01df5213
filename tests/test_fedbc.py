"""FedBC and Per-FedBC against hand computations on the tiny model."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from augfl_jax.core import client_axis
from augfl_jax.core import local, tree
from augfl_jax.algorithms import fedbc
from tests import tiny

ravel = lambda p: np.asarray(ravel_pytree(p)[0], np.float64)


# The hand computations are jitted only to keep the file fast (eager
# dispatch of every small op dominates otherwise).
_grad = jax.jit(jax.grad(tiny.loss_fn))


def _data(clients, i):
  c = tree.take(clients, i)
  return local.concat_batches(c.support, c.query)


@jax.jit
def _step(w, g, lr):
  return jax.tree.map(lambda p, d: p - lr * d, w, g)


@jax.jit
def _prox_grad(w, z, batch, mu):
  """The gradient of f + mu/2 ||w - z||^2 (FedProx's local objective)."""
  return jax.tree.map(lambda gf, p, q: gf + mu * (p - q),
                      jax.grad(tiny.loss_fn)(w, batch), w, z)


def _prox_gd(w, z, batch, lr, mu, steps):
  """``steps`` GD steps on f + mu/2 ||w - z||^2, by hand."""
  for _ in range(steps):
    w = _step(w, _prox_grad(w, z, batch, mu), lr)
  return w


def _state(theta, num_clients, lambdas=None, gammas=None, seed=0):
  state = fedbc.init_state(theta, num_clients, jax.random.key(seed))
  if lambdas is not None:
    state = state.replace(lambdas=jnp.asarray(lambdas, jnp.float32))
  if gammas is not None:
    state = state.replace(gammas=jnp.asarray(gammas, jnp.float32))
  return state


def _tiny_eval(params, batch):
  pred = jnp.argmax(tiny.logits(params, batch["x"]), -1)
  return (tiny.loss_fn(params, batch),
          jnp.sum((pred == batch["y"]) * batch["mask"]))


# Sizes <= 8 per half, so |D_i| <= 16 real rows out of 24: batch_size 16 is
# one real minibatch per epoch followed by an all-padding one (a no-op).
SIZES = [3, 8, 5]
FULL = 16


def test_init_state_and_config_validation():
  theta = tiny.init(jax.random.key(0))
  state = fedbc.init_state(theta, 3, jax.random.key(1))
  assert state.lambdas.shape == (3,) and float(jnp.sum(state.lambdas)) == 0
  assert float(jnp.sum(state.gammas)) == 0 and int(state.round) == 0
  chex.assert_trees_all_equal(tree.take(state.client_params, 2), theta)
  for bad in (dict(lr=0.0), dict(lr_lambda=-1.0), dict(lambda_max=0.0),
              dict(start_from="w"), dict(momentum=1.0), dict(inner_steps=0),
              dict(lr_gamma=math.inf), dict(batch_size=0)):
    with pytest.raises(ValueError):
      fedbc.FedBCConfig(**bad)


def test_constant_lambda_is_fedprox():
  """lambda_i = mu/2 fixed: the client step is FedProx's, z the plain mean."""
  mu, lr, epochs = 0.8, 0.1, 3
  clients = tiny.client_data(seed=1, num_clients=3, sizes=SIZES)
  theta = tiny.init(jax.random.key(2))
  config = fedbc.FedBCConfig(lr=lr, local_epochs=epochs, batch_size=FULL,
                             lr_lambda=0.0, lr_gamma=0.0)
  state, metrics = fedbc.make_round(tiny.loss_fn, config)(
      _state(theta, 3, lambdas=[mu / 2] * 3), clients)
  models = [_prox_gd(theta, theta, _data(clients, i), lr, mu, epochs)
            for i in range(3)]
  chex.assert_trees_all_close(state.client_params, tiny.stack(models),
                              atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(state.lambdas, [mu / 2] * 3, rtol=1e-7)
  np.testing.assert_allclose(state.gammas, 0.0)
  # Equal lambdas: z is the UNIFORM mean (FedProx would weight by |D_i|).
  chex.assert_trees_all_close(
      state.params, jax.tree.map(lambda *p: sum(p) / 3, *models),
      atol=1e-6, rtol=1e-5)
  assert float(metrics["fallback"]) == 0.0


def test_one_client_round_is_proximal_sgd():
  """gamma = 0, one client: x = proximal heavy-ball GD, lambda' = lambda +
  a ||x - z||^2, gamma' = b lambda, z' = x."""
  lam0, lr, a, b, m, epochs = 0.3, 0.2, 0.5, 0.25, 0.5, 3
  clients = tiny.client_data(seed=2, num_clients=1, sizes=[6])
  theta = tiny.init(jax.random.key(3))
  config = fedbc.FedBCConfig(lr=lr, local_epochs=epochs, batch_size=FULL,
                             momentum=m, lr_lambda=a, lr_gamma=b)
  state, metrics = fedbc.make_round(tiny.loss_fn, config)(
      _state(theta, 1, lambdas=[lam0]), clients)
  data, x, buf, f = _data(clients, 0), theta, None, []
  for _ in range(epochs):  # torch.optim.SGD(momentum=m), one batch per epoch
    f.append(float(tiny.loss_fn(x, data)))
    g = _prox_grad(x, theta, data, 2 * lam0)
    buf = g if buf is None else jax.tree.map(lambda u, v: m * u + v, buf, g)
    x = _step(x, buf, lr)
  chex.assert_trees_all_close(tree.take(state.client_params, 0), x,
                              atol=1e-6, rtol=1e-5)
  d = np.sum((ravel(x) - ravel(theta)) ** 2)
  assert d > 0
  np.testing.assert_allclose(state.lambdas, [lam0 + a * d], rtol=1e-5)
  np.testing.assert_allclose(state.gammas, [b * lam0], rtol=1e-6)
  chex.assert_trees_all_close(state.params, x, atol=1e-6, rtol=1e-5)
  # Reported loss: f at the start of each (single, full) minibatch step.
  np.testing.assert_allclose(metrics["loss"], np.mean(f), rtol=1e-5)


@pytest.fixture(scope="module")
def dual_round():
  """One round (4 clients, minibatches) whose duals hit both clip ends."""
  config = fedbc.FedBCConfig(lr=0.3, local_epochs=2, batch_size=5,
                             lr_lambda=2.0, lr_gamma=0.3, lambda_max=0.9)
  lam0 = np.array([0.0, 0.5, 0.8, 0.1], np.float32)
  gam0 = np.array([5.0, 0.0, 0.0, 0.01], np.float32)
  clients = tiny.client_data(seed=3, num_clients=4, sizes=[4, 6, 8, 3])
  theta = tiny.init(jax.random.key(4))
  state, _ = fedbc.make_round(tiny.loss_fn, config)(
      _state(theta, 4, lam0, gam0), clients)
  return config, lam0, gam0, theta, state


def test_dual_updates_clip_and_use_old_lambda(dual_round):
  config, lam0, gam0, theta, state = dual_round
  d = np.array([np.sum((ravel(tree.take(state.client_params, i)) -
                        ravel(theta)) ** 2) for i in range(4)])
  raw = lam0 + config.lr_lambda * (d - gam0)
  np.testing.assert_allclose(state.lambdas, np.clip(raw, 0.0, 0.9),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(state.gammas, gam0 + config.lr_gamma * lam0,
                             rtol=1e-6)
  # The case split is exercised: one clipped at 0, one at lambda_max.
  assert raw[0] < 0 and raw.max() > 0.9
  # The pure function on its own.
  lam, gam = fedbc.dual_update(jnp.float32(0.2), jnp.float32(0.1),
                               jnp.float32(0.05), config)
  np.testing.assert_allclose([lam, gam], [0.1 + 2.0 * 0.15, 0.05 + 0.3 * 0.1],
                             rtol=1e-6)


def test_zero_lambdas_fall_back_to_sample_weighted_mean():
  clients = tiny.client_data(seed=4, num_clients=3, sizes=SIZES)
  theta = tiny.init(jax.random.key(5))
  config = fedbc.FedBCConfig(lr=0.2, local_epochs=2, batch_size=FULL,
                             lr_lambda=1e-3)
  # lambda = 0 and a tolerance far above ||x - z||^2: lambda stays at 0.
  state, metrics = fedbc.make_round(tiny.loss_fn, config)(
      _state(theta, 3, gammas=[1e3] * 3), clients)
  np.testing.assert_array_equal(state.lambdas, 0.0)
  assert float(metrics["fallback"]) == 1.0
  n = np.asarray(clients.num_examples, np.float64)
  xs = [ravel(tree.take(state.client_params, i)) for i in range(3)]
  np.testing.assert_allclose(ravel(state.params),
                             sum(w * x for w, x in zip(n / n.sum(), xs)),
                             atol=1e-6)
  # With lambda = 0 the local update is plain GD (FedAvg's).
  chex.assert_trees_all_close(
      tree.take(state.client_params, 1),
      _step(_step(theta, _grad(theta, _data(clients, 1)), 0.2),
            _grad(_step(theta, _grad(theta, _data(clients, 1)), 0.2),
                  _data(clients, 1)), 0.2), atol=1e-6, rtol=1e-5)


def test_aggregation_is_lambda_weighted_with_new_lambdas(dual_round):
  _, lam0, _, _, state = dual_round
  lam = np.asarray(state.lambdas, np.float64)
  assert not np.allclose(lam, lam0)  # new and old lambdas differ
  xs = [ravel(tree.take(state.client_params, i)) for i in range(4)]
  np.testing.assert_allclose(ravel(state.params),
                             sum(l * x for l, x in zip(lam, xs)) / lam.sum(),
                             atol=1e-6)
  # server_update alone, weights not summing to 1.
  stacked = {"a": jnp.array([[1.0, 2.0], [3.0, 6.0]])}
  got = fedbc.server_update(stacked, jnp.array([1.0, 3.0]), jnp.array([5., 1.]))
  np.testing.assert_allclose(got["a"], [2.5, 5.0], rtol=1e-6)


def test_per_fedbc_outer_steps_by_hand():
  """Algorithm 3, J = 2, full minibatches: by hand, with the padded outer
  steps (|D_i| <= B < rows) left out."""
  alpha, beta, lam0, gam0, epochs = 0.2, 0.5, 0.3, 0.01, 2
  clients = tiny.client_data(seed=6, num_clients=2, sizes=[4, 7])
  theta = tiny.init(jax.random.key(7))
  config = fedbc.FedBCConfig(personalized=True, alpha=alpha, beta=beta,
                             inner_steps=2, local_epochs=epochs,
                             batch_size=FULL, lr_lambda=0.0, lr_gamma=0.0)
  state, _ = fedbc.make_round(tiny.loss_fn, config)(
      _state(theta, 2, [lam0] * 2, [gam0] * 2), clients)
  for i in range(2):
    data, w = _data(clients, i), theta
    for _ in range(epochs):  # ceil(|D_i| / B) = 1 outer step per epoch
      v = _prox_gd(w, theta, data, alpha, 2 * lam0, 2)  # inner loop
      w = _step(w, _grad(v, data), beta)  # first-order outer step
    chex.assert_trees_all_close(tree.take(state.client_params, i), w,
                                atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("personalized", [False, True])
def test_vmap_and_map_strategies_agree(personalized):
  clients = tiny.client_data(seed=7, num_clients=4)
  theta = tiny.init(jax.random.key(8))
  config = fedbc.FedBCConfig(lr=0.2, local_epochs=2, batch_size=3,
                             momentum=0.5, lr_lambda=0.1, lr_gamma=0.05,
                             personalized=personalized, alpha=0.1, beta=0.2,
                             start_from="x")
  def run(strategy):
    round_fn = fedbc.make_round(tiny.loss_fn, config, strategy)
    state = _state(theta, 4, lambdas=[0.1, 0.0, 0.3, 0.2])
    for _ in range(2):
      state, metrics = round_fn(state, clients, jnp.array([0, 2, 3]))
    return state, metrics
  ref, ref_m = run("vmap")
  for strategy in (client_axis.ClientStrategy("map"),):
    got, got_m = run(strategy)
    # Same keys, same arithmetic; float rounding differs: 1e-6 abs / 1e-5 rel.
    for field in ("params", "client_params", "lambdas", "gammas"):
      chex.assert_trees_all_close(getattr(got, field), getattr(ref, field),
                                  atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(got_m["loss"], ref_m["loss"], rtol=1e-5)
  assert not np.allclose(ravel(ref.params), ravel(theta))


def test_only_participants_change():
  """Starting from x_i (start_from="x"; every other test starts from z)."""
  start_from = "x"
  clients = tiny.client_data(seed=8, num_clients=4, sizes=[4, 6, 8, 5])
  theta = tiny.init(jax.random.key(9))
  config = fedbc.FedBCConfig(lr=0.2, local_epochs=1, batch_size=FULL,
                             lr_lambda=0.5, lr_gamma=0.5,
                             start_from=start_from)
  # A mid-run state: x_i != z, different duals.
  xs0 = tiny.stack([tiny.init(jax.random.key(30 + i)) for i in range(4)])
  state0 = _state(theta, 4, lambdas=[0.2, 0.1, 0.3, 0.4],
                  gammas=[0.01, 0.02, 0.0, 0.03]).replace(client_params=xs0)
  state1, _ = fedbc.make_round(tiny.loss_fn, config)(state0, clients,
                                                      jnp.array([1, 3]))
  for i in (0, 2):
    chex.assert_trees_all_equal(tree.take(state1.client_params, i),
                                tree.take(state0.client_params, i))
    assert state1.lambdas[i] == state0.lambdas[i]
    assert state1.gammas[i] == state0.gammas[i]
  for i in (1, 3):
    assert state1.gammas[i] != state0.gammas[i]
    # Full-batch GD from z (or x_i) on the client's Lagrangian, by hand.
    start = (state0.params if start_from == "z"
             else tree.take(state0.client_params, i))
    x = _prox_gd(start, state0.params, _data(clients, i), 0.2,
                 2 * float(state0.lambdas[i]), 1)
    chex.assert_trees_all_close(tree.take(state1.client_params, i), x,
                                atol=1e-6, rtol=1e-5)
  lam = np.asarray(state1.lambdas)[[1, 3]]
  xs = [ravel(tree.take(state1.client_params, i)) for i in (1, 3)]
  np.testing.assert_allclose(ravel(state1.params),
                             (lam[0] * xs[0] + lam[1] * xs[1]) / lam.sum(),
                             atol=1e-6)


@pytest.mark.parametrize("personalized", [False, True])
def test_held_out_evaluation_adapts_z_on_support(personalized):
  test = tiny.client_data(seed=10, num_clients=2)
  state = _state(tiny.init(jax.random.key(10)), 3, lambdas=[0.1] * 3)
  config = fedbc.FedBCConfig(lr=0.3, alpha=0.25, inner_steps=2,
                             personalized=personalized)
  own = (0.25, 2) if personalized else (0.3, 1)
  for (alpha, steps), kwargs in ((own, {}),
                                 ((0.05, 3), dict(eval_alpha=0.05,
                                                  eval_steps=3))):
    metrics = fedbc.make_evaluate(tiny.loss_fn, _tiny_eval, config,
                                  **kwargs)(state, test)
    for i in range(2):
      c = tree.take(test, i)
      p = state.params
      for _ in range(steps):
        p = _step(p, _grad(p, c.support), alpha)
      acc = _tiny_eval(p, c.query)[1] / c.query["mask"].sum()
      np.testing.assert_allclose(metrics["client_accuracy"][i], acc, atol=1e-6)


def test_local_and_global_accuracy():
  clients = tiny.client_data(seed=11, num_clients=3)
  theta = tiny.init(jax.random.key(11))
  models = [tiny.init(jax.random.key(20 + i)) for i in range(3)]
  state = _state(theta, 3).replace(client_params=tiny.stack(models))
  got = fedbc.make_evaluate_local(tiny.loss_fn, _tiny_eval)(state, clients)
  correct_l, correct_g, counts = [], [], []
  for i in range(3):
    q = tree.take(clients, i).query
    correct_l.append(float(_tiny_eval(models[i], q)[1]))
    correct_g.append(float(_tiny_eval(theta, q)[1]))
    counts.append(float(q["mask"].sum()))
  counts = np.array(counts)
  np.testing.assert_allclose(got["local_client_accuracy"],
                             np.array(correct_l) / counts, atol=1e-6)
  np.testing.assert_allclose(got["local_accuracy"],
                             sum(correct_l) / counts.sum(), atol=1e-6)
  np.testing.assert_allclose(got["global_accuracy"],
                             sum(correct_g) / counts.sum(), atol=1e-6)
  assert not np.allclose(got["local_client_accuracy"],
                         got["global_client_accuracy"])
