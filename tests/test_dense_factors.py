"""core.dense_factors and algorithms.augfl.factored against the
materialised computation (float64)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import models
from augfl_jax.algorithms.augfl import factored
from augfl_jax.algorithms.augfl import round as augfl
from augfl_jax.core import dense_factors as df
from augfl_jax.core.types import ClientData


class SharedDense(nn.Module):
  """One Dense called twice, and a Dense on [n, t, d] inputs."""

  @nn.compact
  def __call__(self, x, mask=None):
    x = x.reshape((x.shape[0], 4, -1))
    h = nn.relu(nn.Dense(6, name="tokens")(x))  # [n, 4, 6]
    shared = nn.Dense(6, name="shared")
    h = nn.tanh(shared(nn.tanh(shared(h))))
    features = h.reshape((h.shape[0], -1))
    return features, nn.Dense(3, name="head")(features)


def _problem(name, clients=3, n=5, seed=0):
  shapes = {"mlp": (8, 8, 1), "cnn": (8, 8, 1), "shared": (8, 8, 1)}
  if name == "shared":
    model = SharedDense()
  else:
    kwargs = {"widths": (4,), "dense": 16} if name == "cnn" else {}
    model = models.create_model(name, 3, **kwargs)
  params = models.init_params(model, jax.random.PRNGKey(seed), shapes[name])
  params = jax.tree.map(lambda a: a.astype(jnp.float64), params)
  rng = np.random.default_rng(seed)

  def batch():
    return {"x": jnp.asarray(rng.standard_normal((clients, n) +
                                                 shapes[name])),
            "y": jnp.asarray(rng.integers(0, 3, (clients, n)), jnp.int32),
            "mask": jnp.ones((clients, n))}

  data = ClientData(support=batch(), query=batch(),
                    num_examples=jnp.asarray(
                        rng.integers(4, 9, clients), jnp.float64))
  return models.make_loss_fn(model), params, data


STRATEGY = "map"


def _max_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(x)) + 1e-30))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("name", ["mlp", "cnn", "shared"])
def test_factored_gradient_equals_the_gradient(name):
  with jax.enable_x64(True):
    _check_gradient(name)


def _check_gradient(name):
  loss_fn, params, data = _problem(name)
  batch = jax.tree.map(lambda a: a[0], data.support)
  layers = df.dense_kernels(loss_fn, params, batch)
  assert layers and all(path[-1] for path in layers)
  rng = np.random.default_rng(1)
  _, kernels = df._split(params, layers)  # pylint: disable=protected-access
  corrections = {p: df.Factors(jnp.asarray(rng.normal(size=(2, k.shape[0]))),
                               jnp.asarray(rng.normal(size=(2, k.shape[1]))))
                 for p, k in kernels.items()}
  shifted = df._join(*df._split(params, layers)[:1], {  # pylint: disable=protected-access
      p: k + 0.1 * corrections[p].u.T @ corrections[p].v
      for p, k in kernels.items()})
  value, rest, factors = df.value_and_grad(
      loss_fn, params, batch, layers=layers,
      corrections={p: c.scale(0.1) for p, c in corrections.items()})
  want_value, want = jax.value_and_grad(loss_fn)(shifted, batch)
  assert abs(float(value - want_value)) < 1e-13
  assert _max_diff(want, df.materialise(rest, factors)) < 1e-12


@pytest.mark.parametrize("name", ["mlp", "cnn", "shared"])
def test_factored_round_equals_the_round(name):
  with jax.enable_x64(True):
    _check_round(name)


def _check_round(name):
  loss_fn, params, data = _problem(name)
  config = augfl.AugFLConfig(alpha=0.05, rho=2.0)
  round_m = augfl.make_round(loss_fn, config, "map")
  round_f = factored.make_round(loss_fn, config, STRATEGY)
  state_m = augfl.init_state(params, 3)
  state_f = factored.init_state(loss_fn, params, data)
  # 5 rounds: further on, the tiny cnn's finite-difference HVP straddles a
  # relu/max-pool kink, where 1e-15 decides the branch and the round jumps
  # by O(1 / delta) in either implementation.
  for _ in range(5):
    state_m, metrics_m = round_m(state_m, data)
    state_f, metrics_f = round_f(state_f, data)
  assert _max_diff(state_m.params, state_f.params) < 1e-12
  assert abs(float(metrics_m["loss"] - metrics_f["loss"])) < 1e-12


@pytest.mark.parametrize("name", ["mlp", "shared"])
def test_factored_round_with_partial_participation(name):
  with jax.enable_x64(True):
    loss_fn, params, data = _problem(name, clients=5)
    config = augfl.AugFLConfig(alpha=0.05, rho=2.0, lam=0.5)
    round_m = augfl.make_round(loss_fn, config, "map")
    round_f = factored.make_round(loss_fn, config, STRATEGY)
    state_m = augfl.init_state(params, 5)
    state_f = factored.init_state(loss_fn, params, data, rho=config.rho,
                                  partial=True)
    reg = jax.tree.map(lambda a: 0.01 * jnp.ones_like(a), params)
    for ids in ([0, 2], [1, 2, 4], None, [3], [4, 0]):
      ids = None if ids is None else jnp.asarray(ids)
      state_m, _ = round_m(state_m, data, reg, ids)
      state_f, _ = round_f(state_f, data, reg, ids)
      assert _max_diff(state_m.params, state_f.params) < 1e-12
    with pytest.raises(ValueError, match="partial=True"):
      round_f(factored.init_state(loss_fn, params, data), data, reg,
              jnp.asarray([0]))


def test_the_state_keeps_its_shapes():
  with jax.enable_x64(True):
    loss_fn, params, data = _problem("shared")
    state = factored.init_state(loss_fn, params, data)
    after, _ = factored.make_round(loss_fn, augfl.AugFLConfig())(state, data)
    assert (jax.tree.map(jnp.shape, state) ==
            jax.tree.map(jnp.shape, after))
