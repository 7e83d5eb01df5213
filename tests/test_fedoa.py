"""FedIT, FedOA and the rotated-domain (out-of-distribution) protocol."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import models
from augfl_jax.core import local, tree
from augfl_jax.core.types import ClientData
from augfl_jax.algorithms import fedit
from augfl_jax.algorithms.fedoa import personal as fedoa_personal
from augfl_jax.algorithms import fedoa
from augfl_jax.data import rotated
from augfl_jax.data.sources import Dataset
from tests import replaced_computations, tiny

MODEL = models.create_model("mlp", tiny.K, hidden=(tiny.H,))  # fc1, head
HP = jax.lax.Precision.HIGHEST


@functools.cache
def _backbone():
  return jax.jit(lambda k: models.init_params(MODEL, k, (tiny.D,)))(
      jax.random.key(0))


# --- an independent forward pass, LoRA merge and FedOA objective ----------


def _merged(backbone, adapter, s):
  """W + s A^T B^T on fc1 and head, written out."""
  out = {}
  for name in ("fc1", "head"):
    a, b = adapter[name]["A"], adapter[name]["B"]
    out[name] = {"kernel": backbone[name]["kernel"] + s * jnp.dot(
        a.T, b.T, precision=HP), "bias": backbone[name]["bias"]}
  return out


def _forward(p, x, mask):
  h = jax.nn.relu(jnp.dot(x * mask[:, None], p["fc1"]["kernel"], precision=HP)
                  + p["fc1"]["bias"]) * mask[:, None]
  return h, jnp.dot(h, p["head"]["kernel"], precision=HP) + p["head"]["bias"]


def _ce(logits, batch):
  logp = jax.nn.log_softmax(logits)
  y = jnp.where(batch["mask"] > 0, batch["y"], 0)
  nll = -jnp.take_along_axis(logp, y[:, None], axis=1)[:, 0]
  return jnp.sum(nll * batch["mask"]) / jnp.maximum(batch["mask"].sum(), 1.0)


def _hand_loss(backbone, adapter, batch, s):
  return _ce(_forward(_merged(backbone, adapter, s), batch["x"],
                      batch["mask"])[1], batch)


def _hand_objective(backbone, personal, h_anchor, batch, s, lam):
  """CE + lam * mean_j ||h_p[j] - h_anchor[j]||^2 with h_anchor a constant
  (the squared distance)."""
  h, logits = _forward(_merged(backbone, personal, s), batch["x"],
                       batch["mask"])
  d = jnp.sum((h - h_anchor) ** 2, -1)
  reg = jnp.sum(d * batch["mask"]) / jnp.sum(batch["mask"])
  return _ce(logits, batch) + lam * reg


@functools.partial(jax.jit, static_argnames=("s", "lr", "steps"))
def _gd_loss(backbone, adapter, data, *, s, lr, steps):
  """``steps`` GD steps on the hand-written CE of the merged model."""
  for _ in range(steps):
    g = jax.grad(lambda a: _hand_loss(backbone, a, data, s))(adapter)
    adapter = jax.tree.map(lambda p, d: p - lr * d, adapter, g)
  return adapter


@functools.partial(jax.jit, static_argnames=("s", "lam", "lr", "steps"))
def _gd_objective(backbone, personal, h_anchor, data, *, s, lam, lr, steps):
  """``steps`` GD steps on the hand-written FedOA objective."""
  for _ in range(steps):
    g = jax.grad(lambda p: _hand_objective(backbone, p, h_anchor, data, s,
                                           lam))(personal)
    personal = jax.tree.map(lambda p, d: p - lr * d, personal, g)
  return personal


@functools.partial(jax.jit, static_argnames=("s",))
def _hand_features(backbone, adapter, x, mask, *, s):
  return _forward(_merged(backbone, adapter, s), x, mask)


def _take(stacked, i):
  return jax.tree.map(lambda leaf: np.asarray(leaf)[i], stacked)


def _all_data(clients, i):
  c = _take(clients, i)
  return {k: np.concatenate([c.support[k], c.query[k]]) for k in c.support}


@jax.jit
def _perturbed(adapter, key):
  """An adapter with B != 0 (a trained one)."""
  return {p: {"A": a["A"], "B": 0.5 * jax.random.normal(
      jax.random.fold_in(key, i), a["B"].shape)}
          for i, (p, a) in enumerate(sorted(adapter.items()))}


# --- FedIT -----------------------------------------------------------------


def test_fedit_full_batch_round_is_weighted_mean_of_adapter_gd_steps():
  clients = tiny.client_data(seed=2, num_clients=3)
  config = fedit.FedITConfig(rank=2, lora_alpha=4.0, lr=0.5, local_epochs=2,
                             batch_size=64)
  backbone = _backbone()
  state = fedit.init_state(backbone, 3, jax.random.key(1), config)
  # Clients 0 and 2 take part: the mean over the participants only (the
  # full-participation path is checked against FedOA's global adapter below).
  new, metrics = fedit.make_round(MODEL, config)(state, clients,
                                                 jnp.array([0, 2]))
  s = config.lora.scaling
  w = np.asarray(clients.num_examples)[[0, 2]]
  adapters = [_gd_loss(backbone, state.global_adapter, _all_data(clients, i),
                       s=s, lr=0.5, steps=2) for i in (0, 2)]
  expected = jax.tree.map(lambda a, b: (w[0] * a + w[1] * b) / w.sum(),
                          *adapters)
  chex.assert_trees_all_close(new.global_adapter, expected, atol=1e-6,
                              rtol=1e-5)
  assert int(new.round) == 1 and metrics["client_loss"].shape == (2,)
  # Both factors moved (B from the first step, A from the second).
  for a0, a1 in zip(jax.tree.leaves(state.global_adapter),
                    jax.tree.leaves(new.global_adapter)):
    assert float(jnp.abs(a1 - a0).max()) > 0
  # The backbone is never touched.
  chex.assert_trees_all_equal(new.backbone, backbone)


def test_fedit_evaluate_without_adaptation_scores_the_merged_model():
  clients = tiny.client_data(seed=3, num_clients=3)
  config = fedit.FedITConfig(rank=2, lora_alpha=4.0)
  backbone = _backbone()
  state = fedit.init_state(backbone, 3, jax.random.key(2), config)
  state = state.replace(global_adapter=_perturbed(state.global_adapter,
                                                  jax.random.key(3)))
  got = fedit.make_evaluate(MODEL, config, eval_steps=0)(state, clients)
  correct, count = [], []
  for i in range(3):
    q = _take(clients, i).query
    pred = np.argmax(_hand_features(backbone, state.global_adapter, q["x"],
                                    q["mask"], s=config.lora.scaling)[1], -1)
    m = np.asarray(q["mask"]) > 0
    correct.append(np.sum(pred[m] == np.asarray(q["y"])[m]))
    count.append(m.sum())
  np.testing.assert_allclose(got["client_accuracy"],
                             np.array(correct) / np.array(count), atol=1e-6)
  np.testing.assert_allclose(got["accuracy"], sum(correct) / sum(count),
                             atol=1e-6)


# --- FedOA -----------------------------------------------------------------


@pytest.mark.parametrize("distance,reduction", [("l2", "mean"),
                                                ("squared_l2", "sum")])
def test_feature_distance_against_numpy(distance, reduction):
  rng = np.random.default_rng(0)
  hp, hg = rng.normal(size=(2, 6, 4)).astype(np.float32)
  hg[1] = hp[1]  # a zero distance
  mask = np.array([1, 1, 1, 1, 0, 0], np.float32)
  hp[5] = np.nan  # padding must not matter
  config = fedoa.FedOAConfig(distance=distance, reduction=reduction)
  got = fedoa_personal.feature_distance(jnp.asarray(hp), jnp.asarray(hg),
                               jnp.asarray(mask), config)
  d = np.linalg.norm(hp[:4] - hg[:4], axis=1)
  d = d ** 2 if distance == "squared_l2" else d
  np.testing.assert_allclose(got, d.sum() if reduction == "sum" else d.mean(),
                             rtol=1e-5)


def test_fedoa_gradient_reaches_only_the_personal_adapter():
  config = fedoa.FedOAConfig(rank=2, lora_alpha=4.0,
                             distance="squared_l2", lam=0.5)
  s = config.lora.scaling
  backbone = _backbone()
  base = fedoa.init_state(backbone, 1, jax.random.key(4), config)
  anchor = _perturbed(base.global_adapter, jax.random.key(5))
  personal = _perturbed(base.global_adapter, jax.random.key(6))
  batch = tiny.batch(np.random.default_rng(1), 7, pad=3)

  def objective(personal, anchor, backbone):
    return fedoa_personal.personal_objective(MODEL, config, backbone, anchor)(
        personal, batch)

  g_p, g_a, g_b = jax.jit(jax.grad(objective, argnums=(0, 1, 2)))(
      personal, anchor, backbone)
  for leaf in jax.tree.leaves((g_a, g_b)):
    np.testing.assert_array_equal(np.asarray(leaf), 0.0)
  # The personal gradient is that of CE + lam * D with the anchor's features
  # computed beforehand as a constant.
  h_anchor = np.asarray(_hand_features(backbone, anchor, batch["x"],
                                       batch["mask"], s=s)[0])
  # One GD step of size 1 is minus the gradient.
  for lam in (0.5, 0.0):
    step = _gd_objective(backbone, personal, h_anchor, batch, s=s, lam=lam,
                         lr=1.0, steps=1)
    want = jax.tree.map(lambda p, q: p - q, personal, step)
    if lam:
      chex.assert_trees_all_close(g_p, want, atol=1e-5, rtol=1e-4)
    else:  # ... and the regulariser does contribute to it.
      diff = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), g_p, want)
      assert max(jax.tree.leaves(diff)) > 1e-3


@pytest.mark.parametrize("anchor", ["received", "updated"])
def test_fedoa_full_batch_round_by_hand(anchor):
  clients = tiny.client_data(seed=4, num_clients=3)
  config = fedoa.FedOAConfig(rank=2, lora_alpha=4.0,
                             distance="squared_l2", lr=0.5, personal_lr=0.3,
                             local_epochs=2, batch_size=64, lam=0.5,
                             anchor=anchor)
  s = config.lora.scaling
  backbone = _backbone()
  state = fedoa.init_state(backbone, 3, jax.random.key(7), config)
  # Personal adapters that already differ from the global one.
  state = state.replace(personal_adapters=jax.vmap(
      lambda k: _perturbed(state.global_adapter, k))(
          jax.random.split(jax.random.key(8), 3)))
  new, metrics = fedoa.make_round(MODEL, config)(state, clients,
                                                 jnp.array([0, 2]))
  g0 = state.global_adapter
  w = np.asarray(clients.num_examples)[[0, 2]]
  copies = {}
  for i in (0, 2):
    data = _all_data(clients, i)
    copies[i] = _gd_loss(backbone, g0, data, s=s, lr=0.5, steps=2)
    ref = g0 if anchor == "received" else copies[i]
    h_ref = _hand_features(backbone, ref, data["x"], data["mask"], s=s)[0]
    personal = _gd_objective(backbone, _take(state.personal_adapters, i),
                             h_ref, data, s=s, lam=0.5, lr=0.3, steps=2)
    chex.assert_trees_all_close(_take(new.personal_adapters, i), personal,
                                atol=1e-5, rtol=1e-4)
  chex.assert_trees_all_close(
      new.global_adapter,
      jax.tree.map(lambda a, b: (w[0] * a + w[1] * b) / w.sum(),
                   copies[0], copies[2]), atol=1e-6, rtol=1e-5)
  # Client 1 did not take part: its personal adapter is unchanged.
  chex.assert_trees_all_equal(_take(new.personal_adapters, 1),
                              _take(state.personal_adapters, 1))
  assert np.isfinite(float(metrics["personal_loss"]))
  assert bool(tree.all_finite((new.global_adapter, new.personal_adapters)))


def test_fedoa_global_adapter_follows_fedit_and_strategies_agree():
  """Two minibatch rounds: FedOA's global adapter is FedIT's (same seed),
  and the "map" strategy reproduces "vmap" (float32 rounding: 1e-5)."""
  clients = tiny.client_data(seed=5, num_clients=4)
  config = fedoa.FedOAConfig(rank=2, lora_alpha=4.0,
                             distance="squared_l2", lr=0.2, local_epochs=2,
                             batch_size=4)
  backbone = _backbone()
  runs = {}
  for strategy in ("vmap", "map"):
    state = fedoa.init_state(backbone, 4, jax.random.key(9), config)
    round_fn = fedoa.make_round(MODEL, config, strategy)
    for _ in range(2):
      state, metrics = round_fn(state, clients)
    runs[strategy] = (state, metrics)
  chex.assert_trees_all_close(runs["vmap"][0].global_adapter,
                              runs["map"][0].global_adapter, atol=1e-5)
  chex.assert_trees_all_close(runs["vmap"][0].personal_adapters,
                              runs["map"][0].personal_adapters, atol=1e-5)
  np.testing.assert_allclose(runs["vmap"][1]["personal_loss"],
                             runs["map"][1]["personal_loss"], atol=1e-5)
  it_state = fedit.init_state(backbone, 4, jax.random.key(9), config)
  it_round = fedit.make_round(MODEL, config, "map")
  for _ in range(2):
    it_state, it_metrics = it_round(it_state, clients)
  chex.assert_trees_all_close(runs["vmap"][0].global_adapter,
                              it_state.global_adapter, atol=1e-5)
  np.testing.assert_allclose(runs["vmap"][1]["loss"], it_metrics["loss"],
                             atol=1e-5)
  assert bool(tree.all_finite(runs["vmap"][0].personal_adapters))
  # Personal adapters moved away from the global one, and differ by client.
  p = runs["vmap"][0].personal_adapters["head"]["B"]
  assert float(jnp.abs(p[0] - p[1]).max()) > 1e-4


def test_fedoa_held_out_and_personal_evaluation():
  clients = tiny.client_data(seed=6, num_clients=3)
  config = fedoa.FedOAConfig(rank=2, lora_alpha=4.0,
                             distance="squared_l2", lr=0.3, local_epochs=1,
                             batch_size=64)
  backbone = _backbone()
  state = fedoa.init_state(backbone, 3, jax.random.key(10), config)
  state = state.replace(global_adapter=_perturbed(state.global_adapter,
                                                  jax.random.key(11)))
  # One full-batch epoch from the global adapter: the regulariser and its
  # gradient vanish (personal == anchor), so this is FedIT's fast adaptation
  # with one step of size lr.
  got = fedoa.make_evaluate(MODEL, config)(state, clients)
  want = fedit.make_evaluate(MODEL, config, eval_alpha=0.3, eval_steps=1)(
      state, clients)
  chex.assert_trees_all_close(got, want, atol=1e-5)
  assert np.isfinite(float(got["loss"]))
  # Personal adapters scored on shared data = on the same data per client;
  # client i's accuracy is its merged personal model's.
  state = state.replace(personal_adapters=jax.vmap(
      lambda k: _perturbed(state.global_adapter, k))(
          jax.random.split(jax.random.key(12), 3)))
  batch = tiny.batch(np.random.default_rng(2), 9, pad=3)
  evaluate_personal = fedoa.make_evaluate_personal(MODEL, config,
                                                   strategy="map")
  shared = evaluate_personal(state, batch)
  per_client = evaluate_personal(state, tiny.stack([batch] * 3))
  chex.assert_trees_all_close(shared, per_client, atol=1e-6)
  for i in range(3):
    pred = np.argmax(_hand_features(
        backbone, _take(state.personal_adapters, i), batch["x"],
        batch["mask"], s=config.lora.scaling)[1], -1)
    acc = np.mean(pred[:9] == np.asarray(batch["y"])[:9])
    np.testing.assert_allclose(shared["client_accuracy"][i], acc, atol=1e-6)


def test_configs_are_validated():
  with pytest.raises(ValueError):
    fedit.FedITConfig(rank=0)
  with pytest.raises(ValueError):
    fedit.FedITConfig(lr=0.0)
  with pytest.raises(ValueError):
    fedoa.FedOAConfig(distance="cosine")
  with pytest.raises(ValueError):
    fedoa.FedOAConfig(anchor="latest")
  with pytest.raises(ValueError):
    fedoa.FedOAConfig(lam=-1.0)
  assert fedoa.FedOAConfig(lr=0.1).personal_step == 0.1


# --- rotated domains -------------------------------------------------------


def test_rotation_by_0_is_the_identity_and_by_90_is_rot90():
  x = np.random.default_rng(0).normal(size=(3, 7, 7, 2)).astype(np.float32)
  np.testing.assert_array_equal(rotated.rotate_images(x, 0), x)
  for k, angle in ((1, 90), (2, 180), (-1, -90)):
    np.testing.assert_allclose(rotated.rotate_images(x, angle),
                               np.rot90(x, k, axes=(1, 2)), atol=1e-4)
  # With a constant fill, 90 degrees still matches (no pixel leaves a square).
  np.testing.assert_allclose(
      rotated.rotate_images(x[..., 0], 90, mode="constant"),
      np.rot90(x[..., 0], 1, axes=(1, 2)), atol=1e-4)


def test_rotation_leaves_a_centred_gaussian_blob_nearly_unchanged():
  yy, xx = np.mgrid[0:15, 0:15] - 7.0
  blob = np.exp(-(xx ** 2 + yy ** 2) / (2 * 3.0 ** 2))[None].astype(np.float32)
  # Inside the inscribed disc (outside it, pixels come from beyond the
  # border): bilinear interpolation error
  # <= h^2 / 8 (max |f_xx| + max |f_yy|) = (1 / 8) (2 / 3^2) ~ 0.028.
  disc = (xx ** 2 + yy ** 2 <= 7.0 ** 2)[None]
  np.testing.assert_allclose(rotated.rotate_images(blob, 45)[disc],
                             blob[disc], atol=0.028)
  # ... while an off-centre blob moves to where the rotation takes it:
  # counter-clockwise, the right-hand side goes to the top.
  right = np.roll(blob, 4, axis=2)
  top = np.roll(blob, -4, axis=1)
  np.testing.assert_allclose(rotated.rotate_images(right, 90), top, atol=1e-4)


def _identity_dataset(n=100):
  """Constant images whose value is the example's index + 1."""
  x = np.broadcast_to(np.arange(1, n + 1, dtype=np.float32)[:, None, None,
                                                              None],
                      (n, 5, 5, 1)).copy()
  return Dataset(name="ids", x=x, y=(np.arange(n) % 10).astype(np.int32),
                 num_classes=10)


def _indices(batch):
  """The source indices of the real rows (constant images survive rotation)."""
  x = np.asarray(batch["x"]).reshape(-1, 25)
  real = np.asarray(batch["mask"]).reshape(-1) > 0
  return np.rint(x[real, 12]).astype(int) - 1


def test_leave_one_domain_out_never_trains_on_the_held_out_domain():
  dataset = _identity_dataset()
  domains = rotated.rotated_domains(dataset, clients_per_domain=2,
                                    examples_per_client=7, seed=3)
  assert [d.angle for d in domains] == [0, 15, 30, 45, 60, 75]
  for held_out in (0, 4):
    train, test = rotated.leave_one_out(domains, held_out)
    assert train.num_clients == 10 and test.num_clients == 2
    assert train.support["x"].shape[1:] == (4, 5, 5, 1)  # ceil(7 / 2)
    np.testing.assert_array_equal(train.num_examples, 7.0)
    np.testing.assert_array_equal(np.asarray(train.query["mask"]).sum(1), 3)
    train_idx = np.concatenate([_indices(train.support),
                                _indices(train.query)])
    test_idx = np.concatenate([_indices(test.support), _indices(test.query)])
    assert not set(train_idx) & set(test_idx)
    assert sorted(test_idx) == sorted(domains[held_out].source_index)
    others = np.concatenate([d.source_index for i, d in enumerate(domains)
                             if i != held_out])
    assert sorted(train_idx) == sorted(others)
    # Labels travel with their images.
    real = np.asarray(train.support["mask"]).reshape(-1) > 0
    np.testing.assert_array_equal(
        np.asarray(train.support["y"]).reshape(-1)[real],
        _indices(train.support) % 10)
    pooled = rotated.pool_clients(test)
    assert float(pooled["mask"].sum()) == 14
    assert sorted(_indices(pooled)) == sorted(test_idx)
  with pytest.raises(ValueError):
    rotated.leave_one_out(domains, 6)


def test_shared_images_rotate_the_same_examples_and_sizes_are_checked():
  dataset = _identity_dataset(30)
  domains = rotated.rotated_domains(dataset, angles=(0, 90),
                                    examples_per_client=10,
                                    shared_images=True)
  np.testing.assert_array_equal(domains[0].source_index,
                                domains[1].source_index)
  with pytest.raises(ValueError, match="need"):
    rotated.rotated_domains(dataset, examples_per_client=10)


# --- the round against the computation it replaced --------------------------

CNN = models.create_model("cnn", 3, widths=(4,), dense=8, norm="batch")


def _cnn_clients(dtype):
  """4 clients of 8x8 images with support and query padded to 5 rows each:
  with ``batch_size=4`` an epoch is two full minibatches and a tail of 2
  rows, and the clients' sizes (2, 10, 7, 9 real rows) give a skipped
  second minibatch, skipped tails and a tail with one real row; garbage in
  the padding."""
  rng = np.random.default_rng(3)
  sets = []
  for sizes in ((1, 5, 3, 5), (1, 5, 4, 4)):
    x = rng.normal(size=(4, 5, 8, 8, 1))
    mask = np.array([[1.0] * n + [0.0] * (5 - n) for n in sizes])
    x[mask == 0] = 1e3
    sets.append({"x": jnp.asarray(x, dtype),
                 "y": jnp.asarray(rng.integers(0, 3, (4, 5)), jnp.int32),
                 "mask": jnp.asarray(mask, dtype)})
  return ClientData(
      support=sets[0], query=sets[1],
      num_examples=jnp.asarray(sets[0]["mask"].sum(1) + sets[1]["mask"].sum(1)))


def _two_rounds_and_evaluation(config, strategy, dtype):
  backbone = jax.tree.map(lambda a: a.astype(dtype), models.init_params(
      CNN, jax.random.key(0), (8, 8, 1)))
  clients = _cnn_clients(dtype)
  state = fedoa.init_state(backbone, 4, jax.random.key(1), config)
  round_fn = fedoa.make_round(CNN, config, strategy)
  metrics = []
  for _ in range(2):  # round 1: personal == anchor at the start; round 2 not
    state, m = round_fn(state, clients)
    metrics.append(m)
  return state, metrics, fedoa.make_evaluate(CNN, config, strategy=strategy)(
      state, clients)


def test_a_personal_adapter_equal_to_its_anchor_has_no_distance_gradient():
  """D(h, h) = 0: at personal == anchor the objective's gradient is the
  cross-entropy's, bit for bit, also where the two models' features come
  from computations with different rounding (here the anchor's parameters
  are constants XLA folds, the personal ones are computed per client in a
  lax.map), which would give an L2 distance of float noise whose gradient
  is a unit vector."""
  backbone = models.init_params(CNN, jax.random.key(0), (8, 8, 1))
  config = fedoa.FedOAConfig(rank=2, lora_alpha=4.0)
  adapter = _perturbed(fedoa.init_state(backbone, 1, jax.random.key(1),
                                        config).global_adapter,
                       jax.random.key(2))
  client = _take(_cnn_clients(jnp.float32), 1)
  batch = {k: jnp.concatenate([client.support[k], client.query[k]])[:4]
           for k in client.support}

  def grads(lam):
    objective = fedoa_personal.personal_objective(
        CNN, fedoa.FedOAConfig(rank=2, lora_alpha=4.0, lam=lam), backbone,
        adapter)
    return jax.jit(lambda stacked: jax.lax.map(
        lambda p: jax.grad(objective)(p, batch), stacked))(
            jax.tree.map(lambda a: jnp.stack([a, a]), adapter))

  chex.assert_trees_all_equal(grads(0.5), grads(0.0))


@pytest.mark.parametrize("dtype,tol,strategies", [
    (jnp.float32, 1e-5, ("map",)),
    pytest.param(jnp.float32, 1e-5, ("map", "vmap"),
                 marks=pytest.mark.slow),
    pytest.param(jnp.float64, 1e-12, ("map",), marks=pytest.mark.slow)])
def test_fedoa_round_equals_the_computation_it_replaced(monkeypatch, dtype,
                                                        tol, strategies):
  """Two FedOA rounds and a held-out evaluation of a batch-norm CNN, as the
  library runs them (the anchor's features outside the gradient, padding
  minibatches skipped, the last minibatch without its padding rows) and as
  it ran them (``tests/replaced_computations.py``), with the paper's L2
  distance: the same adapters, losses and scores up to float rounding
  (float32; float64 under the "map" strategy, as the reference: "vmap"
  sums the batch-norm statistics, float32 in either, in another order)."""
  config = fedoa.FedOAConfig(rank=2, lora_alpha=4.0, lr=0.05, local_epochs=2,
                             batch_size=4)
  with jax.enable_x64(dtype == jnp.float64):
    got = {s: _two_rounds_and_evaluation(config, s, dtype)
           for s in strategies}
    with monkeypatch.context() as patch:
      patch.setattr(local, "train", replaced_computations.train)
      patch.setattr(fedoa_personal, "personal_objective",
                    replaced_computations.personal_objective)
      want = _two_rounds_and_evaluation(config, "map", dtype)
    for state, metrics, scores in got.values():
      assert jax.tree.leaves(state.personal_adapters)[0].dtype == dtype
      for a, b in ((state.global_adapter, want[0].global_adapter),
                   (state.personal_adapters, want[0].personal_adapters),
                   (metrics, want[1]), (scores, want[2])):
        chex.assert_trees_all_close(a, b, atol=tol, rtol=tol)
    # the second round's personal training had a distance to pull on
    p = got["map"][0].personal_adapters["fc"]["B"]
    g = got["map"][0].global_adapter["fc"]["B"]
    assert float(jnp.abs(p - g[None]).max()) > 1e-3
