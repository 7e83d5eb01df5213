"""CRD with negatives shared across a minibatch: the same estimate, cheaper.

The reference draws, for every example b of a minibatch, its own K
negatives uniformly from the server examples of other classes
(``nce.sample_negatives``): B K random draws, and B (K+1) scores per
direction. Here one set of K draws ``j_1..j_K``, uniform over the whole
split, serves every example of the minibatch; for example b (class c_b,
``n_c`` examples of it) the draws of its own class are left out and the rest
weighted by ``n / (n - n_{c_b})``::

    sum_k [c(j_k) != c_b] n / (n - n_{c_b}) log(K/n / (P_{b j_k} + K/n + eps))

Its expectation over the draws equals that of the reference's term,
``K / (n - n_{c_b}) sum_{j not in c_b} log(K/n / (P_{bj} + K/n + eps))``, so
the loss is the reference's NCE loss with another, unbiased, Monte-Carlo
estimate of the same sum. With ``K <= n`` the draws are without replacement
(a random permutation's first K rows), so ``K = n`` visits every row once
and gives that expectation exactly; with ``K > n`` they are with
replacement, and the scores are computed once per row of the split,
weighted by how often it was drawn (``[B, n]`` scores instead of
``[B, K]``). Cost per minibatch: K draws instead of B K, and ``min(K, n)``
bank rows read once for the whole minibatch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from augfl_jax.models import masked_mean
from augfl_jax.transfer.nce import EPS, HIGHEST, ClassTable
from augfl_jax.core.types import PRNGKey

__all__ = ["crd_loss_shared", "sample_shared"]


def sample_shared(key: PRNGKey, num_negatives: int, n: int) -> jax.Array:
  """``[K]`` server indices for a whole minibatch: without replacement (a
  permutation's first K) when ``K <= n``, else uniform with replacement."""
  if num_negatives <= n:
    return jax.random.permutation(key, n)[:num_negatives].astype(jnp.int32)
  bits = jax.random.bits(key, (num_negatives,), jnp.uint32)
  return (bits % jnp.uint32(n)).astype(jnp.int32)


def _columns(negatives: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
  """The bank rows to score and each one's multiplicity among the draws:
  the K draws themselves (weight 1) when ``K < n``, else every row of the
  split with its count (``[m]`` int32 rows, ``[m]`` float32 weights)."""
  if negatives.shape[0] < n:
    return negatives, jnp.ones(negatives.shape, jnp.float32)
  counts = jnp.zeros((n,), jnp.float32).at[negatives].add(1.0)
  return jnp.arange(n, dtype=jnp.int32), counts


def _direction(bank: jax.Array, e: jax.Array, index: jax.Array,
               columns: jax.Array, weights: jax.Array, valid: jax.Array,
               scale: jax.Array, z: jax.Array, num_negatives: int,
               temperature: float, mask: jax.Array | None
              ) -> tuple[jax.Array, jax.Array]:
  """One NCE direction: scores of e against ``bank`` rows, Z, the loss."""
  n = bank.shape[0]
  bank = jax.lax.stop_gradient(bank).astype(jnp.float32)
  positive = jnp.exp(jnp.sum(bank[index] * e, axis=-1) / temperature)
  negative = jnp.exp(jnp.dot(e, bank[columns].T, precision=HIGHEST)
                     / temperature)                                 # [B, m]
  # Z as the reference fixes it: mean(score) * n over the K+1 scores a row.
  per_row = positive + negative @ weights
  if mask is None:
    mean = jnp.mean(per_row)
  else:
    mean = jnp.sum(jnp.where(mask > 0, per_row, 0.0)) / jnp.maximum(
        jnp.sum(mask > 0), 1)
  z = jnp.where(z < 0, jax.lax.stop_gradient(mean / (num_negatives + 1))
                * n, z)
  noise = num_negatives / n
  p_pos, p_neg = positive / z, negative / z
  log_d1 = jnp.log(p_pos / (p_pos + noise + EPS))
  log_d0 = jnp.log(noise / (p_neg + noise + EPS))
  log_d0 = scale * jnp.sum(jnp.where(valid, log_d0, 0.0) * weights, axis=1)
  return -masked_mean(log_d1 + log_d0, mask), z


def crd_loss_shared(e_s: jax.Array, e_t: jax.Array, index: jax.Array,
                    y: jax.Array, negatives: jax.Array, table: ClassTable,
                    labels: jax.Array, memory_s: jax.Array,
                    memory_t: jax.Array, z_s: jax.Array, z_t: jax.Array, *,
                    temperature: float, mask: jax.Array | None = None
                   ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """The CRD loss of one minibatch with shared negatives (module docstring).

  Args:
    e_s, e_t: ``[B, F]`` unit-norm student / PM embeddings.
    index: ``[B]`` server indices of the positives.
    y: ``[B]`` their labels.
    negatives: ``[K]`` shared server indices (:func:`sample_shared`).
    table: the split's :class:`~augfl_jax.transfer.nce.ClassTable` (its
      ``count`` gives ``n_c``).
    labels: ``[n]`` labels of the whole split.
    memory_s, memory_t: ``[n, F]`` banks (read only; any float dtype).
    z_s, z_t: the normalisation constants (< 0: set them on this batch).
    temperature: tau.
    mask: ``[B]``, 1 = real row.

  Returns:
    ``(NCE(P_s) + NCE(P_t), (z_s, z_t))``, as ``nce.crd_loss``.
  """
  n = memory_s.shape[0]
  k = negatives.shape[0]
  columns, weights = _columns(negatives, n)
  valid = labels[columns][None, :] != y[:, None]                   # [B, m]
  scale = n / (n - table.count[y]).astype(jnp.float32)             # [B]
  loss_s, z_s = _direction(memory_t, e_s, index, columns, weights, valid,
                           scale, z_s, k, temperature, mask)
  loss_t, z_t = _direction(memory_s, e_t, index, columns, weights, valid,
                           scale, z_t, k, temperature, mask)
  return loss_s + loss_t, (z_s, z_t)
