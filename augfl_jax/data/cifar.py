"""The binary file format of CIFAR-10 and CIFAR-100 (the "binary version").

A file is a sequence of records and nothing else, each record::

  label bytes    CIFAR-10: 1 (the class, 0..9);
                 CIFAR-100: 2 (the coarse class 0..19, then the fine 0..99)
  3072 bytes     the 32x32 colour image: the red plane, then green, then
                 blue, each row by row (channels first, uint8)

CIFAR-10's train split is ``data_batch_1.bin`` .. ``data_batch_5.bin``
(10,000 records each) and its test split ``test_batch.bin``; CIFAR-100's
are ``train.bin`` and ``test.bin``. :func:`read_cifar` reads a split's files
in order, checks that each holds whole records and that every label is in
range, and returns channels-last images, as the other sources do.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from augfl_jax.data.idx import DataFileError

__all__ = ["IMAGE_BYTES", "IMAGE_SHAPE", "read_cifar"]

IMAGE_SHAPE = (32, 32, 3)
IMAGE_BYTES = 32 * 32 * 3


def read_cifar(paths: Sequence[str | os.PathLike], *, label_bytes: int,
               num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """Reads CIFAR binary files, in the order given, as one split.

  Args:
    paths: the split's files.
    label_bytes: label bytes before each image: 1 (CIFAR-10) or 2
      (CIFAR-100: coarse then fine); the last one is the label returned.
    num_classes: labels must lie in ``0 .. num_classes-1``.

  Returns:
    ``(images [n, 32, 32, 3] uint8, labels [n] int32)`` in file order.

  Raises:
    DataFileError: a file that is not a whole number of records (truncated
      or another format) or holds a label out of range.
  """
  record = label_bytes + IMAGE_BYTES
  images, labels = [], []
  for path in map(os.fspath, paths):
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % record:
      raise DataFileError(
          f"{path}: {raw.size:,} bytes, not a whole number of CIFAR records "
          f"of {record:,} bytes ({label_bytes} label byte"
          f"{'s' if label_bytes > 1 else ''} and a 32x32x3 image); the file "
          "is truncated or not the binary version, fetch it again")
    raw = raw.reshape(-1, record)
    y = raw[:, label_bytes - 1]
    if y.max() >= num_classes:
      bad = int(np.flatnonzero(y >= num_classes)[0])
      raise DataFileError(
          f"{path}: label {int(y[bad])} of record {bad} is out of range: "
          f"expected 0..{num_classes - 1} ({num_classes} classes)")
    labels.append(y.astype(np.int32))
    images.append(raw[:, label_bytes:].reshape(-1, 3, 32, 32)
                  .transpose(0, 2, 3, 1))
  return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels)
