"""FedPCL: the contrastive loss by hand, vmap vs map, a tiny federated run."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import models
from augfl_jax.algorithms.fedpcl import contrastive as fedpcl_contrastive
from augfl_jax.algorithms import fedpcl
from tests.test_fedproto import D, K, no_key, separable_clients


pytestmark = pytest.mark.usefixtures("exact_matmuls")


ENC_DIM = 10
_W_ENC = np.random.default_rng(7).normal(size=(D, ENC_DIM)).astype(
    np.float32) * 0.7


def encoder(x, mask):
  """A frozen 'pretrained' encoder: fixed random features."""
  del mask
  return jnp.tanh(x @ _W_ENC)


def _unit(v):
  v = np.asarray(v, np.float64)
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_padded_client_prototypes_fill_missing_classes_from_global():
  local = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
  counts = np.array([[2, 0, 0], [0, 0, 0]], np.float32)  # client 1: none
  glob = np.array([[9, 9], [8, 8], [0, 0]], np.float32)
  gcounts = np.array([2, 5, 0], np.float32)  # class 2: no prototype
  protos, valid = fedpcl_contrastive.padded_client_prototypes(
      jnp.asarray(local), jnp.asarray(counts), jnp.asarray(glob),
      jnp.asarray(gcounts))
  np.testing.assert_array_equal(protos[0, 0], local[0, 0])
  np.testing.assert_array_equal(protos[0, 1], glob[1])
  np.testing.assert_array_equal(protos[1, :2], glob[:2])
  np.testing.assert_array_equal(valid, [[True, True, False]] * 2)


def test_contrastive_loss_by_hand():
  tau = 0.5
  z = _unit([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.2], [5.0, 5.0]])
  labels = np.array([0, 1, 1, 2, 0])
  mask = np.array([1, 1, 1, 1, 0], np.float32)  # last row: padding
  glob = _unit([[1.0, 0.1], [0.2, 1.0], [1.0, 1.0]]) * 0.9
  gcounts = np.array([3.0, 4.0, 0.0])  # class 2 has no prototype
  # Two clients' prototype sets, already padded with the global ones.
  client = np.stack([np.stack([_unit([0.9, 0.3]) * 0.8, glob[1], glob[2]]),
                     np.stack([glob[0], _unit([-0.1, 1.0]), glob[2]])])
  valid = np.array([[True, True, False], [True, True, False]])

  def ce(zj, y, protos, ok):
    logits = {k: zj @ protos[k] / tau for k in range(3) if ok[k]}
    return -(logits[y] - np.log(sum(np.exp(v) for v in logits.values())))

  rows = [j for j in range(5) if mask[j] and gcounts[labels[j]] > 0]
  l_g = np.mean([ce(z[j], labels[j], glob, gcounts > 0) for j in rows])
  l_p = np.mean([np.mean([ce(z[j], labels[j], client[m], valid[m])
                          for j in rows]) for m in range(2)])
  loss, parts = jax.jit(fedpcl_contrastive.contrastive_loss,
                        static_argnames="temperature")(
      jnp.asarray(z, jnp.float32), jnp.asarray(labels), jnp.asarray(mask),
      jnp.asarray(glob, jnp.float32), jnp.asarray(gcounts, jnp.float32),
      jnp.asarray(client, jnp.float32), jnp.asarray(valid), temperature=tau)
  np.testing.assert_allclose(parts["global"], l_g, rtol=1e-5)
  np.testing.assert_allclose(parts["local"], l_p, rtol=1e-5)
  np.testing.assert_allclose(loss, l_g + l_p, rtol=1e-5)


def test_contrastive_loss_is_zero_without_prototypes():
  z = jnp.asarray(_unit([[1.0, 0.0], [0.0, 1.0]]), jnp.float32)
  zeros = jnp.zeros((3, 2))
  value, grad = jax.jit(jax.value_and_grad(
      lambda z: fedpcl_contrastive.contrastive_loss(
          z, jnp.array([0, 1]), jnp.ones(2), zeros, jnp.zeros(3),
          zeros[None], jnp.zeros((1, 3), bool), temperature=0.07)[0]))(z)
  assert float(value) == 0.0 and np.all(np.asarray(grad) == 0.0)


@pytest.fixture(scope="module")
def setup():
  projector = models.MLP(num_classes=K, hidden=(8,))
  params = jax.jit(lambda k: models.init_params(projector, k, (ENC_DIM,)))(
      jax.random.key(0))
  config = fedpcl.FedPCLConfig(lr=0.05, batch_size=4, local_epochs=2)
  return dict(
      model=projector, params=params, config=config,
      train=separable_clients(0, 5), test=separable_clients(1, 4),
      round=fedpcl.make_round(projector, config, "vmap",
                              encoder_apply=encoder),
      evaluate=fedpcl.make_evaluate(projector, config,
                                    encoder_apply=encoder))


@pytest.mark.slow
def test_round_vmap_equals_map(setup):
  state = fedpcl.init_state(setup["params"], 5, jax.random.key(3))
  state, _ = setup["round"](state, setup["train"])
  # Round 1 has no prototypes to contrast with: projectors do not move.
  chex.assert_trees_all_close(
      state.client_params,
      jax.tree.map(lambda p: jnp.broadcast_to(p, (5,) + p.shape),
                   setup["params"]))
  assert float(jnp.sum(state.global_counts)) == 5 * 12
  a, ma = setup["round"](state, setup["train"])
  b, mb = fedpcl.make_round(setup["model"], setup["config"], "map",
                            encoder_apply=encoder)(state, setup["train"])
  # Same arithmetic in a different batching: float32 rounding only.
  chex.assert_trees_all_close(no_key(a), no_key(b), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5)
  assert float(ma["loss"]) > 0
  # Round 2 trained: the projectors moved.
  assert not np.allclose(jax.tree.leaves(a.client_params)[0],
                         jax.tree.leaves(state.client_params)[0])


def test_few_rounds_beat_chance_on_held_out_clients(setup):
  state = fedpcl.init_state(setup["params"], 5, jax.random.key(4))
  for _ in range(3):
    state, metrics = setup["round"](state, setup["train"])
  assert np.isfinite(metrics["loss"])
  ev = setup["evaluate"](state, setup["test"])
  assert ev["client_accuracy"].shape == (4,)
  assert float(ev["accuracy"]) > 0.7, ev  # chance: 1/3
  assert np.isfinite(float(ev["loss"]))
  # The other rule is reported beside it, and predict="local" swaps them.
  local = fedpcl.make_evaluate(
      setup["model"], dataclasses.replace(setup["config"], predict="local"),
      encoder_apply=encoder)(state, setup["test"])
  np.testing.assert_allclose(local["accuracy"], ev["accuracy_local"])
  np.testing.assert_allclose(local["accuracy_global"], ev["accuracy"])
  # Embeddings are unit vectors, so local prototypes have norm <= 1.
  assert float(jnp.max(jnp.linalg.norm(state.global_protos, axis=-1))) <= 1.0
