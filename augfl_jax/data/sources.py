"""Where the examples come from: IDX files, tfds prepared copies, embedded sets.

:func:`load_dataset` returns a :class:`Dataset` of whole-split numpy arrays in
the source's own order (the paper's server split is "the first n examples",
so the order is part of the protocol). It finds the files with
:func:`augfl_jax.data.catalog.locate` (the search order is there) and reads:

* IDX files (``mnist``, ``fashion_mnist``, ``kmnist``, ``emnist/*``): the
  train split, in file order (:mod:`augfl_jax.data.idx`);
* CIFAR binary files (``cifar10``, ``cifar100``): the train split, in file
  order (:mod:`augfl_jax.data.cifar`);
* a tfds prepared copy (any of those, ``cifar10``, ``cifar100``): the train
  split in its stored order, offline only (``download=False``,
  ``try_gcs=False``); TensorFlow is imported only then;
* ``digits``, ``synthetic`` and any dataset registered with a ``load``
  function: that function (``DatasetSpec.load``; the embedded ones are in
  :mod:`augfl_jax.data.embedded`).

Images are scaled to [0, 1] and then standardised per channel with the
split's own mean and standard deviation. A dataset that is not on this
machine raises :class:`DatasetUnavailableError` at once; nothing here
touches the network (``--data.download``, :mod:`augfl_jax.data.download`,
fetches the files when asked).
"""

from __future__ import annotations

import os

import numpy as np

from augfl_jax.data import catalog, cifar, idx
from augfl_jax.data.catalog import DatasetUnavailableError
from augfl_jax.data.dataset import Dataset, standardise

__all__ = [
    "Dataset",
    "DatasetUnavailableError",
    "available_datasets",
    "load_dataset",
    "load_split",
]

_TFDS_READ_BATCH = 4096


def available_datasets() -> tuple[str, ...]:
  """Canonical names accepted by :func:`load_dataset` (aliases such as
  ``"emnist"`` are accepted too: :data:`catalog.ALIASES`)."""
  return tuple(catalog.DATASETS)


def load_dataset(
    name: str,
    *,
    data_dir: str | None = None,
    seed: int = 0,
    num_clients: int | None = None,
    location: catalog.Location | None = None,
) -> Dataset:
  """Loads a whole dataset split into host memory.

  Args:
    name: one of :func:`available_datasets` or an alias (``"emnist"``).
    data_dir: searched first for the dataset's files (IDX files or a tfds
      prepared copy); see :mod:`augfl_jax.data.catalog` for the rest of the
      search order. Ignored by the embedded datasets.
    seed: seed of a generated dataset (``synthetic``). The others are fixed
      and do not depend on it (``digits`` always uses the same shuffle).
    num_clients: how many natural clients a generated dataset of natural
      clients makes (default: its spec's ``num_clients``).
    location: where its files are, when the caller has found them already
      (``data_dir`` is then not searched).

  Returns:
    The :class:`Dataset` (``name`` canonical).

  Raises:
    ValueError: unknown ``name`` or bad arguments of a generated dataset.
    DatasetUnavailableError: the dataset's files are not on this machine.
    idx.DataFileError: a file that is there but truncated, corrupt or not
      matching its pair.
  """
  spec = catalog.spec(name)
  if spec.load is not None:
    return spec.load(seed, num_clients or spec.num_clients)
  return _read(spec, location or catalog.locate(spec.name, data_dir),
               "train", None)


def load_split(name: str, location: catalog.Location, split: str,
               like: Dataset | None = None) -> Dataset:
  """One split of a dataset with files, from where it was found.

  Args:
    name: the dataset's name.
    location: where its files are (:func:`catalog.locate`, or a test
      split's location).
    split: ``"train"`` or ``"test"`` (for the tfds copy's split).
    like: standardise with this dataset's statistics (a test split with
      its train split's), whose examples' shape this split's must have;
      ``None``: with the split's own.

  Returns:
    The :class:`Dataset`, in the files' order.

  Raises:
    idx.DataFileError: a file that is truncated or corrupt, or examples of
      another shape than ``like``'s (14x14 test images beside 28x28 train
      images), checked as the files are read.
  """
  return _read(catalog.spec(name), location, split, like)


def _shape(shape: tuple[int, ...]) -> str:
  """``28x28x1``."""
  return "x".join(str(d) for d in shape)


def _read(spec: catalog.DatasetSpec, location: catalog.Location, split: str,
          like: Dataset | None) -> Dataset:
  if location.kind == "idx":
    images, y = idx.read_images_and_labels(
        *location.files, num_classes=spec.num_classes,
        label_offset=spec.label_offset)
  elif location.kind == "cifar":
    images, y = cifar.read_cifar(location.files,
                                 label_bytes=spec.cifar_label_bytes,
                                 num_classes=spec.num_classes)
  else:
    images, y = _read_tfds(spec, location.path, split)
  if like is not None and images.shape[1:] != like.x.shape[1:]:
    raise idx.DataFileError(
        f"dataset {spec.name!r}: the {split} split's examples are "
        f"{_shape(images.shape[1:])} ({location.describe()}) but the train "
        f"split's are {_shape(like.x.shape[1:])} ({like.source}); put the "
        f"{split} files of the same dataset beside the train files")
  statistics = None if like is None else like.standardisation
  x = images.astype(np.float32)
  del images
  x /= 255.0
  statistics = standardise(x, statistics)
  return Dataset(name=spec.name, x=x, y=y, num_classes=spec.num_classes,
                 source=location.describe(), standardisation=statistics)


def import_tfds():
  """``tensorflow_datasets``, imported with TensorFlow kept off the
  accelerators JAX uses (TF only reads and writes files here) and its INFO
  notices (oneDNN, CPU features) hidden unless asked for. Lazy: TF and
  tfds cost seconds to import and no other source needs them."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  tf.config.set_visible_devices([], "GPU")
  return tfds


def _read_tfds(spec: catalog.DatasetSpec, data_dir: str, split: str = "train"
              ) -> tuple[np.ndarray, np.ndarray]:
  """A tfds prepared copy's ``split`` in its stored order, offline only:
  ``(images [n, H, W, C] uint8, labels [n] int32)``."""
  tfds = import_tfds()
  try:
    ds, info = tfds.load(
        spec.tfds_name, split=split, data_dir=data_dir, download=False,
        try_gcs=False, shuffle_files=False, as_supervised=True,
        with_info=True)
  except AssertionError as e:
    # tfds signals "not prepared" with an AssertionError from as_dataset().
    raise DatasetUnavailableError(
        f"dataset {spec.name!r}: the tfds copy in {data_dir} cannot be read "
        f"({str(e).splitlines()[0]}); {catalog.remedy(spec)}") from None

  # Iterate rather than batch_size=-1: the latter aborts TF 2.21 under
  # tfds.testing.mock_data, and batches keep peak memory lower anyway.
  images, labels = [], []
  for image, label in tfds.as_numpy(ds.batch(_TFDS_READ_BATCH)):
    images.append(image)
    labels.append(label)
  shape = tuple(info.features["image"].shape)
  x = np.concatenate(images) if images else np.zeros((0,) + shape, np.uint8)
  y = (np.concatenate(labels).astype(np.int64) if labels
       else np.zeros((0,), np.int64)) - spec.label_offset
  if y.size and (y.min() < 0 or y.max() >= spec.num_classes):
    raise idx.DataFileError(
        f"dataset {spec.name!r} in {data_dir}: labels after the shift by "
        f"-{spec.label_offset} span {y.min()}..{y.max()}, expected "
        f"0..{spec.num_classes - 1}; the prepared copy is not the expected "
        "tfds version")
  return x, y.astype(np.int32)
