"""Where the examples come from: TFDS image datasets and two embedded ones.

Every loader returns a :class:`Dataset` of whole-split numpy arrays in the
source's own order (the paper's server split is "the first n examples", so
the order is part of the protocol):

* TFDS (``emnist/letters``, ``fashion_mnist``, ``mnist``, ``cifar10``,
  ``cifar100``): the TRAIN split, read offline only (``download=False``,
  ``try_gcs=False``). A dataset that is not prepared under ``data_dir`` raises
  :class:`DatasetUnavailableError` at once; nothing ever touches the network.
  TensorFlow is imported lazily, only when one of these is asked for.
* ``digits``: scikit-learn's bundled 8x8 digits (no download, no TF).
* ``synthetic``: FedProx's Synthetic(alpha, beta) generator (FedBC's paper).

Images are scaled to [0, 1] and then standardised per channel with the
dataset's own mean and standard deviation (computed on the whole split).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

__all__ = [
    "DATASET_DEFAULTS",
    "Dataset",
    "DatasetUnavailableError",
    "available_datasets",
    "load_dataset",
    "synthetic_dataset",
]


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A whole dataset split held in host memory.

  Attributes:
    name: the dataset name as passed to :func:`load_dataset`.
    x: ``[n, H, W, C]`` float32 images standardised per channel, or ``[n, d]``
      float32 features (``synthetic``).
    y: ``[n]`` int32 labels in ``0 .. num_classes - 1``.
    num_classes: number of classes.
    client_ids: ``[n]`` int32 natural client of each example (``synthetic``
      only), else ``None``.
  """

  name: str
  x: np.ndarray
  y: np.ndarray
  num_classes: int
  client_ids: np.ndarray | None = None

  @property
  def num_examples(self) -> int:
    """Number of examples ``n``."""
    return int(self.y.shape[0])


class DatasetUnavailableError(RuntimeError):
  """A TFDS dataset is not prepared locally (and we never download)."""


# tfds name -> (label offset subtracted from the raw tfds label, num_classes
# override). emnist/letters stores A..Z as 1..26 in a 37-way ClassLabel.
_TFDS: dict[str, tuple[int, int | None]] = {
    "emnist/letters": (1, 26),
    "fashion_mnist": (0, None),
    "mnist": (0, None),
    "cifar10": (0, None),
    "cifar100": (0, None),
}
_EMBEDDED = ("digits", "synthetic")

# Protocol defaults per dataset (§VI-A): number of clients N and the size of
# the server split. `synthetic` has natural clients and no server split.
DATASET_DEFAULTS: dict[str, dict[str, int]] = {
    "emnist/letters": {"num_clients": 100, "server_size": 10000},
    "fashion_mnist": {"num_clients": 50, "server_size": 10000},
    "mnist": {"num_clients": 50, "server_size": 10000},
    "cifar10": {"num_clients": 50, "server_size": 10000},
    "cifar100": {"num_clients": 100, "server_size": 10000},
    "digits": {"num_clients": 40, "server_size": 400},
    "synthetic": {"num_clients": 30, "server_size": 0},
}

_SYNTHETIC_DIM = 60
_SYNTHETIC_CLASSES = 10
_DIGITS_SHUFFLE_SEED = 0
_TFDS_READ_BATCH = 4096


def available_datasets() -> tuple[str, ...]:
  """Names accepted by :func:`load_dataset`."""
  return tuple(_TFDS) + _EMBEDDED


def load_dataset(
    name: str,
    *,
    data_dir: str | None = None,
    seed: int = 0,
    synthetic_alpha: float = 1.0,
    synthetic_beta: float = 1.0,
    synthetic_clients: int = 30,
) -> Dataset:
  """Loads a whole dataset split into host memory.

  Args:
    name: one of :func:`available_datasets`.
    data_dir: TFDS data directory holding the prepared dataset (``None``: the
      TFDS default, ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``). Ignored
      by the embedded datasets.
    seed: seed of the ``synthetic`` generator. The other datasets are fixed
      files and do not depend on it (``digits`` always uses the same shuffle).
    synthetic_alpha: alpha of Synthetic(alpha, beta): spread of the per-client
      model means.
    synthetic_beta: beta of Synthetic(alpha, beta): spread of the per-client
      input means.
    synthetic_clients: number of natural clients of ``synthetic``.

  Returns:
    The :class:`Dataset`.

  Raises:
    ValueError: unknown ``name`` or bad synthetic arguments.
    DatasetUnavailableError: a TFDS dataset is not prepared under ``data_dir``.
  """
  if name in _TFDS:
    return _load_tfds(name, data_dir)
  if name == "digits":
    return _load_digits()
  if name == "synthetic":
    return synthetic_dataset(
        alpha=synthetic_alpha, beta=synthetic_beta,
        num_clients=synthetic_clients, seed=seed)
  raise ValueError(
      f"Unknown dataset {name!r}; available datasets are "
      f"{', '.join(available_datasets())}.")


def _standardise(x: np.ndarray) -> np.ndarray:
  """Standardises ``[n, ..., C]`` float32 in place per channel (last axis).

  Statistics are accumulated in float64 over chunks so a large split needs no
  float64 copy. A constant channel (std 0) is only centred.
  """
  c = x.shape[-1]
  flat = x.reshape(-1, c)
  total = np.zeros(c, np.float64)
  total_sq = np.zeros(c, np.float64)
  chunk = 1 << 20
  for start in range(0, flat.shape[0], chunk):
    part = flat[start:start + chunk].astype(np.float64)
    total += part.sum(0)
    total_sq += np.square(part).sum(0)
  count = max(flat.shape[0], 1)
  mean = total / count
  std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 0.0))
  std = np.where(std > 1e-12, std, 1.0)
  x -= mean.astype(np.float32)
  x /= std.astype(np.float32)
  return x


def _unavailable_message(name: str, searched: str) -> str:
  return (
      f"Dataset {name!r} is not available offline: no prepared copy of its "
      f"TFDS train split was found in data_dir {searched!r}, and augfl_jax "
      "never downloads. Prepare it once on a machine with internet access "
      f"(`tfds build {name} --data_dir=DIR`, or in Python "
      f"`tfds.load({name!r}, data_dir=DIR)`), copy DIR here and pass "
      "`--data_dir=DIR` (data_dir=DIR in Python); or use an embedded dataset "
      "that needs no files: `digits` or `synthetic`.")


def _searched_dir(tfds: Any, name: str, data_dir: str | None) -> str:
  """The data directory tfds looked in (best effort, for error messages)."""
  if data_dir is not None:
    return str(data_dir)
  try:
    return str(tfds.builder(name, try_gcs=False).data_dir_root)
  except Exception:  # pylint: disable=broad-except
    return os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")


def _load_tfds(name: str, data_dir: str | None) -> Dataset:
  """Reads the TFDS train split in its stored order, offline only."""
  # Lazy: TF/TFDS cost seconds to import and embedded datasets need neither.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  # TF only reads files here: keep it off the accelerators JAX uses.
  tf.config.set_visible_devices([], "GPU")

  offset, classes_override = _TFDS[name]
  try:
    ds, info = tfds.load(
        name, split="train", data_dir=data_dir, download=False,
        try_gcs=False, shuffle_files=False, as_supervised=True,
        with_info=True)
  except AssertionError as e:
    # TFDS signals "not prepared" with an AssertionError from as_dataset().
    if "could not find data" not in str(e):
      raise
    raise DatasetUnavailableError(
        _unavailable_message(name, _searched_dir(tfds, name, data_dir))
    ) from None

  # Iterate rather than batch_size=-1: the latter aborts TF 2.21 under
  # tfds.testing.mock_data, and batches keep peak memory lower anyway.
  images, labels = [], []
  for image, label in tfds.as_numpy(ds.batch(_TFDS_READ_BATCH)):
    images.append(image)
    labels.append(label)
  shape = tuple(info.features["image"].shape)
  if images:
    x_raw = np.concatenate(images)
    y = np.concatenate(labels).astype(np.int64)
  else:
    x_raw = np.zeros((0,) + shape, np.uint8)
    y = np.zeros((0,), np.int64)

  num_classes = info.features["label"].num_classes - offset
  if classes_override is not None:
    num_classes = classes_override
  y = y - offset
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    raise ValueError(
        f"Dataset {name!r}: labels after the shift by -{offset} span "
        f"{y.min()}..{y.max()}, expected 0..{num_classes - 1}; the prepared "
        "files do not match the expected TFDS version.")

  x = x_raw.astype(np.float32)
  del x_raw, images
  x /= 255.0
  _standardise(x)
  return Dataset(name=name, x=x, y=y.astype(np.int32),
                 num_classes=int(num_classes))


def _load_digits() -> Dataset:
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
  _standardise(x)
  y = raw.target[perm].astype(np.int32)
  return Dataset(name="digits", x=x, y=y, num_classes=10)


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
