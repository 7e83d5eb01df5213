"""FedProto and the shared prototype helpers against direct computations."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import models
from augfl_jax.algorithms import fedproto, prototypes
from augfl_jax.core.types import ClientData

K, D = 3, 6


pytestmark = pytest.mark.usefixtures("exact_matmuls")


def separable_clients(seed, num_clients, n=6, pad=2, num_classes=K, dim=D):
  """Clients holding 2 of ``num_classes`` well-separated Gaussian classes.

  Class k is centred on ``2.5 e_k``; each client has ``n`` real support and
  ``n`` real query examples plus ``pad`` padded rows (garbage inputs).
  """
  rng = np.random.default_rng(seed)

  def batch(classes):
    y = rng.choice(classes, n + pad).astype(np.int32)
    x = (rng.normal(size=(n + pad, dim)) * 0.5
         + 2.5 * np.eye(dim)[y]).astype(np.float32)
    x[n:], y[n:] = 1e3, -1
    return x, y

  sets = {"support": [], "query": []}
  for _ in range(num_clients):
    classes = rng.choice(num_classes, 2, replace=False)
    for name in sets:
      sets[name].append(batch(classes))
  mask = np.tile(np.r_[np.ones(n), np.zeros(pad)].astype(np.float32),
                 (num_clients, 1))
  data = {name: {"x": jnp.asarray(np.stack([b[0] for b in batches])),
                 "y": jnp.asarray(np.stack([b[1] for b in batches])),
                 "mask": jnp.asarray(mask)}
          for name, batches in sets.items()}
  return ClientData(support=data["support"], query=data["query"],
                    num_examples=jnp.full((num_clients,), 2.0 * n))


def init_params(model, key):
  return jax.jit(lambda k: models.init_params(model, k, (D,)))(key)


def test_class_prototypes_are_masked_class_means():
  rng = np.random.default_rng(0)
  feats = rng.normal(size=(7, 4)).astype(np.float32)
  labels = np.array([0, 2, 2, 0, 2, 1, 1], np.int32)
  mask = np.array([1, 1, 1, 0, 1, 0, 0], np.float32)  # class 1 only padded
  feats[3] = np.nan  # padding may hold anything
  protos, counts = jax.jit(prototypes.class_prototypes, static_argnums=3)(
      jnp.asarray(feats), jnp.asarray(labels), jnp.asarray(mask), 4)
  np.testing.assert_array_equal(counts, [1, 0, 3, 0])
  np.testing.assert_allclose(protos[0], feats[0], rtol=1e-6)
  np.testing.assert_allclose(protos[2], feats[[1, 2, 4]].mean(0), rtol=1e-6)
  np.testing.assert_array_equal(protos[1], 0.0)
  np.testing.assert_array_equal(protos[3], 0.0)


def _np_aggregate(local, counts, weighting):
  """Global prototypes by a loop over classes and the clients holding them."""
  local, counts = np.asarray(local, np.float64), np.asarray(counts)
  out = np.zeros(local.shape[1:])
  for j in range(local.shape[1]):
    holders = [i for i in range(local.shape[0]) if counts[i, j] > 0]
    if holders:
      w = np.array([counts[i, j] if weighting == "count" else 1.0
                    for i in holders])
      out[j] = sum(wi * local[i, j] for wi, i in zip(w, holders)) / w.sum()
  return out


@pytest.mark.parametrize("weighting", ["count", "uniform"])
def test_prototype_aggregation_against_numpy(weighting):
  rng = np.random.default_rng(1)
  c, k, d = 4, 5, 3
  local = rng.normal(size=(c, k, d)).astype(np.float32)
  counts = rng.integers(0, 4, size=(c, k)).astype(np.float32)
  counts[:, 4] = 0  # nobody holds class 4
  counts[1:, 3] = 0  # only client 0 holds class 3
  local[counts == 0] = 7.0  # whatever an absent class row holds, it is ignored
  got, n_k = jax.jit(prototypes.aggregate_prototypes, static_argnums=2)(
      jnp.asarray(local), jnp.asarray(counts), weighting)
  np.testing.assert_allclose(got, _np_aggregate(local, counts, weighting),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got[4], 0.0)
  np.testing.assert_allclose(got[3], local[0, 3], rtol=1e-6)
  np.testing.assert_array_equal(n_k, counts.sum(0))


def test_nearest_prototype_skips_invalid_classes():
  feats = jnp.array([[0.0, 0.0], [2.0, 2.1], [5.0, 5.0]])
  protos = jnp.array([[0.1, 0.0], [2.0, 2.0], [5.0, 5.0]])
  valid = jnp.array([True, True, False])
  np.testing.assert_array_equal(
      jax.jit(prototypes.nearest_prototype)(feats, protos, valid), [0, 1, 1])


@pytest.mark.parametrize("distance", ["mse", "squared_l2"])
def test_fedproto_objective_by_hand(distance):
  feats = np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 3.0], [9.0, 9.0]],
                   np.float32)
  logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0],
                     [5.0, 0.0, 0.0]], np.float32)
  labels = np.array([0, 1, 2, 0], np.int32)
  mask = np.array([1, 1, 1, 0], np.float32)  # last row is padding
  protos = np.array([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], np.float32)
  counts = np.array([3.0, 2.0, 0.0], np.float32)  # class 2: no prototype
  lam = 0.7
  loss, parts = jax.jit(fedproto.objective,
                        static_argnames=("lam", "distance"))(
      jnp.asarray(feats), jnp.asarray(logits), jnp.asarray(labels),
      jnp.asarray(mask), jnp.asarray(protos), jnp.asarray(counts), lam=lam,
      distance=distance)
  ce = [np.log(np.exp(logits[j]).sum()) - logits[j, labels[j]]
        for j in range(3)]
  sq0 = (1.0 - 0.0) ** 2 + (2.0 - 1.0) ** 2  # row 0 vs prototype 0
  sq1 = (0.5 - 1.0) ** 2 + (-1.0 - 1.0) ** 2  # row 1 vs prototype 1
  scale = 0.5 if distance == "mse" else 1.0
  reg = (scale * sq0 + scale * sq1 + 0.0) / 3  # row 2's class has none
  np.testing.assert_allclose(parts["ce"], np.mean(ce), rtol=1e-6)
  np.testing.assert_allclose(parts["proto"], reg, rtol=1e-6)
  np.testing.assert_allclose(loss, np.mean(ce) + lam * reg, rtol=1e-6)


def no_key(state):
  """``state`` with its PRNG key as raw data (comparable with chex)."""
  return state.replace(key=jax.random.key_data(state.key))


@pytest.fixture(scope="module")
def setup():
  model = models.MLP(num_classes=K, hidden=(8,))
  params = init_params(model, jax.random.key(0))
  config = fedproto.FedProtoConfig(lr=0.05, batch_size=4, local_epochs=2)
  return dict(model=model, params=params, config=config,
              train=separable_clients(0, 5), test=separable_clients(1, 4),
              round=fedproto.make_round(model, config, "vmap"),
              evaluate=fedproto.make_evaluate(model, config))


def test_round_vmap_equals_map(setup):
  state = fedproto.init_state(setup["params"], 5, jax.random.key(3))
  a, ma = setup["round"](state, setup["train"])
  b, mb = fedproto.make_round(setup["model"], setup["config"], "map")(
      state, setup["train"])
  # Same arithmetic in a different batching: float32 rounding only.
  chex.assert_trees_all_close(no_key(a), no_key(b), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5)
  # Prototypes come from the clients' own classes only.
  labels = np.concatenate([np.asarray(setup["train"].support["y"]),
                           np.asarray(setup["train"].query["y"])], 1)
  for i in range(5):
    held = set(labels[i][labels[i] >= 0].tolist())
    np.testing.assert_array_equal(np.asarray(a.local_counts[i]) > 0,
                                  [k in held for k in range(K)])


def test_few_rounds_beat_chance_on_held_out_clients(setup):
  state = fedproto.init_state(setup["params"], 5, jax.random.key(4))
  for _ in range(4):
    state, metrics = setup["round"](state, setup["train"])
  assert np.isfinite(metrics["loss"])
  ev = setup["evaluate"](state, setup["test"])
  assert ev["client_accuracy"].shape == (4,)
  assert float(ev["accuracy"]) > 0.7, ev  # chance: 1/3
  assert np.isfinite(float(ev["accuracy_head"]))
  assert int(state.round) == 4


def test_partial_participation_keeps_the_others_and_their_prototypes(setup):
  state = fedproto.init_state(setup["params"], 5, jax.random.key(5))
  state, _ = setup["round"](state, setup["train"])
  ids = jnp.array([3, 1])
  new, metrics = setup["round"](state, setup["train"], ids)
  assert metrics["client_loss"].shape == (2,)
  for i in range(5):
    moved = not np.allclose(jax.tree.leaves(new.client_params)[0][i],
                            jax.tree.leaves(state.client_params)[0][i])
    assert moved == (i in (1, 3))
  for i in (0, 2, 4):  # stale prototypes of the others are kept ...
    np.testing.assert_array_equal(new.local_protos[i], state.local_protos[i])
  # ... and the server aggregates the latest prototypes of everybody.
  np.testing.assert_allclose(
      new.global_protos,
      _np_aggregate(new.local_protos, new.local_counts, "count"),
      rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(new.global_counts,
                                np.asarray(new.local_counts).sum(0))
  assert float(jnp.sum(new.global_counts)) == 5 * 12
