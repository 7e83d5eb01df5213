"""The embedded datasets: they need no files.

* ``digits``: scikit-learn's bundled 8x8 digits, in a fixed shuffle.
* ``synthetic``: FedProx's Synthetic(alpha, beta) generator (FedBC's paper),
  with natural clients.
"""

from __future__ import annotations

import numpy as np

from augfl_jax.data.dataset import Dataset, standardise

__all__ = ["digits_dataset", "synthetic_dataset"]

_SYNTHETIC_DIM = 60
_SYNTHETIC_CLASSES = 10
_DIGITS_SHUFFLE_SEED = 0


def digits_dataset() -> Dataset:
  """scikit-learn's 8x8 digits as ``[1797, 8, 8, 1]``, in a fixed shuffle.

  The raw file is ordered by writer, so "the first n examples" would be a
  biased server split. The examples are therefore permuted once with the fixed
  seed ``0`` (independent of any user seed): the dataset is always identical,
  and its first n examples are a fair sample of all classes.
  """
  # Lazy: scikit-learn takes a second to import.
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  raw = datasets.load_digits()
  perm = np.random.default_rng(_DIGITS_SHUFFLE_SEED).permutation(
      raw.images.shape[0])
  x = (raw.images[perm].astype(np.float32) / 16.0)[..., None]
  statistics = standardise(x)
  y = raw.target[perm].astype(np.int32)
  return Dataset(name="digits", x=x, y=y, num_classes=10,
                 standardisation=statistics)


def synthetic_dataset(
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 30,
    seed: int = 0,
) -> Dataset:
  """FedProx's Synthetic(alpha, beta) (FedBC), deterministic from ``seed``.

  Follows the FedProx reference generator (``generate_synthetic.py``), with
  ``np.random.default_rng(seed)`` instead of the global numpy state. For each
  client ``i`` (``N(m, s)`` below takes the standard deviation ``s``, as the
  reference's ``np.random.normal`` does)::

    n_i = int(lognormal(4, 2)) + 50
    u_i ~ N(0, alpha);  B_i ~ N(0, beta);  v_i ~ N(B_i, 1)^60
    W_i ~ N(u_i, 1)^{60x10};  b_i ~ N(u_i, 1)^10
    x ~ N(v_i, Sigma),  Sigma = diag((j + 1)^-1.2, j = 0..59)
    y = argmax softmax(W_i^T x + b_i)

  Args:
    alpha: spread of the per-client model means ``u_i``.
    beta: spread of the per-client input means ``B_i``.
    num_clients: number of natural clients.
    seed: generator seed.

  Returns:
    A :class:`Dataset` with ``x`` ``[n, 60]`` float32 (not standardised),
    ``y`` ``[n]`` int32 in 0..9 and ``client_ids`` ``[n]`` int32; the examples
    of client 0 come first, then client 1, and so on.
  """
  if num_clients < 1:
    raise ValueError(f"synthetic needs num_clients >= 1, got {num_clients}.")
  if alpha < 0 or beta < 0:
    raise ValueError(
        f"synthetic needs alpha >= 0 and beta >= 0, got alpha={alpha}, "
        f"beta={beta}.")
  rng = np.random.default_rng(seed)
  dim, k = _SYNTHETIC_DIM, _SYNTHETIC_CLASSES
  sizes = rng.lognormal(4, 2, num_clients).astype(int) + 50
  mean_w = rng.normal(0, alpha, num_clients)
  mean_b = mean_w
  big_b = rng.normal(0, beta, num_clients)
  sigma_sqrt = np.sqrt(np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2))
  mean_x = np.stack([rng.normal(big_b[i], 1, dim) for i in range(num_clients)])

  xs, ys = [], []
  for i in range(num_clients):
    w = rng.normal(mean_w[i], 1, (dim, k))
    b = rng.normal(mean_b[i], 1, k)
    # Diagonal covariance: mean + sqrt(diag) * N(0, I) is the same Gaussian as
    # the reference's multivariate_normal(mean, diag(...)).
    xx = mean_x[i] + rng.standard_normal((sizes[i], dim)) * sigma_sqrt
    xs.append(xx)
    ys.append(np.argmax(xx @ w + b, axis=1))  # softmax is monotone.
  client_ids = np.repeat(np.arange(num_clients), sizes)
  return Dataset(
      name="synthetic",
      x=np.concatenate(xs).astype(np.float32),
      y=np.concatenate(ys).astype(np.int32),
      num_classes=k,
      client_ids=client_ids.astype(np.int32))
