"""CIFAR's binary format (augfl_jax.data.cifar) against hand-made files in
the official layout, and cifar10/cifar100 read from them."""

from __future__ import annotations

import os

import numpy as np
import pytest

from augfl_jax import data as D
from augfl_jax.data import catalog, cifar
from tests.test_idx import no_search_roots  # pylint: disable=unused-import


def cifar_records(n: int, label_bytes: int, num_classes: int,
                  seed: int) -> tuple[bytes, np.ndarray, np.ndarray]:
  """``n`` records in CIFAR's binary layout, written byte by byte: the
  label byte(s) (CIFAR-100: coarse, then fine), then 1024 red, 1024 green
  and 1024 blue bytes, each plane row by row. Returns the bytes, the
  labels (the last label byte) and the images ``[n, 32, 32, 3]``."""
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (n, 32, 32, 3), np.uint8)
  labels = (np.arange(n) * 7 + seed) % num_classes
  out = bytearray()
  for image, label in zip(images, labels):
    if label_bytes == 2:
      out.append(int(label) // 5)  # the coarse label: another value
    out.append(int(label))
    for channel in range(3):
      for row in range(32):
        out += bytes(int(v) for v in image[row, :, channel])
  return bytes(out), labels, images


def write_cifar(directory, name: str, **kwargs) -> dict[str, np.ndarray]:
  """The train and test files of ``name`` in ``directory``, hand-made;
  returns each file's ``labels`` and ``images``."""
  spec = catalog.spec(name)
  os.makedirs(directory, exist_ok=True)
  written = {}
  for i, f in enumerate(catalog.split_files(spec, "train") +
                        catalog.split_files(spec, "test")):
    payload, labels, images = cifar_records(
        kwargs.get("n", 6), spec.cifar_label_bytes, spec.num_classes, i)
    with open(os.path.join(directory, f), "wb") as out:
      out.write(payload)
    written[f] = (labels, images)
  return written


def test_cifar10_records_are_read_channels_last_in_file_order(tmp_path):
  a, labels_a, images_a = cifar_records(3, 1, 10, seed=0)
  b, labels_b, images_b = cifar_records(2, 1, 10, seed=1)
  (tmp_path / "data_batch_1.bin").write_bytes(a)
  (tmp_path / "data_batch_2.bin").write_bytes(b)
  assert len(a) == 3 * (1 + 3072)
  images, labels = cifar.read_cifar(
      [tmp_path / "data_batch_1.bin", tmp_path / "data_batch_2.bin"],
      label_bytes=1, num_classes=10)
  assert images.shape == (5, 32, 32, 3) and images.dtype == np.uint8
  np.testing.assert_array_equal(labels, np.concatenate([labels_a, labels_b]))
  np.testing.assert_array_equal(images, np.concatenate([images_a, images_b]))
  # Byte 1 + 32 + 1 of the first record: the red plane's row 1, column 1;
  # byte 1 + 1024: the green plane's first pixel.
  assert images[0, 1, 1, 0] == a[1 + 32 + 1]
  assert images[0, 0, 0, 1] == a[1 + 1024]


def test_cifar100_reads_the_fine_label(tmp_path):
  payload, fine, images = cifar_records(4, 2, 100, seed=3)
  (tmp_path / "train.bin").write_bytes(payload)
  coarse = np.frombuffer(payload, np.uint8).reshape(4, -1)[:, 0]
  assert not np.array_equal(coarse, fine)
  x, y = cifar.read_cifar([tmp_path / "train.bin"], label_bytes=2,
                          num_classes=100)
  np.testing.assert_array_equal(y, fine)
  np.testing.assert_array_equal(x, images)


@pytest.mark.parametrize("damage", ["truncated", "empty", "label"])
def test_a_damaged_file_is_named(tmp_path, damage):
  payload = bytearray(cifar_records(2, 1, 10, seed=0)[0])
  if damage == "truncated":
    payload = payload[:-1]
  elif damage == "empty":
    payload = b""
  else:
    payload[3073] = 10  # the second record's label
  path = tmp_path / "data_batch_1.bin"
  path.write_bytes(bytes(payload))
  with pytest.raises(D.DataFileError) as err:
    cifar.read_cifar([path], label_bytes=1, num_classes=10)
  assert str(path) in str(err.value)
  assert ("label 10 of record 1" if damage == "label"
          else "not a whole number of CIFAR records") in str(err.value)


def test_cifar10_and_cifar100_are_read_from_their_binary_files(
    tmp_path, no_search_roots):  # pylint: disable=redefined-outer-name
  del no_search_roots
  for name, folder in (("cifar10", "cifar-10-batches-bin"),
                       ("cifar100", "cifar-100-binary")):
    written = write_cifar(tmp_path / name / folder, name)
    location = D.locate(name, str(tmp_path))
    assert location.kind == "cifar"
    assert location.path == str(tmp_path / name / folder)
    train = catalog.split_files(catalog.spec(name), "train")
    assert [os.path.basename(f) for f in location.files] == list(train)
    dataset = D.load_dataset(name, data_dir=str(tmp_path))
    assert dataset.x.shape == (6 * len(train), 32, 32, 3)
    assert dataset.source.startswith("CIFAR binary files ")
    np.testing.assert_array_equal(
        dataset.y, np.concatenate([written[f][0] for f in train]))
    test_location = D.locate_test_split(name, location)
    test = D.load_split(name, test_location, "test", like=dataset)
    (test_file,) = catalog.split_files(catalog.spec(name), "test")
    np.testing.assert_array_equal(test.y, written[test_file][0])


def test_a_missing_batch_is_named(tmp_path, no_search_roots):  # pylint: disable=redefined-outer-name
  del no_search_roots
  write_cifar(tmp_path, "cifar10")
  os.remove(tmp_path / "data_batch_3.bin")
  with pytest.raises(D.DatasetUnavailableError,
                     match="is there but not data_batch_3.bin beside it"):
    D.locate("cifar10", str(tmp_path))
  write_cifar(tmp_path / "train_only", "cifar10")
  os.remove(tmp_path / "train_only" / "test_batch.bin")
  location = D.locate("cifar10", str(tmp_path / "train_only"))
  with pytest.raises(D.OfficialTestSplitUnavailable,
                     match="no test_batch.bin in .*--data.download fetches"):
    D.locate_test_split("cifar10", location)
