"""FedCP: the feature split, the MMD, aggregation, vmap vs map, a tiny run."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import models
from augfl_jax.algorithms import fedcp
from tests.test_fedproto import K, init_params, no_key, separable_clients


pytestmark = pytest.mark.usefixtures("exact_matmuls")


@pytest.mark.parametrize("with_noise", [False, True])
def test_split_recombines_and_policy_is_a_probability(with_noise):
  d, n = 5, 7
  cpn = jax.jit(lambda k: fedcp.model.ConditionalPolicy(d).init(
      k, jnp.zeros((1, d)))["params"])(jax.random.key(0))
  rng = np.random.default_rng(0)
  feats = jnp.asarray(rng.normal(size=(n, d)).astype(np.float32)) * 3
  context = jnp.asarray(rng.uniform(size=(d,)).astype(np.float32))
  noise = fedcp.model.gumbel_noise(jax.random.key(1), (n, 2, d)) if with_noise \
      else None
  r_p, r_g, p, g = jax.jit(fedcp.model.split_features)(cpn, feats, context,
                                                        noise)
  np.testing.assert_allclose(r_p + r_g, feats, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(p + g, 1.0, rtol=1e-6)
  assert np.all((p >= 0) & (p <= 1)) and np.all((g >= 0) & (g <= 1))
  np.testing.assert_allclose(r_p, feats * p, rtol=1e-6)
  # The policy depends on the sample: not the same mask for every row.
  assert float(jnp.std(p, axis=0).max()) > 1e-3


def test_mmd_against_a_double_loop():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(6, 3)).astype(np.float32) * 4
  y = rng.normal(size=(6, 3)).astype(np.float32) * 4 + 1
  mask = np.array([1, 1, 1, 1, 0, 0], np.float32)
  x[4:], y[4:] = 1e4, -1e4  # padding may hold anything
  k = lambda a, b: sum(np.exp(-0.5 * np.sum((a - b) ** 2) / s)
                       for s in (10, 15, 20, 50))
  real = range(4)
  expected = np.mean([k(x[j], x[l]) + k(y[j], y[l]) - 2 * k(x[j], y[l])
                      for j in real for l in real])
  got = jax.jit(fedcp.model.mmd)(jnp.asarray(x), jnp.asarray(y),
                                 jnp.asarray(mask))
  np.testing.assert_allclose(got, expected, rtol=1e-4)


def test_context_is_the_normalised_class_sum_of_the_personal_head():
  kernel = np.array([[1.0, 2.0], [0.0, -3.0], [4.0, 0.0]], np.float32)
  v = jax.jit(fedcp.model.context_vector)({"kernel": jnp.asarray(kernel),
                                     "bias": jnp.zeros(2)})
  np.testing.assert_allclose(v, np.array([3.0, -3.0, 4.0]) / np.sqrt(34),
                             rtol=1e-6)


@pytest.fixture(scope="module")
def setup():
  model = models.MLP(num_classes=K, hidden=(8,))
  config = fedcp.FedCPConfig(lr=0.05, batch_size=4, local_epochs=2)
  return dict(model=model, params=init_params(model, jax.random.key(0)),
              config=config, train=separable_clients(0, 5),
              test=separable_clients(1, 4),
              round=fedcp.make_round(model, config, "vmap"),
              evaluate=fedcp.make_evaluate(model, config))


@pytest.mark.slow
def test_round_vmap_equals_map_and_aggregates_the_mixed_heads(setup):
  state = fedcp.init_state(setup["params"], 5, jax.random.key(3))
  a, ma = setup["round"](state, setup["train"])
  b, mb = fedcp.make_round(setup["model"], setup["config"], "map")(
      state, setup["train"])
  # Same arithmetic in a different batching: float32 rounding only.
  chex.assert_trees_all_close(no_key(a), no_key(b), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5)
  # Personal heads are kept per client and differ after training.
  kernels = np.asarray(a.personal_heads["kernel"])
  assert kernels.shape == (5, 8, K)
  assert not np.allclose(kernels[0], kernels[1])
  # New global head = sample-weighted mean of 0.5 W^hp_i + 0.5 W^hg.
  w = np.asarray(setup["train"].num_examples)
  w = w / w.sum()
  for leaf in ("kernel", "bias"):
    old = np.asarray(state.params["head"][leaf])
    mixed = 0.5 * np.asarray(a.personal_heads[leaf]) + 0.5 * old[None]
    np.testing.assert_allclose(a.params["head"][leaf],
                               np.tensordot(w, mixed, axes=1),
                               rtol=1e-5, atol=1e-6)
  # The feature extractor and the CPN are shared and did move.
  assert not np.allclose(a.params["fc1"]["kernel"],
                         state.params["fc1"]["kernel"])
  assert not np.allclose(a.cpn["fc"]["kernel"], state.cpn["fc"]["kernel"])


def test_few_rounds_beat_chance_on_held_out_clients(setup):
  state = fedcp.init_state(setup["params"], 5, jax.random.key(4))
  for _ in range(6):
    state, metrics = setup["round"](state, setup["train"])
  assert np.isfinite(metrics["loss"])
  ev = setup["evaluate"](state, setup["test"])
  assert ev["client_accuracy"].shape == (4,)
  assert float(ev["accuracy"]) > 0.6, ev  # chance: 1/3
  assert np.isfinite(float(ev["loss"]))


def test_held_out_clients_adapt_at_eval_lr(setup):
  """eval_lr changes only the held-out clients' step size: scoring with
  (lr, eval_lr=b) is scoring with lr=b, and eval_lr=None is lr."""
  state = fedcp.init_state(setup["params"], 5, jax.random.key(5))
  state, _ = setup["round"](state, setup["train"])
  config = setup["config"]
  score = lambda c: fedcp.make_evaluate(setup["model"], c)(state,
                                                           setup["test"])
  at = lambda **kw: score(dataclasses.replace(config, **kw))
  chex.assert_trees_all_close(at(eval_lr=0.5), at(lr=0.5))
  chex.assert_trees_all_close(at(eval_lr=config.lr), setup["evaluate"](
      state, setup["test"]))
  assert not np.allclose(at(eval_lr=0.5)["loss"], at(eval_lr=0.001)["loss"])
  with pytest.raises(ValueError, match="eval_lr must be > 0"):
    fedcp.FedCPConfig(eval_lr=0.0)
