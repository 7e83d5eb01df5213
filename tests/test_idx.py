"""The IDX reader and where datasets are looked for, on files the tests write."""

from __future__ import annotations

import dataclasses
import gzip
import os

import numpy as np
import pytest

from augfl_jax import data as D
from augfl_jax.data import catalog, idx

IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"


def write_pair(directory, n=30, *, gz=True, labels=None, prefix="",
               image_shape=(28, 28)) -> tuple[np.ndarray, np.ndarray]:
  """An IDX image/label pair of ``n`` examples in ``directory``."""
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (n,) + image_shape).astype(np.uint8)
  y = np.arange(n, dtype=np.uint8) % 10 if labels is None else labels
  ext = ".gz" if gz else ""
  idx.write_idx(os.path.join(directory, prefix + IMAGES + ext), x)
  idx.write_idx(os.path.join(directory, prefix + LABELS + ext), y)
  return x, y


@pytest.fixture
def no_search_roots(monkeypatch, tmp_path):
  """Only the ``data_dir`` a test passes is searched: no env var, an empty
  user data directory, no system directory, an empty tfds default."""
  monkeypatch.delenv(catalog.ENV_VAR, raising=False)
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "empty_tfds"))
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no_user_data"))
  monkeypatch.setitem(
      catalog._REGISTRY, "fashion_mnist", dataclasses.replace(
          catalog.DATASETS["fashion_mnist"],
          system_dirs=(str(tmp_path / "no_debian"),)))


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_round_trip(tmp_path, gz):
  for array in (np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
                np.arange(5, dtype=np.int32) - 2,
                np.linspace(0, 1, 6, dtype=np.float32).reshape(3, 2)):
    path = str(tmp_path / ("a.idx" + (".gz" if gz else "")))
    idx.write_idx(path, array)
    got = idx.read_idx(path)
    assert got.shape == array.shape and got.dtype == array.dtype
    np.testing.assert_array_equal(got, array)


def test_read_idx_detects_gzip_by_content(tmp_path):
  path = tmp_path / "labels-without-extension"
  idx.write_idx(str(path) + ".gz", np.arange(7, dtype=np.uint8))
  os.rename(str(path) + ".gz", path)
  np.testing.assert_array_equal(idx.read_idx(path), np.arange(7))


def test_truncated_file(tmp_path):
  path = str(tmp_path / IMAGES)
  idx.write_idx(path, np.zeros((10, 28, 28), np.uint8))
  with open(path, "rb") as f:
    raw = f.read()
  with open(path, "wb") as f:
    f.write(raw[:-100])
  with pytest.raises(idx.DataFileError, match=f"{path}: truncated.*"
                     r"\(10, 28, 28\)"):
    idx.read_idx(path)
  with open(path, "wb") as f:
    f.write(raw + b"\0")
  with pytest.raises(idx.DataFileError, match="longer than its header"):
    idx.read_idx(path)


def test_truncated_and_corrupt_gzip(tmp_path):
  path = str(tmp_path / (IMAGES + ".gz"))
  idx.write_idx(path, np.zeros((100, 28, 28), np.uint8))
  with open(path, "rb") as f:
    raw = f.read()
  with open(path, "wb") as f:
    f.write(raw[: len(raw) // 2])
  with pytest.raises(idx.DataFileError, match=f"{path}: not a readable gzip"):
    idx.read_idx(path)
  corrupt = bytearray(raw)
  corrupt[len(raw) // 2] ^= 0xFF
  with open(path, "wb") as f:
    f.write(bytes(corrupt))
  with pytest.raises(idx.DataFileError, match=path):
    idx.read_idx(path)


@pytest.mark.parametrize("head", [b"\x00\x00\x08", b"\x12\x34\x08\x03",
                                  b"\x00\x00\x77\x03", b""])
def test_wrong_magic_number(tmp_path, head):
  path = str(tmp_path / "bad")
  with gzip.open(path, "wb") as f:
    f.write(head + b"\0" * 64)
  with pytest.raises(idx.DataFileError, match=f"{path}: not an IDX file"):
    idx.read_idx(path)


def test_pair_checks(tmp_path):
  write_pair(tmp_path / "a", 30)
  x, y = idx.read_images_and_labels(
      str(tmp_path / "a" / (IMAGES + ".gz")),
      str(tmp_path / "a" / (LABELS + ".gz")), num_classes=10)
  assert x.shape == (30, 28, 28, 1) and x.dtype == np.uint8
  assert y.dtype == np.int32 and y.tolist() == [i % 10 for i in range(30)]
  # Mismatched counts.
  write_pair(tmp_path / "b", 30, labels=np.zeros(29, np.uint8))
  with pytest.raises(idx.DataFileError, match="30 images but .* 29 labels"):
    idx.read_images_and_labels(
        str(tmp_path / "b" / (IMAGES + ".gz")),
        str(tmp_path / "b" / (LABELS + ".gz")), num_classes=10)
  # A label out of range (EMNIST letters: 1..26 after no shift is 0..25).
  labels = np.arange(30, dtype=np.uint8) % 10
  labels[7] = 12
  write_pair(tmp_path / "c", 30, labels=labels)
  with pytest.raises(idx.DataFileError,
                     match=r"label 12 at position 7 is out of range: "
                     r"expected 0\.\.9"):
    idx.read_images_and_labels(
        str(tmp_path / "c" / (IMAGES + ".gz")),
        str(tmp_path / "c" / (LABELS + ".gz")), num_classes=10)
  with pytest.raises(idx.DataFileError, match=r"expected 1\.\.26"):
    idx.read_images_and_labels(
        str(tmp_path / "a" / (IMAGES + ".gz")),
        str(tmp_path / "a" / (LABELS + ".gz")), num_classes=26,
        label_offset=1)
  # Images swapped with labels: the wrong number of dimensions.
  with pytest.raises(idx.DataFileError, match=r"expected images \[n, height"):
    idx.read_images_and_labels(
        str(tmp_path / "a" / (LABELS + ".gz")),
        str(tmp_path / "a" / (IMAGES + ".gz")), num_classes=10)


def test_load_from_data_dir_in_file_order(tmp_path, no_search_roots):
  x, y = write_pair(tmp_path / "fm", 60, gz=False)
  ds = D.load_dataset("fashion_mnist", data_dir=str(tmp_path / "fm"))
  assert ds.name == "fashion_mnist" and ds.x.shape == (60, 28, 28, 1)
  np.testing.assert_array_equal(ds.y, y)
  # File order, standardised per channel: the ranking of pixels is kept.
  np.testing.assert_array_equal(np.argsort(ds.x.ravel(), kind="stable"),
                                np.argsort(x.ravel(), kind="stable"))
  assert ds.source.startswith("IDX files ")


def test_search_order(tmp_path, monkeypatch, no_search_roots):
  write_pair(tmp_path / "given" / "fashion_mnist", 20)
  write_pair(tmp_path / "env", 20, gz=False)
  monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path / "env"))
  # --data_dir first, in a sub-directory named after the dataset.
  loc = D.locate("fashion_mnist", str(tmp_path / "given"))
  assert loc.kind == "idx"
  assert loc.path == str(tmp_path / "given" / "fashion_mnist")
  assert loc.files[0].endswith(IMAGES + ".gz")
  # Then the environment variable (raw files); a --data_dir that does not
  # exist is an error, not a place to look past.
  with pytest.raises(D.DatasetUnavailableError, match="is not a directory"):
    D.locate("fashion_mnist", str(tmp_path / "elsewhere"))
  (tmp_path / "elsewhere").mkdir()
  loc = D.locate("fashion_mnist", str(tmp_path / "elsewhere"))
  assert loc.path == str(tmp_path / "env") and loc.files[1].endswith(LABELS)
  loc = D.locate("fashion_mnist")
  assert loc.path == str(tmp_path / "env")
  # Then the system directory of the Debian package.
  monkeypatch.delenv(catalog.ENV_VAR)
  write_pair(tmp_path / "no_debian", 20)
  assert D.locate("fashion_mnist").path == str(tmp_path / "no_debian")
  # mnist has no system directory: the tfds default comes next.
  from tests.test_data import fake_tfds_copy  # pylint: disable=g-import-not-at-top
  fake_tfds_copy(tmp_path / "empty_tfds", "mnist")
  assert D.locate("mnist") == D.Location("tfds",
                                         str(tmp_path / "empty_tfds"))


def test_emnist_files_from_the_official_archive(tmp_path, no_search_roots):
  labels = (np.arange(52) % 26 + 1).astype(np.uint8)
  write_pair(tmp_path / "gzip", 52, labels=labels, prefix="emnist-letters-")
  ds = D.load_dataset("emnist", data_dir=str(tmp_path))
  assert ds.name == "emnist/letters" and ds.num_classes == 26
  np.testing.assert_array_equal(ds.y, np.arange(52) % 26)


def test_missing_and_half_datasets(tmp_path, no_search_roots):
  with pytest.raises(D.DatasetUnavailableError) as err:
    D.locate("fashion_mnist", str(tmp_path))
  message = str(err.value)
  for part in (IMAGES, LABELS, "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte", str(tmp_path),
               str(tmp_path / "no_debian"), str(tmp_path / "no_user_data"),
               "apt-get install dataset-fashion-mnist", "--data.download",
               "--data.data_dir"):
    assert part in message
  with pytest.raises(D.DatasetUnavailableError,
                     match=r"gzip.zip, 561.8 MB, from biometrics.nist.gov"):
    D.locate("emnist", str(tmp_path))
  # Images without labels: named, not silently skipped.
  write_pair(tmp_path / "half", 10)
  os.remove(tmp_path / "half" / (LABELS + ".gz"))
  with pytest.raises(D.DatasetUnavailableError,
                     match=f"{IMAGES}.gz is there but not {LABELS}"):
    D.locate("fashion_mnist", str(tmp_path / "half"))


def test_an_empty_tfds_version_directory_is_not_a_copy(tmp_path,
                                                      no_search_roots):
  os.makedirs(tmp_path / "cifar10" / "3.0.2")
  with pytest.raises(D.DatasetUnavailableError, match="cifar10' not found"):
    D.locate("cifar10", str(tmp_path))
