"""The cheaper CRD steps equal the full step where they must: shared
negatives give the reference's expected NCE loss (exactly with K = n), and
a bfloat16 bank is the float32 step on the rounded bank."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import transfer
from augfl_jax.transfer import nce, shared_negatives
from tests.test_transfer import STUDENT, build, np_unit
from tests.test_transfer_options import BASE, close, two_rounds

EPS = 1e-7


def np_expected_nce(bank, e, index, y, labels, z, k, tau):
  """The reference's NCE loss of one direction with its negative term
  replaced by its expectation over the draws: for row b (class c),
  ``K / (n - n_c) sum_{j not in c} log(K/n / (P_bj + K/n + eps))``."""
  n = bank.shape[0]
  scores = np.exp(e @ bank.T / tau) / z                       # [B, n]
  noise = k / n
  rows = []
  for b in range(e.shape[0]):
    other = labels != y[b]
    log_d1 = np.log(scores[b, index[b]] / (scores[b, index[b]] + noise + EPS))
    log_d0 = k / other.sum() * np.sum(
        np.log(noise / (scores[b, other] + noise + EPS)))
    rows.append(log_d1 + log_d0)
  return -np.mean(rows)


def _split(rng, n=30, classes=3, f=4):
  labels = rng.integers(0, classes, n).astype(np.int32)
  stdv = 1 / np.sqrt(f / 3)
  mem_s = rng.uniform(-stdv, stdv, (n, f)).astype(np.float32)
  mem_t = rng.uniform(-stdv, stdv, (n, f)).astype(np.float32)
  return labels, mem_s, mem_t


@pytest.mark.parametrize("z", [3.0, -1.0])
def test_shared_negatives_with_k_equal_to_n_give_the_expected_loss(z):
  rng = np.random.default_rng(0)
  labels, mem_s, mem_t = _split(rng)
  n, tau = labels.shape[0], 0.5
  index = np.array([4, 17, 9, 22])
  y = labels[index]
  e_s = np_unit(rng.normal(size=(4, 4))).astype(np.float32)
  e_t = np_unit(rng.normal(size=(4, 4))).astype(np.float32)
  negatives = shared_negatives.sample_shared(jax.random.key(1), n, n)
  assert sorted(np.asarray(negatives)) == list(range(n))  # each row once
  table = nce.class_table(labels)
  loss, (z_s, z_t) = shared_negatives.crd_loss_shared(
      jnp.asarray(e_s), jnp.asarray(e_t), jnp.asarray(index), jnp.asarray(y),
      negatives, table, jnp.asarray(labels), jnp.asarray(mem_s),
      jnp.asarray(mem_t), jnp.asarray(z), jnp.asarray(z), temperature=tau)
  if z < 0:  # Z fixed on this batch: mean score over its K+1 columns, x n
    want_z_s = np.mean(np.exp(e_s @ mem_t.T / tau).sum(1)
                       + np.exp(np.sum(mem_t[index] * e_s, 1) / tau)) / (
                           n + 1) * n
    np.testing.assert_allclose(z_s, want_z_s, rtol=1e-5)
  want = (np_expected_nce(mem_t, e_s, index, y, labels, float(z_s), n, tau)
          + np_expected_nce(mem_s, e_t, index, y, labels, float(z_t), n, tau))
  np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_shared_negatives_estimate_the_per_example_loss_without_bias():
  """Averaged over draws, both samplers give the expected loss; K < n uses
  the gathered rows, K > n the counts over every row."""
  rng = np.random.default_rng(1)
  labels, mem_s, mem_t = _split(rng)
  n, tau, z = labels.shape[0], 0.5, 2.0
  index = np.array([0, 11, 25])
  y = labels[index]
  e_s = np_unit(rng.normal(size=(3, 4))).astype(np.float32)
  e_t = np_unit(rng.normal(size=(3, 4))).astype(np.float32)
  table = nce.class_table(labels)
  args = [jnp.asarray(a) for a in (e_s, e_t, index)]
  for k in (7, 45):
    want = (np_expected_nce(mem_t, e_s, index, y, labels, z, k, tau)
            + np_expected_nce(mem_s, e_t, index, y, labels, z, k, tau))

    def shared(key):
      negatives = shared_negatives.sample_shared(key, k, n)
      return shared_negatives.crd_loss_shared(
          *args, jnp.asarray(y), negatives, table, jnp.asarray(labels),
          jnp.asarray(mem_s), jnp.asarray(mem_t), jnp.asarray(z),
          jnp.asarray(z), temperature=tau)[0]

    def per_example(key):
      keys = jax.random.split(key, 3)
      negatives = nce.sample_negatives(keys, jnp.asarray(y), table, k)
      return nce.crd_loss(*args, negatives, jnp.asarray(mem_s),
                          jnp.asarray(mem_t), jnp.asarray(z), jnp.asarray(z),
                          temperature=tau)[0]

    keys = jax.random.split(jax.random.key(k), 4000)
    for fn in (shared, per_example):
      losses = np.asarray(jax.jit(jax.vmap(fn))(keys))
      se = losses.std() / np.sqrt(losses.size)
      assert abs(losses.mean() - want) < 4 * se + 1e-4, (fn.__name__, k)


def test_shared_negatives_count_path_equals_gather_path():
  """K >= n scores every row once, weighted by its count; the same draws
  gathered one by one give the same loss and gradient."""
  rng = np.random.default_rng(2)
  labels, mem_s, mem_t = _split(rng, n=12)
  n = labels.shape[0]
  index = jnp.asarray([1, 5, 8])
  y = jnp.asarray(labels)[index]
  e = jnp.asarray(np_unit(rng.normal(size=(3, 4))), jnp.float32)
  negatives = shared_negatives.sample_shared(jax.random.key(3), 20, n)
  table = nce.class_table(labels)

  def loss(e, force_gather):
    columns = shared_negatives._columns
    if force_gather:  # every draw its own column, weight 1
      shared_negatives._columns = lambda neg, n: (
          neg, jnp.ones(neg.shape, jnp.float32))
    try:
      return shared_negatives.crd_loss_shared(
          e, e, index, y, negatives, table, jnp.asarray(labels),
          jnp.asarray(mem_s), jnp.asarray(mem_t), jnp.asarray(2.0),
          jnp.asarray(2.0), temperature=0.5)[0]
    finally:
      shared_negatives._columns = columns

  for gather in (False, True):
    value, grad = jax.value_and_grad(loss)(e, gather)
    if gather:
      np.testing.assert_allclose(value, want_value, rtol=1e-6)
      np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    want_value, want_grad = value, grad


def test_shared_negatives_leave_padded_rows_out():
  rng = np.random.default_rng(4)
  labels, mem_s, mem_t = _split(rng)
  table = nce.class_table(labels)
  e = jnp.asarray(np_unit(rng.normal(size=(4, 4))), jnp.float32)
  index = jnp.asarray([2, 3, 4, 0])
  negatives = shared_negatives.sample_shared(jax.random.key(0), 10, 30)
  common = (table, jnp.asarray(labels), jnp.asarray(mem_s),
            jnp.asarray(mem_t), -jnp.ones(()), -jnp.ones(()))
  full, z_full = shared_negatives.crd_loss_shared(
      e[:3], e[:3], index[:3], jnp.asarray(labels)[index[:3]], negatives,
      *common, temperature=0.5)
  padded, z_padded = shared_negatives.crd_loss_shared(
      e, e, index, jnp.asarray(labels)[index], negatives, *common,
      temperature=0.5, mask=jnp.asarray([1.0, 1.0, 1.0, 0.0]))
  np.testing.assert_allclose(padded, full, rtol=1e-6)
  np.testing.assert_allclose(z_padded, z_full, rtol=1e-6)


@pytest.mark.slow
def test_bfloat16_bank_is_the_float32_step_on_the_rounded_bank():
  """One minibatch from the same state: the gradient equals the float32
  step's on the bank rounded to bfloat16, and the bank after it is that
  step's bank rounded (later minibatches differ by that rounding)."""
  one = dataclasses.replace(BASE, kt_steps=1)
  init32, grad32 = build(one)
  init16, grad16 = build(dataclasses.replace(one, bank_dtype="bfloat16"))
  s32 = init32(jax.random.key(0), STUDENT)
  s16 = init16(jax.random.key(0), STUDENT)
  assert s16.memory_s.dtype == s16.memory_t.dtype == jnp.bfloat16
  rounded = s32.replace(**{name: getattr(s32, name).astype(
      jnp.bfloat16).astype(jnp.float32) for name in ("memory_s", "memory_t")})
  close(s16.memory_s.astype(jnp.float32), rounded.memory_s, rtol=0, atol=0)
  g32, after32, _ = grad32(STUDENT, rounded)
  g16, after16, _ = grad16(STUDENT, s16)
  close(g16, g32, rtol=1e-6, atol=1e-7)
  for name in ("memory_s", "memory_t"):
    np.testing.assert_array_equal(
        getattr(after16, name), getattr(after32, name).astype(jnp.bfloat16))
  # Several minibatches and rounds run and stay finite.
  g1, g2, _ = two_rounds(dataclasses.replace(BASE, bank_dtype="bfloat16"))
  assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves((g1, g2)))


def test_the_shared_step_runs_end_to_end():
  shared = dataclasses.replace(BASE, negative_sampling="shared", nce_k=40)
  g1, g2, state = two_rounds(shared)
  assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves((g1, g2)))
  assert float(state.z_s) > 0 and float(state.z_t) > 0
