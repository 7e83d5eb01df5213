"""The CRD loss of one minibatch (AugFL Section V; RepDistiller ``crd/``).

Pure functions of arrays; ``augfl_jax.transfer.crd`` holds the state (heads,
banks, constants) and the server step that calls them. With ``n`` server
examples, ``F = feat_dim``, ``B`` a minibatch and ``K`` negatives:

* ``P_s[j] = exp(<memory_t[j], e_s> / tau) / Z_s``,
  ``P_t[j] = exp(<memory_s[j], e_t> / tau) / Z_t`` for the positive j_0 and
  K negatives of other classes (:func:`sample_negatives`,
  :func:`contrast_scores`); each Z is fixed on the first batch as
  ``mean(exp(...)) * n`` (:func:`fix_z`).
* NCE per direction (:func:`nce_loss`, eps = 1e-7):
  ``-[log(P_0 / (P_0 + K/n + eps)) + sum_k log((K/n) / (P_k + K/n + eps))]``
  averaged over the batch; :func:`crd_loss` sums both directions.
* Bank rows move to ``normalize(m row + (1-m) e)`` (:func:`update_memory`).
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.models import masked_mean
from augfl_jax.core.types import Params, PRNGKey

__all__ = [
    "class_table", "ClassTable", "contrast_scores", "crd_loss", "embed", "EPS",
    "fix_z", "HIGHEST", "init_arrays", "init_head", "kd_loss", "nce_loss",
    "sample_negatives", "update_memory"
]

EPS = 1e-7  # crd/criterion.py
HIGHEST = jax.lax.Precision.HIGHEST  # logits are divided by tau = 0.07


# ---------------------------------------------------------------- negatives


@flax.struct.dataclass
class ClassTable:
  """Server indices sorted by class: class c holds
  ``sorted_index[start[c] : start[c] + count[c]]`` (``[n]``, ``[C]``, ``[C]``).
  """

  sorted_index: jax.Array
  start: jax.Array
  count: jax.Array


def class_table(labels: np.ndarray) -> ClassTable:
  """Builds the :class:`ClassTable` of ``labels`` (``[n]`` ints >= 0)."""
  labels = np.asarray(labels, np.int64)
  order = np.argsort(labels, kind="stable")
  count = np.bincount(labels)
  start = np.concatenate([[0], np.cumsum(count)[:-1]])
  return ClassTable(sorted_index=jnp.asarray(order, jnp.int32),
                    start=jnp.asarray(start, jnp.int32),
                    count=jnp.asarray(count, jnp.int32))


def sample_negatives(keys: PRNGKey, y: jax.Array, table: ClassTable,
                     num_negatives: int) -> jax.Array:
  """K negatives per example, uniform with replacement over other classes.

  A class c occupies sorted positions ``[start_c, start_c + count_c)``; a
  draw ``u ~ U{0, ..., n - count_c - 1}`` maps to position ``u`` if
  ``u < start_c`` else ``u + count_c``, so every example of another class has
  probability ``1 / (n - count_c)``. (The reference draws without replacement
  when K <= n - count_c; with the paper's sizes, K = 16384 > n = 10000, it is
  always with replacement.)

  Args:
    keys: ``[B]`` keys, one per example.
    y: ``[B]`` int labels.
    table: the :class:`ClassTable` of the server labels.
    num_negatives: K.

  Returns:
    ``[B, K]`` int32 server indices.
  """
  n = table.sorted_index.shape[0]

  def one(key, label):
    start, count = table.start[label], table.count[label]
    # u = bits mod (n - count_c): bias <= n / 2^32, and one PRNG call
    # instead of randint's three (this runs inside every CRD minibatch).
    bits = jax.random.bits(key, (num_negatives,), jnp.uint32)
    u = (bits % (n - count).astype(jnp.uint32)).astype(jnp.int32)
    return table.sorted_index[jnp.where(u < start, u, u + count)]

  return jax.vmap(one)(keys, y)


# ---------------------------------------------------------------- the loss


def contrast_scores(bank: jax.Array, e: jax.Array, contrast_idx: jax.Array,
                    temperature: float) -> jax.Array:
  """``exp(<bank[contrast_idx[b, k]], e[b]> / tau)``, ``[B, K+1]``.

  When ``n <= B (K+1)`` all ``[B, n]`` dot products are cheaper than the
  ``[B, K+1, F]`` gather of the reference; both give the same numbers.
  """
  b, k1 = contrast_idx.shape
  if bank.shape[0] <= b * k1:
    all_logits = jnp.dot(e, bank.T, precision=HIGHEST)
    logits = jnp.take_along_axis(all_logits, contrast_idx, axis=1)
  else:
    logits = jnp.einsum("bkf,bf->bk", bank[contrast_idx], e,
                        precision=HIGHEST)
  return jnp.exp(logits / temperature)


def fix_z(z: jax.Array, scores: jax.Array, n_data: int,
          mask: jax.Array | None = None) -> jax.Array:
  """Z unchanged if set (>= 0), else ``mean(scores) * n_data`` (real rows)."""
  if mask is None:
    mean = jnp.mean(scores)
  else:
    real = mask[:, None] > 0
    mean = (jnp.sum(jnp.where(real, scores, 0.0))
            / (jnp.maximum(jnp.sum(mask > 0), 1) * scores.shape[1]))
  return jnp.where(z < 0, jax.lax.stop_gradient(mean) * n_data, z)


def nce_loss(p: jax.Array, n_data: int,
             mask: jax.Array | None = None) -> jax.Array:
  """ContrastLoss: ``p`` is ``[B, K+1]`` (column 0 the positive), ``P/Z``."""
  noise = (p.shape[1] - 1) / n_data  # K * P_n with P_n = 1 / n
  log_d1 = jnp.log(p[:, 0] / (p[:, 0] + noise + EPS))
  log_d0 = jnp.sum(jnp.log(noise / (p[:, 1:] + noise + EPS)), axis=1)
  return -masked_mean(log_d1 + log_d0, mask)


def crd_loss(e_s: jax.Array, e_t: jax.Array, index: jax.Array,
             negatives: jax.Array, memory_s: jax.Array, memory_t: jax.Array,
             z_s: jax.Array, z_t: jax.Array, *, temperature: float,
             mask: jax.Array | None = None
            ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """The CRD loss of one minibatch (CRDLoss.forward minus the heads).

  Args:
    e_s, e_t: ``[B, F]`` unit-norm student / PM embeddings.
    index: ``[B]`` server indices of the positives (valid even for padding).
    negatives: ``[B, K]`` server indices.
    memory_s, memory_t: ``[n, F]`` banks (read only, no gradient; float32
      or a narrower float, read as float32).
    z_s, z_t: the normalisation constants (< 0: set them on this batch).
    temperature: tau.
    mask: ``[B]``, 1 = real row; padded rows enter neither loss nor Z.

  Returns:
    ``(NCE(P_s) + NCE(P_t), (z_s, z_t))`` with the (possibly new) constants.
  """
  n = memory_s.shape[0]
  idx = jnp.concatenate([index[:, None], negatives], axis=1)
  read = lambda bank: jax.lax.stop_gradient(bank).astype(jnp.float32)
  out_s = contrast_scores(read(memory_t), e_s, idx, temperature)
  out_t = contrast_scores(read(memory_s), e_t, idx, temperature)
  z_s = fix_z(z_s, out_s, n, mask)
  z_t = fix_z(z_t, out_t, n, mask)
  loss = nce_loss(out_s / z_s, n, mask) + nce_loss(out_t / z_t, n, mask)
  return loss, (z_s, z_t)


def update_memory(memory: jax.Array, index: jax.Array, e: jax.Array,
                  momentum: float, mask: jax.Array | None = None
                 ) -> jax.Array:
  """Rows ``index`` <- ``normalize(m row + (1 - m) e)``; padded rows skipped.

  ``index`` must not repeat among real rows (a minibatch of one shuffle).
  The rows are computed in float32 and stored in the bank's dtype.
  """
  rows = (memory[index].astype(jnp.float32) * momentum
          + (1.0 - momentum) * jax.lax.stop_gradient(e))
  rows = rows / jnp.sqrt(jnp.sum(rows * rows, axis=-1, keepdims=True))
  rows = rows.astype(memory.dtype)
  if mask is not None:
    index = jnp.where(mask > 0, index, memory.shape[0])  # out of range: drop
  return memory.at[index].set(rows, mode="drop")


def kd_loss(student_logits: jax.Array, teacher_logits: jax.Array,
            temperature: float, mask: jax.Array | None = None) -> jax.Array:
  """DistillKL: ``T^2 mean_b KL(softmax(t/T) || softmax(s/T))``."""
  log_p_s = jax.nn.log_softmax(student_logits.astype(jnp.float32)
                               / temperature)
  log_p_t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32)
                               / temperature)
  kl = jnp.sum(jnp.exp(log_p_t) * (log_p_t - log_p_s), axis=-1)
  return masked_mean(kl, mask) * temperature**2


def init_head(key: PRNGKey, dim_in: int, dim_out: int) -> Params:
  """``nn.Linear(dim_in, dim_out)`` params as PyTorch initialises them.

  Kernel and bias uniform in ``[-1/sqrt(dim_in), 1/sqrt(dim_in)]``.
  """
  bound = 1.0 / math.sqrt(dim_in)
  k_w, k_b = jax.random.split(key)
  return {"kernel": jax.random.uniform(k_w, (dim_in, dim_out), jnp.float32,
                                       -bound, bound),
          "bias": jax.random.uniform(k_b, (dim_out,), jnp.float32,
                                     -bound, bound)}


def embed(head: Params, features: jax.Array,
          mask: jax.Array | None = None) -> jax.Array:
  """``normalize(flatten(features) @ kernel + bias)``: ``[B, ...] -> [B, F]``.

  Padded rows (mask 0) are replaced before normalising so that they can never
  produce a NaN, not even in a gradient.
  """
  x = features.reshape(features.shape[0], -1).astype(jnp.float32)
  z = jnp.dot(x, head["kernel"], precision=HIGHEST) + head["bias"]
  if mask is not None:
    z = jnp.where(mask[:, None] > 0, z, 1.0)
  return z / jnp.sqrt(jnp.sum(z * z, axis=-1, keepdims=True))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def init_arrays(key: PRNGKey, d_s: int, d_t: int, n: int, feat_dim: int):
  """Heads (PyTorch init), banks U[-1/sqrt(F/3), 1/sqrt(F/3)], root key."""
  k_s, k_t, k_ms, k_mt, k_root = jax.random.split(key, 5)
  heads = {"embed_s": init_head(k_s, d_s, feat_dim),
           "embed_t": init_head(k_t, d_t, feat_dim)}
  stdv = 1.0 / math.sqrt(feat_dim / 3)
  bank = lambda k: jax.random.uniform(k, (n, feat_dim), jnp.float32, -stdv,
                                      stdv)
  return heads, bank(k_ms), bank(k_mt), k_root


