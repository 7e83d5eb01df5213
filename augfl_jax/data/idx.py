"""The IDX file format of the MNIST family (MNIST, Fashion-MNIST, EMNIST, KMNIST).

An IDX file is a big-endian header followed by the array's bytes in C order::

  bytes 0-1  zero
  byte  2    element type: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
             0x0D float32, 0x0E float64
  byte  3    number of dimensions d
  then d     uint32 sizes, then prod(sizes) elements

The files are distributed gzipped (``*-ubyte.gz``) or raw; :func:`read_idx`
takes either (gzip is recognised by its magic bytes, not by the name).
Everything the header promises is checked against what the file holds, so a
truncated, padded or corrupt file raises :class:`DataFileError` naming it.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import numpy as np

__all__ = ["DataFileError", "read_idx", "read_images_and_labels", "write_idx"]

# IDX type code -> big-endian numpy dtype.
_DTYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8),
           0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
           0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_GZIP_MAGIC = b"\x1f\x8b"


class DataFileError(ValueError):
  """A data file exists but does not hold what it should (the message names
  the file and what is wrong)."""


def _read_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    raw = f.read()
  if not raw.startswith(_GZIP_MAGIC):
    return raw
  try:
    return gzip.decompress(raw)
  except (OSError, EOFError, zlib.error) as e:
    raise DataFileError(f"{path}: not a readable gzip file ({e}); the file "
                        "is truncated or corrupt, fetch it again") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads one IDX file (gzipped or raw) into a numpy array of its shape.

  Args:
    path: the file.

  Returns:
    The array, with the header's shape and the native-endian version of its
    element type (``uint8`` for MNIST images and labels).

  Raises:
    DataFileError: a bad magic number, an unknown element type, or a size
      that does not match the header (truncated or trailing bytes).
  """
  path = os.fspath(path)
  raw = _read_bytes(path)
  if (len(raw) < 4 or raw[0:2] != b"\0\0" or raw[2] not in _DTYPES
      or raw[3] == 0):
    raise DataFileError(
        f"{path}: not an IDX file (magic number {raw[:4].hex() or 'missing'};"
        " an IDX file starts with 00 00, a type code in "
        f"{sorted(hex(c) for c in _DTYPES)} and the number of dimensions, "
        "at least 1)")
  dtype, ndim = _DTYPES[raw[2]], raw[3]
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise DataFileError(f"{path}: the IDX header promises {ndim} dimensions "
                        f"but the file has {len(raw)} bytes in all")
  shape = struct.unpack(f">{ndim}I", raw[4:header])
  expected = int(np.prod(shape)) * dtype.itemsize
  found = len(raw) - header
  if found != expected:
    what = "truncated" if found < expected else "longer than its header says"
    raise DataFileError(
        f"{path}: {what}: the header promises shape {shape} "
        f"({expected:,} bytes of data), the file holds {found:,}")
  array = np.frombuffer(raw, dtype, offset=header).reshape(shape)
  return array.astype(dtype.newbyteorder("="), copy=False)


def read_images_and_labels(images_path: str, labels_path: str, *,
                           num_classes: int, label_offset: int = 0
                          ) -> tuple[np.ndarray, np.ndarray]:
  """An image file and its label file, checked against each other.

  Args:
    images_path: IDX file of ``[n, H, W]`` images.
    labels_path: IDX file of ``[n]`` labels.
    num_classes: labels (after the offset) must lie in ``0 .. num_classes-1``.
    label_offset: subtracted from the stored labels (EMNIST letters store
      A..Z as 1..26).

  Returns:
    ``(images [n, H, W, 1] uint8, labels [n] int32)`` in file order.

  Raises:
    DataFileError: either file unreadable, images not 3-d, labels not 1-d,
      different counts, or a label out of range.
  """
  images = read_idx(images_path)
  labels = read_idx(labels_path)
  if images.ndim != 3:
    raise DataFileError(f"{images_path}: expected images [n, height, width],"
                        f" found an array of shape {images.shape}")
  if labels.ndim != 1:
    raise DataFileError(f"{labels_path}: expected labels [n], found an "
                        f"array of shape {labels.shape}")
  if images.shape[0] != labels.shape[0]:
    raise DataFileError(
        f"{images_path} holds {images.shape[0]:,} images but {labels_path} "
        f"holds {labels.shape[0]:,} labels; the two files are not a pair")
  y = labels.astype(np.int64) - label_offset
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    bad = int(np.flatnonzero((y < 0) | (y >= num_classes))[0])
    raise DataFileError(
        f"{labels_path}: label {int(labels[bad])} at position {bad} is out of"
        f" range: expected {label_offset}..{label_offset + num_classes - 1} "
        f"({num_classes} classes)")
  return images[..., None], y.astype(np.int32)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
  """Writes ``array`` as an IDX file, gzipped when ``path`` ends in ``.gz``
  (for tests and for converting data to the format :func:`read_idx` reads)."""
  array = np.asarray(array)
  codes = {dtype.newbyteorder("="): code for code, dtype in _DTYPES.items()}
  code = codes.get(array.dtype.newbyteorder("="))
  if code is None:
    raise ValueError(f"IDX has no type for {array.dtype}")
  payload = (bytes([0, 0, code, array.ndim])
             + struct.pack(f">{array.ndim}I", *array.shape)
             + array.astype(_DTYPES[code], copy=False).tobytes())
  opener = gzip.open if os.fspath(path).endswith(".gz") else open
  with opener(path, "wb") as f:
    f.write(payload)
