"""CRD's reference options: head optimizer reset, the moving student, the
server augmentation, and the PM's outputs computed once."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import transfer
from augfl_jax.transfer import server_data
from tests import tiny
from tests.test_transfer import SERVER, STUDENT, TEACHER, apply_fn, build

BASE = transfer.CRDConfig(feat_dim=4, nce_k=5, batch_size=5, kt_steps=3,
                          head_lr=0.05)


def two_rounds(config, teacher_per_example=False):
  init_fn, grad_fn = transfer.make_crd_regularizer(
      apply_fn, lambda x, mask: apply_fn(TEACHER, x, mask), SERVER, config,
      teacher_per_example=teacher_per_example)
  state = init_fn(jax.random.key(0), STUDENT)
  g1, state, _ = grad_fn(STUDENT, state)
  g2, state, _ = grad_fn(STUDENT, state)
  return g1, g2, state


def close(a, b, **kw):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **kw), a, b)


@pytest.mark.slow
def test_head_optimizer_reset_drops_the_momentum_between_rounds():
  reset = dataclasses.replace(BASE, reset_head_optimizer=True)
  carried = dataclasses.replace(BASE, reset_head_optimizer=False)
  g1_r, g2_r, s_r = two_rounds(reset)
  g1_c, g2_c, s_c = two_rounds(carried)
  close(g1_r, g1_c, rtol=0, atol=0)  # round 1 starts from a fresh state
  assert not np.allclose(s_r.heads["embed_s"]["kernel"],
                         s_c.heads["embed_s"]["kernel"])
  # Reset: round 2 from the state of round 1 with a fresh optimizer state is
  # exactly what carrying would give after zeroing the momentum by hand.
  init_fn, grad_fn = build(carried)
  state = init_fn(jax.random.key(0), STUDENT)
  _, state, _ = grad_fn(STUDENT, state)
  state = state.replace(head_opt_state=jax.tree.map(
      jnp.zeros_like, state.head_opt_state))
  _, fresh, _ = grad_fn(STUDENT, state)
  close(fresh.heads, s_r.heads, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_moving_student():
  fixed = BASE
  moving = dataclasses.replace(BASE, student_lr=0.5)
  # One minibatch: the gradient is taken before the student moves.
  one = lambda c: two_rounds(dataclasses.replace(c, kt_steps=1))[0]
  close(one(fixed), one(moving), rtol=0, atol=0)
  # Several: later gradients are taken where the student went.
  g_fixed, g_moving = two_rounds(fixed)[0], two_rounds(moving)[0]
  assert not all(np.allclose(a, b) for a, b in zip(
      jax.tree.leaves(g_fixed), jax.tree.leaves(g_moving)))
  # ... and the difference vanishes with the step size.
  g_tiny = two_rounds(dataclasses.replace(BASE, student_lr=1e-7))[0]
  close(g_tiny, g_fixed, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_pm_runs_once_for_a_per_example_pm():
  """tiny's tanh MLP has no batch statistics: its outputs on the whole split
  at once equal its outputs minibatch by minibatch."""
  g1, g2, s = two_rounds(BASE, teacher_per_example=False)
  c1, c2, cs = two_rounds(BASE, teacher_per_example=True)
  close((g1, g2, s.memory_t), (c1, c2, cs.memory_t), rtol=1e-5, atol=1e-6)
  for per_example, runs_per_round in ((True, 0), (False, 3)):
    calls = []

    def counting_teacher(x, mask):
      jax.debug.callback(lambda: calls.append(1))  # once per execution
      return apply_fn(TEACHER, x, mask)

    init_fn, grad_fn = transfer.make_crd_regularizer(
        apply_fn, counting_teacher, SERVER, BASE,
        teacher_per_example=per_example)
    state = init_fn(jax.random.key(0), STUDENT)
    before = len(calls)
    for _ in range(2):
      _, state, _ = grad_fn(STUDENT, state)
    jax.effects_barrier()
    assert len(calls) - before == 2 * runs_per_round


def test_crop_flip_against_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 7, 5, 2)).astype(np.float32)
  fill = np.array([-3.0, -4.0], np.float32)
  keys = jax.random.split(jax.random.key(3), 6)
  got = np.asarray(server_data.crop_flip(keys, jnp.asarray(x),
                                         jnp.asarray(fill)))
  pad = server_data.CROP_PADDING
  flips = 0
  for b in range(6):
    k_y, k_x, k_f = jax.random.split(keys[b], 3)
    dy = int(jax.random.randint(k_y, (), 0, 2 * pad + 1))
    dx = int(jax.random.randint(k_x, (), 0, 2 * pad + 1))
    padded = np.broadcast_to(fill, (7 + 2 * pad, 5 + 2 * pad, 2)).copy()
    padded[pad:pad + 7, pad:pad + 5] = x[b]
    want = padded[dy:dy + 7, dx:dx + 5]
    if bool(jax.random.bernoulli(k_f)):
      want, flips = want[:, ::-1], flips + 1
    np.testing.assert_array_equal(got[b], want)
  assert 0 < flips < 6


def test_augmentation_changes_the_gradient_but_not_its_shape():
  images = {**SERVER, "x": jnp.asarray(np.random.default_rng(1).normal(
      size=(SERVER["y"].shape[0], 4, 4, 1)).astype(np.float32))}
  flat = lambda params, x, mask=None: apply_fn(params, x.reshape(
      x.shape[0], -1)[:, :tiny.D], mask)
  grads = {}
  for augment in ("none", "crop_flip"):
    init_fn, grad_fn = transfer.make_crd_regularizer(
        flat, lambda x, mask: flat(TEACHER, x, mask), images,
        dataclasses.replace(BASE, augment=augment))
    grads[augment], _, _ = grad_fn(STUDENT, init_fn(jax.random.key(0),
                                                    STUDENT))
  assert jax.tree.structure(grads["none"]) == jax.tree.structure(
      grads["crop_flip"])
  assert not np.allclose(grads["none"]["w1"], grads["crop_flip"]["w1"])


@pytest.mark.parametrize("bad", [dict(augment="rotate"),
                                 dict(student_lr=-1.0)])
def test_bad_options(bad):
  with pytest.raises(ValueError):
    dataclasses.replace(BASE, **bad)
