"""Which datasets there are, which files each one is, and where they are found.

Nothing here reads a dataset or imports TensorFlow: :func:`locate` only looks
at the file system, so a missing dataset is reported in a fraction of a
second, before anything is loaded or compiled.

Search order for a dataset with files (the first place that has them wins):

1. ``data_dir`` (``--data.data_dir``): its IDX files, directly in it or in a
   sub-directory named after the dataset, or a tfds prepared copy under it;
2. ``$AUGFL_JAX_DATA_DIR``, searched the same way;
3. the system directory of a distribution package (Debian's
   ``dataset-fashion-mnist`` installs ``/usr/share/datasets/fashion-mnist``);
4. the tfds default directory (``$TFDS_DATA_DIR``, else
   ``~/tensorflow_datasets``): a prepared copy.

IDX files are the original distribution (gzipped or raw) and are read in
file order, which the paper's server split ("the first n examples") relies
on; a tfds prepared copy holds the examples in the order tfds wrote them.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import types
from typing import Any, Callable, Mapping

from augfl_jax.data import embedded
from augfl_jax.data.dataset import Dataset

__all__ = [
    "ALIASES", "DATASETS", "DatasetSpec", "DatasetUnavailableError", "ENV_VAR",
    "Location", "canonical_name", "locate", "register_dataset", "spec",
]

ENV_VAR = "AUGFL_JAX_DATA_DIR"
_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
_MNIST_TEST_FILES = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# The 28x28 grey-scale datasets (mnist, fashion_mnist, kmnist, emnist/*).
_IMAGE_28 = {"example_shape": (28, 28, 1), "preset": {"model": "cnn"}}


class DatasetUnavailableError(RuntimeError):
  """A dataset's files are not on this machine (augfl_jax never downloads)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetSpec:
  """One dataset: its classes, the paper's protocol sizes, the run's
  defaults for it, and its files (or the function that makes it).

  Attributes:
    name: the canonical name (``--dataset``).
    num_classes: number of classes (after ``label_offset``).
    num_clients: the paper's number of clients N (§VI-A); a dataset of
      natural clients: how many it generates.
    server_size: the paper's server split (the first n training examples).
    example_shape: the shape of one example, ``(H, W, C)`` or ``(d,)``.
    preset: the run's defaults on this dataset, dotted ``RunConfig`` names
      over the paper's values: at least the client ``model``; e.g. digits'
      ``norm``, ``pm.model``, ``pm.epochs`` and ``crd.nce_k``.
    load: ``load(seed, num_clients) -> Dataset`` for a dataset that is
      made, not read from files (the embedded ones, a user's own);
      ``None`` for one of IDX files or a tfds copy.
    seeded: its examples come from the run's seed (a generated dataset):
      so do its server split and its PM.
    natural_server_size: a dataset of natural clients (its examples come
      with their client): the server examples drawn from them when a run
      needs a PM and leaves ``data.server_size`` unset; ``None`` for a
      dataset partitioned by labels.
    test_split_from_unused: no test split of its own: the test-split
      clients are drawn from the examples the partition leaves unused.
    idx_files: the train split's IDX ``(images, labels)`` file names, each
      found raw or with ``.gz``; ``None`` for a dataset without IDX files.
    test_idx_files: the official test split's IDX file names, looked for
      beside the train files (never used for training; held-out clients
      are drawn from it to score a run,
      :mod:`augfl_jax.data.official_test_split`).
    label_offset: subtracted from stored labels (EMNIST letters: 1..26).
    tfds_name: the tfds name of a prepared copy, ``None`` if none is read.
    subdirs: sub-directories of a search root that may hold the IDX files.
    system_dirs: directories a distribution package installs the files to.
    how_to_get: how to put the files on this machine (one sentence).
  """

  name: str
  num_classes: int
  num_clients: int
  server_size: int
  example_shape: tuple[int, ...]
  preset: Mapping[str, Any]
  idx_files: tuple[str, str] | None = None
  test_idx_files: tuple[str, str] | None = None
  label_offset: int = 0
  tfds_name: str | None = None
  subdirs: tuple[str, ...] = ()
  system_dirs: tuple[str, ...] = ()
  how_to_get: str = ""
  load: Callable[[int, int], Dataset] | None = None
  seeded: bool = False
  natural_server_size: int | None = None
  test_split_from_unused: bool = False

  def __post_init__(self):
    if "model" not in self.preset:
      raise ValueError(f"dataset {self.name!r}: its preset must name the "
                       "client model (preset={'model': ...})")
    if not self.example_shape or not all(
        isinstance(n, int) and n >= 1 for n in self.example_shape):
      raise ValueError(f"dataset {self.name!r}: example_shape must be a "
                       f"tuple of positive ints, got {self.example_shape!r}")
    if (self.load is None) == (self.idx_files is None and
                               self.tfds_name is None):
      raise ValueError(f"dataset {self.name!r} needs either files (idx_files"
                       " or tfds_name) or a load function, not both")

  @property
  def embedded(self) -> bool:
    """Needs no files (``load`` makes it)."""
    return self.load is not None

  @property
  def natural_clients(self) -> bool:
    """Its examples come with their clients (no label partition)."""
    return self.natural_server_size is not None


def _emnist(split: str, num_classes: int, num_clients: int,
            label_offset: int = 0) -> DatasetSpec:
  prefix = f"emnist-{split}-"
  return DatasetSpec(
      name=f"emnist/{split}", num_classes=num_classes,
      num_clients=num_clients, server_size=10000, **_IMAGE_28,
      idx_files=(prefix + _MNIST_FILES[0], prefix + _MNIST_FILES[1]),
      test_idx_files=(prefix + "test-images-idx3-ubyte",
                      prefix + "test-labels-idx1-ubyte"),
      label_offset=label_offset, tfds_name=f"emnist/{split}",
      subdirs=("emnist", "gzip", os.path.join("emnist", "gzip")),
      how_to_get=(
          "download the official EMNIST archive "
          "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip on a machine "
          "with internet access, unzip it and pass --data.data_dir=<its "
          f"gzip/ directory> (only the two {prefix}train-* files are read)"))


_DATASETS = (
    DatasetSpec(
        name="fashion_mnist", num_classes=10, num_clients=50,
        server_size=10000, **_IMAGE_28, idx_files=_MNIST_FILES,
        test_idx_files=_MNIST_TEST_FILES, tfds_name="fashion_mnist",
        subdirs=("fashion_mnist", "fashion-mnist"),
        system_dirs=("/usr/share/datasets/fashion-mnist",),
        how_to_get=(
            "on Debian or Ubuntu `sudo apt-get install dataset-fashion-mnist`"
            " (found without any flag), or put the IDX files of "
            "https://github.com/zalandoresearch/fashion-mnist in a directory "
            "and pass --data.data_dir=DIR")),
    DatasetSpec(
        name="mnist", num_classes=10, num_clients=50, server_size=10000,
        **_IMAGE_28, idx_files=_MNIST_FILES, test_idx_files=_MNIST_TEST_FILES,
        tfds_name="mnist", subdirs=("mnist",),
        how_to_get=("put the MNIST train IDX files (the original "
                    "distribution) in a directory and pass "
                    "--data.data_dir=DIR")),
    DatasetSpec(
        name="kmnist", num_classes=10, num_clients=50, server_size=10000,
        **_IMAGE_28, idx_files=_MNIST_FILES, test_idx_files=_MNIST_TEST_FILES,
        tfds_name="kmnist", subdirs=("kmnist",),
        how_to_get=("put the KMNIST train IDX files of "
                    "https://github.com/rois-codh/kmnist in a directory and "
                    "pass --data.data_dir=DIR")),
    _emnist("letters", 26, 100, label_offset=1),
    _emnist("balanced", 47, 100),
    _emnist("digits", 10, 100),
    _emnist("byclass", 62, 100),
    _emnist("bymerge", 47, 100),
    *(DatasetSpec(
        name=name, num_classes=classes, num_clients=clients,
        server_size=10000, example_shape=(32, 32, 3),
        preset={"model": "resnet8x4"}, tfds_name=name,
        how_to_get=(
            f"prepare it once on a machine with internet access (`tfds build "
            f"{name} --data_dir=DIR`, or in Python `tfds.load({name!r}, "
            "data_dir=DIR)`), copy DIR here and pass --data.data_dir=DIR"))
      for name, classes, clients in (("cifar10", 10, 50),
                                     ("cifar100", 100, 100))),
    # digits keeps the paper's alpha, rho and lambda with GroupNorm: batch
    # statistics of a 5-20 example query set of two classes change a
    # held-out client's predictions with its class mix.
    DatasetSpec(name="digits", num_classes=10, num_clients=40,
                server_size=400, example_shape=(8, 8, 1),
                preset={"model": "mlp", "norm": "group", "pm.model": "cnn",
                        "pm.epochs": 30, "crd.nce_k": 1024},
                load=lambda seed, num_clients: embedded.digits_dataset(),
                test_split_from_unused=True),
    # Natural clients and no server split (FedBC's benchmark): a run with a
    # PM draws 500 server examples from the clients; 60 features, an MLP PM
    # (one hidden layer of 128).
    DatasetSpec(name="synthetic", num_classes=10, num_clients=30,
                server_size=0, example_shape=(60,),
                preset={"model": "logreg", "pm.model": "mlp"},
                load=lambda seed, num_clients: embedded.synthetic_dataset(
                    num_clients=num_clients, seed=seed),
                seeded=True, natural_server_size=500),
)
_REGISTRY: dict[str, DatasetSpec] = {s.name: s for s in _DATASETS}
# name -> DatasetSpec, read-only: ``register_dataset`` adds to it.
DATASETS: Mapping[str, DatasetSpec] = types.MappingProxyType(_REGISTRY)
# Names that mean another: the paper's EMNIST is EMNIST letters.
ALIASES = {"emnist": "emnist/letters"}


def register_dataset(spec_: DatasetSpec) -> DatasetSpec:
  """Adds a dataset to :data:`DATASETS` (a user's, from their own module:
  ``experiments.run --imports=my_module`` imports it first); the same spec
  again changes nothing. Raises ``ValueError`` for a name taken by another
  dataset or an alias."""
  if not isinstance(spec_, DatasetSpec):
    raise TypeError(f"register_dataset takes a DatasetSpec, got "
                    f"{type(spec_).__name__}")
  if (_REGISTRY.get(spec_.name, spec_) is not spec_ or
      spec_.name in ALIASES):
    raise ValueError(f"dataset {spec_.name!r} is registered already; "
                     "choose another name")
  _REGISTRY[spec_.name] = spec_
  return spec_


def canonical_name(name: str) -> str:
  """The canonical name of a dataset or alias (``"emnist"`` ->
  ``"emnist/letters"``). Raises ``ValueError`` for an unknown name."""
  name = ALIASES.get(name, name)
  if name not in DATASETS:
    raise ValueError(
        f"unknown dataset {name!r}; choose one of "
        f"{', '.join(list(DATASETS) + list(ALIASES))} (emnist is "
        "emnist/letters, the paper's EMNIST)")
  return name


def spec(name: str) -> DatasetSpec:
  """The :class:`DatasetSpec` of ``name`` (an alias is resolved)."""
  return DATASETS[canonical_name(name)]


@dataclasses.dataclass(frozen=True)
class Location:
  """Where a dataset was found.

  Attributes:
    kind: ``"idx"`` (IDX files), ``"tfds"`` (a prepared copy) or
      ``"embedded"``.
    path: the directory: of the IDX files, or the tfds ``data_dir`` root.
    files: the IDX ``(images, labels)`` paths (``kind == "idx"``).
  """

  kind: str
  path: str
  files: tuple[str, ...] = ()

  def describe(self) -> str:
    """One line for logs: what was found where."""
    if self.kind == "idx":
      return "IDX files " + ", ".join(self.files)
    if self.kind == "tfds":
      return f"tfds prepared copy in {self.path}"
    return "embedded"


def find_idx(spec_: DatasetSpec, directory: str,
             names: tuple[str, str] | None = None) -> Location | None:
  """The IDX pair ``names`` (default: the train split's,
  ``spec_.idx_files``) in ``directory``, raw preferred to ``.gz``; ``None``
  when neither file is there. Half a pair raises
  ``DatasetUnavailableError``."""
  names = names or spec_.idx_files
  found = []
  for name in names:
    paths = [p for p in (os.path.join(directory, name),
                         os.path.join(directory, name + ".gz"))
             if os.path.isfile(p)]
    found.append(paths[0] if paths else None)
  if found == [None, None]:
    return None
  if None in found:
    have, missing = ((found[0], names[1]) if found[1] is None
                     else (found[1], names[0]))
    raise DatasetUnavailableError(
        f"dataset {spec_.name!r}: {have} is there but not {missing}[.gz] "
        f"beside it in {directory}; the images and the labels file go "
        f"together: {spec_.how_to_get}")
  return Location("idx", directory, tuple(found))


def has_tfds_copy(spec_: DatasetSpec, root: str, split: str = "train"
                 ) -> bool:
  """Whether ``root/<tfds_name>/<version>/`` holds a prepared ``split``
  (its ``dataset_info.json`` and the split's shards)."""
  for version_dir in glob.glob(os.path.join(root, spec_.tfds_name, "*")):
    if (os.path.isfile(os.path.join(version_dir, "dataset_info.json")) and
        glob.glob(os.path.join(version_dir, f"*-{split}.*"))):
      return True
  return False


def _require_tfds(spec_: DatasetSpec, root: str) -> None:
  """A tfds prepared copy is read with TensorFlow and tensorflow-datasets,
  the ``tfds`` extra; raises ``DatasetUnavailableError`` without them."""
  missing = [m for m in ("tensorflow", "tensorflow_datasets")
             if importlib.util.find_spec(m) is None]
  if missing:
    raise DatasetUnavailableError(
        f"dataset {spec_.name!r}: its tfds prepared copy in {root} is read "
        f"with TensorFlow and tensorflow-datasets ({', '.join(missing)} not "
        "installed): install the tfds extra, pip install -e \".[tfds]\" in "
        "the augfl_jax checkout")


def _search_roots(data_dir: str | None) -> list[tuple[str, str | None]]:
  """``(label, directory)`` in search order (directory ``None``: unset)."""
  tfds_default = os.environ.get("TFDS_DATA_DIR") or os.path.join(
      "~", "tensorflow_datasets")
  return [("data_dir", data_dir), (f"${ENV_VAR}", os.environ.get(ENV_VAR)),
          ("system", None), ("tfds default", tfds_default)]


def locate(name: str, data_dir: str | None = None) -> Location:
  """Finds a dataset's files in the search order of the module docstring.

  Args:
    name: a dataset name or alias.
    data_dir: ``--data.data_dir``, searched first (``~`` is expanded).

  Returns:
    The :class:`Location` (``kind="embedded"`` for digits and synthetic).

  Raises:
    ValueError: unknown ``name``.
    DatasetUnavailableError: ``data_dir`` is not a directory; or not found:
      one line naming the files expected, every place searched and how to
      get them; or a tfds prepared copy found without TensorFlow and
      tensorflow-datasets installed (the ``tfds`` extra).
  """
  spec_ = spec(name)
  if data_dir is not None and not os.path.isdir(os.path.expanduser(data_dir)):
    raise DatasetUnavailableError(
        f"--data.data_dir {data_dir} is not a directory on this machine")
  if spec_.embedded:
    return Location("embedded", "")
  searched = []
  for label, root in _search_roots(data_dir):
    if label == "system":
      for directory in spec_.system_dirs:
        searched.append(directory)
        if spec_.idx_files and (loc := find_idx(spec_, directory)):
          return loc
      continue
    if root is None:
      searched.append(f"{label} (not set)")
      continue
    root = os.path.expanduser(root)
    if label != "tfds default" and spec_.idx_files:
      for directory in [root] + [os.path.join(root, s) for s in spec_.subdirs]:
        searched.append(directory)
        if os.path.isdir(directory) and (loc := find_idx(spec_, directory)):
          return loc
    if spec_.tfds_name:
      searched.append(os.path.join(root, spec_.tfds_name, "<version>"))
      if has_tfds_copy(spec_, root):
        _require_tfds(spec_, root)
        return Location("tfds", root)
  expected = " and ".join(f"{f}[.gz]" for f in spec_.idx_files or ())
  expected = (f"the IDX files {expected} or a tfds prepared copy"
              if expected else "a tfds prepared copy")
  raise DatasetUnavailableError(
      f"dataset {spec_.name!r} not found: looked for {expected} in "
      f"{', '.join(dict.fromkeys(searched))}. To get it, {spec_.how_to_get}. "
      "augfl_jax never downloads; the embedded datasets digits and "
      "synthetic need no files.")
