"""FedAvg, Per-FedAvg, local SGD and fast-adaptation evaluation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax.core import evaluation, local, tree
from augfl_jax.algorithms import fedavg, per_fedavg
from tests import tiny


def _gd(params, batch, lr):
  return jax.tree.map(lambda p, g: p - lr * g, params,
                      jax.grad(tiny.loss_fn)(params, batch))


def test_epoch_batches_visit_every_real_row_once_first():
  rng = np.random.default_rng(0)
  b = tiny.batch(rng, 7, pad=6)
  b = dict(b, y=jnp.arange(13, dtype=jnp.int32))  # identify rows
  epoch = local.epoch_batches(jax.random.key(0), b, batch_size=3)
  assert epoch["mask"].shape == (5, 3)  # ceil(13 / 3) static steps
  real_rows = np.asarray(epoch["y"])[np.asarray(epoch["mask"]) > 0]
  assert sorted(real_rows.tolist()) == list(range(7))
  # Real rows come first: ceil(7 / 3) = 3 steps carry them all.
  np.testing.assert_array_equal(np.asarray(epoch["mask"]).sum(1), [3, 3, 1, 0, 0])


def test_sample_batch_draws_real_rows_without_replacement():
  rng = np.random.default_rng(1)
  b = dict(tiny.batch(rng, 4, pad=3), y=jnp.arange(7, dtype=jnp.int32))
  small = local.sample_batch(jax.random.key(1), b, 3)
  assert np.all(np.asarray(small["mask"]) == 1)
  assert len(set(np.asarray(small["y"]).tolist())) == 3
  big = local.sample_batch(jax.random.key(1), b, 10)
  assert big["mask"].shape == (10,) and float(big["mask"].sum()) == 4


@pytest.mark.parametrize("train_on", ["all", "support"])
def test_fedavg_full_batch_round_is_weighted_mean_of_gd_steps(train_on):
  """FedAvg's local data is support + query; the AugFL authors' FedAvg
  (``train_on="support"``) trains on the support set alone."""
  clients = tiny.client_data(seed=2, num_clients=3)
  theta = tiny.init(jax.random.key(0))
  config = fedavg.FedAvgConfig(lr=0.1, local_epochs=2, batch_size=64,
                               train_on=train_on)
  state, metrics = fedavg.make_round(tiny.loss_fn, config)(
      fedavg.init_state(theta, jax.random.key(9)), clients)
  models = []
  for i in range(3):
    c = tree.take(clients, i)
    data = (c.support if train_on == "support" else
            local.concat_batches(c.support, c.query))
    models.append(_gd(_gd(theta, data, 0.1), data, 0.1))
  w = np.asarray(clients.num_examples) / np.sum(clients.num_examples)
  expected = jax.tree.map(lambda *ps: sum(wi * p for wi, p in zip(w, ps)),
                          *models)
  chex.assert_trees_all_close(state.params, expected, atol=1e-6, rtol=1e-5)
  assert int(state.round) == 1 and metrics["client_loss"].shape == (3,)


@pytest.mark.parametrize("variant,method", [("fo", "finite_difference"),
                                            ("hf", "exact"),
                                            ("hf", "finite_difference")])
def test_per_fedavg_meta_step_against_direct_computation(variant, method):
  rng = np.random.default_rng(3)
  theta = tiny.init(jax.random.key(1))
  d, d1, d2 = tiny.batch(rng, 6), tiny.batch(rng, 5), tiny.batch(rng, 4)
  config = per_fedavg.PerFedAvgConfig(alpha=0.05, beta=0.1, variant=variant,
                                      hvp=method, hf_delta=1e-3)
  got, _ = per_fedavg.meta_step(tiny.loss_fn, config, theta, d, d1, d2)
  adapted = _gd(theta, d, 0.05)
  outer = jax.grad(tiny.loss_fn)(adapted, d1)
  flat, unravel = jax.flatten_util.ravel_pytree(theta)
  if variant == "hf":
    hess = jax.hessian(lambda f: tiny.loss_fn(unravel(f), d2))(flat)
    outer_flat = jax.flatten_util.ravel_pytree(outer)[0]
    outer = unravel(outer_flat - 0.05 * hess @ outer_flat)
  expected = jax.tree.map(lambda p, g: p - 0.1 * g, theta, outer)
  # Finite differences in float32 at delta = 1e-3: ~1e-4 agreement.
  tol = 1e-4 if method == "finite_difference" and variant == "hf" else 1e-6
  chex.assert_trees_all_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("algo", [
    "fedavg", pytest.param("per_fedavg", marks=pytest.mark.slow)])
def test_strategies_agree_and_seed_controls_randomness(algo):
  from augfl_jax.core import client_axis
  clients = tiny.client_data(seed=4, num_clients=4)
  theta = tiny.init(jax.random.key(2))
  module = {"fedavg": fedavg, "per_fedavg": per_fedavg}[algo]
  config = (fedavg.FedAvgConfig(batch_size=4) if algo == "fedavg" else
            per_fedavg.PerFedAvgConfig(batch_size=3, local_steps=2))
  run = lambda strategy, seed: module.make_round(
      tiny.loss_fn, config, strategy)(
          module.init_state(theta, jax.random.key(seed)), clients)[0]
  ref = run("vmap", 0)
  chex.assert_trees_all_close(run(client_axis.ClientStrategy("map"), 0).params,
                              ref.params, atol=1e-6, rtol=1e-5)
  chex.assert_trees_all_close(run("vmap", 0).params, ref.params, atol=0, rtol=0)
  assert not np.allclose(jax.flatten_util.ravel_pytree(run("vmap", 1).params)[0],
                         jax.flatten_util.ravel_pytree(ref.params)[0])


def test_averaging_with_participants_averages_only_them():
  clients = tiny.client_data(seed=5, num_clients=4)
  theta = tiny.init(jax.random.key(3))
  config = fedavg.FedAvgConfig(lr=0.1, batch_size=64)
  round_fn = fedavg.make_round(tiny.loss_fn, config)
  state0 = fedavg.init_state(theta, jax.random.key(0))
  part, _ = round_fn(state0, clients, jnp.array([0, 2]))
  sub = tree.take(clients, jnp.array([0, 2]))
  # Full-batch local steps do not depend on keys: same as a run on {0, 2}.
  only, _ = round_fn(state0, sub)
  chex.assert_trees_all_close(part.params, only.params, atol=1e-6, rtol=1e-5)


def _tiny_eval(params, batch):
  pred = jnp.argmax(tiny.logits(params, batch["x"]), -1)
  return tiny.loss_fn(params, batch), jnp.sum((pred == batch["y"]) * batch["mask"])


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_fast_adaptation_evaluation_against_manual(steps):
  clients = tiny.client_data(seed=6, num_clients=3)
  theta = tiny.init(jax.random.key(4))
  evaluate = evaluation.make_evaluator(tiny.loss_fn, _tiny_eval, alpha=0.2,
                                       steps=steps)
  got = evaluate(theta, clients)
  correct, counts = [], []
  for i in range(3):
    c = tree.take(clients, i)
    p = theta
    for _ in range(steps):
      p = _gd(p, c.support, 0.2)
    correct.append(float(_tiny_eval(p, c.query)[1]))
    counts.append(float(c.query["mask"].sum()))
  acc = np.array(correct) / np.array(counts)
  np.testing.assert_allclose(got["client_accuracy"], acc, atol=1e-6)
  np.testing.assert_allclose(got["accuracy"], sum(correct) / sum(counts),
                             atol=1e-6)
  np.testing.assert_allclose(got["accuracy_std"], np.std(acc), atol=1e-6)


def test_evaluation_with_one_model_per_client():
  clients = tiny.client_data(seed=7, num_clients=2)
  models = [tiny.init(jax.random.key(i)) for i in (5, 6)]
  evaluate = evaluation.make_evaluator(tiny.loss_fn, _tiny_eval, alpha=0.1,
                                       steps=0, per_client_params=True)
  got = evaluate(tiny.stack(models), clients)
  for i in range(2):
    c = tree.take(clients, i)
    expected = _tiny_eval(models[i], c.query)[1] / c.query["mask"].sum()
    np.testing.assert_allclose(got["client_accuracy"][i], expected, atol=1e-6)


def test_summarise_weights_by_samples_and_guards_zero_counts():
  loss = jnp.array([0.5, 7.0, 1.0])
  correct = jnp.array([3.0, 0.0, 1.0])
  count = jnp.array([4.0, 0.0, 2.0])  # client 1 has nothing to score
  got = evaluation.summarise(loss, correct, count)
  np.testing.assert_allclose(got["client_accuracy"], [0.75, 0.0, 0.5])
  np.testing.assert_allclose(got["accuracy"], 4.0 / 6.0, rtol=1e-6)
  np.testing.assert_allclose(got["accuracy_std"], np.std([0.75, 0.0, 0.5]),
                             rtol=1e-6)
  np.testing.assert_allclose(got["loss"], (4 * 0.5 + 2 * 1.0) / 6.0,
                             rtol=1e-6)
  # No example at all: zeros, not NaN; no loss asked, none reported.
  empty = evaluation.summarise(None, jnp.zeros(2), jnp.zeros(2),
                               suffix="_head")
  assert set(empty) == {"accuracy_head", "accuracy_std_head",
                        "client_accuracy_head"}
  for value in empty.values():
    np.testing.assert_array_equal(value, 0.0)
  assert float(evaluation.summarise(jnp.ones(2), jnp.zeros(2),
                                    jnp.zeros(2))["loss"]) == 0.0
