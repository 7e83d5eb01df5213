"""The library's one local-training loop (``local.train``) and its optimizer
step against hand-computed SGD on a linear least-squares model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from augfl_jax.core import local
from augfl_jax import models
from tests import replaced_computations


def _least_squares(rng, real, pad):
  """``[real + pad]`` rows of ``(x [3], t)``, garbage in the padding."""
  x = rng.normal(size=(real + pad, 3)).astype(np.float32)
  t = rng.normal(size=(real + pad,)).astype(np.float32)
  x[real:] = 1e3
  mask = np.r_[np.ones(real), np.zeros(pad)].astype(np.float32)
  return {"x": jnp.asarray(x), "y": jnp.asarray(t), "mask": jnp.asarray(mask)}


def _loss(w, batch):
  r = batch["x"] @ w - batch["y"]
  return models.masked_mean(r * r, batch["mask"])


def _minibatches(key, data, batch_size, keyed):
  """The epoch's minibatches as ``local.train`` draws them (numpy rows)."""
  epoch_key = jax.random.split(key, 1)[0]
  shuffle_key = jax.random.split(epoch_key)[0] if keyed else epoch_key
  batches = local.epoch_batches(shuffle_key, data, batch_size)
  return [{k: np.asarray(v[i]) for k, v in batches.items()}
          for i in range(batches["mask"].shape[0])]


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_two_steps_of_sgd_by_hand(momentum, keyed):
  """4 real rows, B = 2: two real steps and one all-padding step (a no-op
  for the parameters and the momentum buffer)."""
  data = _least_squares(np.random.default_rng(0), real=4, pad=2)
  w0 = jnp.asarray([0.3, -0.2, 0.5], jnp.float32)
  key, lr = jax.random.key(3), 0.1
  loss_fn = (lambda w, b, k: _loss(w, b)) if keyed else _loss
  got, mean_loss = jax.jit(lambda w: local.train(
      loss_fn, local.sgd(lr, momentum), w, data, key, epochs=1,
      batch_size=2, keyed=keyed))(w0)

  steps = _minibatches(key, data, 2, keyed)
  assert [b["mask"].sum() for b in steps] == [2, 2, 0]
  w, buf, losses = np.asarray(w0, np.float64), np.zeros(3), []
  for b in steps[:2]:
    x, t = b["x"], b["y"]
    r = x @ w - t
    losses.append(np.mean(r * r))
    grad = 2 * x.T @ r / 2
    buf = momentum * buf + grad
    w = w - lr * buf
  np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(mean_loss, np.mean(losses), rtol=1e-5)


def test_momentum_ignores_all_padding_minibatches():
  """Full-batch SGD with momentum against a hand-written loop; the extra
  all-padding minibatches must not move the parameters."""
  rng = np.random.default_rng(2)
  data = _least_squares(rng, real=5, pad=3)
  x, t = np.asarray(data["x"]), np.asarray(data["y"])
  w0 = jnp.asarray(rng.normal(size=(3,)).astype(np.float32))
  # batch_size 5 > real rows per epoch: 1 real step + 1 padding step.
  got, _ = jax.jit(lambda w, d, k: local.train(
      _loss, local.sgd(0.1, 0.5), w, d, k, epochs=3, batch_size=5))(
          w0, data, jax.random.key(0))
  w, buf = np.asarray(w0), np.zeros(3)
  xr, tr = x[:5], t[:5]
  for _ in range(3):
    grad = 2 * xr.T @ (xr @ w - tr) / 5
    buf = 0.5 * buf + grad
    w = w - 0.1 * buf
  np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_has_aux_differentiates_the_objective_and_reports_the_aux():
  """A Lagrangian-like objective ``f + c ||w||^2`` whose task loss ``f`` is
  reported: one full-batch step."""
  data = _least_squares(np.random.default_rng(1), real=3, pad=1)
  w0 = jnp.asarray([0.1, 0.2, -0.4], jnp.float32)
  c, lr = 0.7, 0.05

  def objective(w, batch):
    f = _loss(w, batch)
    return f + c * jnp.sum(w * w), f

  got, reported = local.train(objective, local.sgd(lr), w0, data,
                              jax.random.key(0), epochs=1, batch_size=4,
                              has_aux=True)
  x, t, w = (np.asarray(data["x"])[:3], np.asarray(data["y"])[:3],
             np.asarray(w0))
  r = x @ w - t
  want = w - lr * (2 * x.T @ r / 3 + 2 * c * w)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(reported, np.mean(r * r), rtol=1e-5)


def test_step_is_one_optax_update():
  """``local.step`` with a chained optimizer (weight decay + momentum, as
  PM pretraining) equals ``tx.update`` + ``apply_updates`` by hand."""
  data = _least_squares(np.random.default_rng(4), real=4, pad=0)
  w0 = jnp.asarray([0.5, -0.5, 0.25], jnp.float32)
  tx = optax.chain(optax.add_decayed_weights(0.01), optax.sgd(0.1, 0.9))
  state = tx.init(w0)
  w, state, aux = local.step(lambda p, b: (_loss(p, b), 2.0 * _loss(p, b)),
                             tx, w0, state, data)
  w, state, _ = local.step(lambda p, b: (_loss(p, b), 0.0), tx, w, state,
                           data)
  x, t, v, buf = (np.asarray(data["x"]), np.asarray(data["y"]),
                  np.asarray(w0, np.float64), np.zeros(3))
  np.testing.assert_allclose(aux, 2 * np.mean((x @ v - t) ** 2), rtol=1e-5)
  for _ in range(2):
    g = 2 * x.T @ (x @ v - t) / 4 + 0.01 * v
    buf = 0.9 * buf + g
    v = v - 0.1 * buf
  np.testing.assert_allclose(w, v, rtol=1e-5, atol=1e-6)


def test_sgd_without_momentum_keeps_no_buffer():
  assert not jax.tree.leaves(local.sgd(0.1).init(jnp.zeros(3)))
  assert len(jax.tree.leaves(local.sgd(0.1, 0.5).init(jnp.zeros(3)))) == 1


def test_a_batch_size_beyond_the_data_is_one_full_batch_of_it():
  data = {"x": jnp.arange(12.0).reshape(6, 2), "y": jnp.arange(6),
          "mask": jnp.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])}
  key = jax.random.key(0)
  big = local.epoch_batches(key, data, 1000)
  assert big["x"].shape == (1, 6, 2)  # not padded to 1000 rows
  exact = local.epoch_batches(key, data, 6)
  jax.tree.map(np.testing.assert_array_equal, big, exact)
  assert sorted(np.asarray(big["y"][0, :4]).tolist()) == [0, 1, 2, 3]


def test_epoch_split_is_epoch_batches_without_the_last_ones_padding():
  """10 rows, B = 4: two full minibatches and a tail of 2 rows, the rows of
  ``epoch_batches``' minibatches in the same order; B dividing n: no
  tail."""
  data = _least_squares(np.random.default_rng(5), real=7, pad=3)
  key = jax.random.key(2)
  full, tail = local.epoch_split(key, data, 4)
  batches = local.epoch_batches(key, data, 4)
  assert full["x"].shape == (2, 4, 3) and tail["x"].shape == (2, 3)
  for k in data:
    np.testing.assert_array_equal(full[k], batches[k][:2])
    np.testing.assert_array_equal(tail[k], batches[k][2, :2])
    np.testing.assert_array_equal(batches[k][2, 2:], 0)  # padding dropped
  full, tail = local.epoch_split(key, data, 5)
  assert tail is None and full["x"].shape == (2, 5, 3)


@pytest.mark.parametrize("keyed,has_aux,momentum", [
    (False, False, 0.0), (True, False, 0.5), (False, True, 0.5)])
def test_train_equals_the_loop_it_replaced(keyed, has_aux, momentum):
  """``train`` (minibatches of padding alone skipped, the last minibatch
  without its padding rows) against the loop before it
  (``tests/replaced_computations``: every static minibatch computed, the padding's steps discarded), on
  clients whose epochs end in a tail with real rows, one without and a
  minibatch of padding alone (4 real rows of 10, B = 3)."""

  def objective(w, batch, *key):
    loss = _loss(w, batch) + (0.01 * jax.random.normal(key[0])
                              if key else 0.0)
    return (loss + 0.1 * jnp.sum(w * w), loss) if has_aux else loss

  w0 = jnp.asarray([0.3, -0.2, 0.5], jnp.float32)
  for real in (10, 8, 4):
    data = _least_squares(np.random.default_rng(real), real=real,
                          pad=10 - real)
    run = lambda train: jax.jit(lambda w: train(
        objective, local.sgd(0.1, momentum), w, data, jax.random.key(4),
        epochs=2, batch_size=3, has_aux=has_aux, keyed=keyed))(w0)
    got, want = run(local.train), run(replaced_computations.train)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-7)
