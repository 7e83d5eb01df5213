"""Which datasets there are, which files each one is, and where they are found.

Nothing here reads a dataset or imports TensorFlow: :func:`locate` only looks
at the file system, so a missing dataset is reported in a fraction of a
second, before anything is loaded or compiled.

Search order for a dataset with files (the first place that has them wins):

1. ``data_dir`` (``--data.data_dir``): its IDX files (or CIFAR binary
   files), directly in it or in a sub-directory named after the dataset, or
   a tfds prepared copy under it;
2. ``$AUGFL_JAX_DATA_DIR``, searched the same way;
3. the user data directory (:func:`user_data_dir`, where
   ``--data.download`` stores what it fetches when neither is given),
   searched the same way;
4. the system directory of a distribution package (Debian's
   ``dataset-fashion-mnist`` installs ``/usr/share/datasets/fashion-mnist``);
5. the tfds default directory (``$TFDS_DATA_DIR``, else
   ``~/tensorflow_datasets``): a prepared copy.

IDX files and CIFAR binary files are the original distributions (IDX
gzipped or raw) and are read in file order, which the paper's server split
("the first n examples") relies on; a tfds prepared copy holds the examples
in the order tfds wrote them. Each dataset with official files lists them
(:class:`RemoteFile`: where they are served, their size and SHA-256), which
:mod:`augfl_jax.data.download` fetches on request.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import types
from typing import Any, Callable, Mapping
import urllib.parse

import pooch

from augfl_jax.data import embedded
from augfl_jax.data.dataset import Dataset

__all__ = [
    "ALIASES", "DATASETS", "DatasetSpec", "DatasetUnavailableError", "ENV_VAR",
    "Location", "RemoteFile", "canonical_name", "find_split",
    "has_test_split", "locate", "missing_tfds", "register_dataset", "remedy",
    "size_text", "spec", "split_files", "user_data_dir",
]

ENV_VAR = "AUGFL_JAX_DATA_DIR"
_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
_MNIST_TEST_FILES = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# The 28x28 grey-scale datasets (mnist, fashion_mnist, kmnist, emnist/*).
_IMAGE_28 = {"example_shape": (28, 28, 1), "preset": {"model": "cnn"}}


class DatasetUnavailableError(RuntimeError):
  """A dataset's files are not on this machine (augfl_jax fetches them only
  when asked: ``--data.download``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoteFile:
  """One official file of a dataset, as its publisher serves it.

  Attributes:
    name: its file name, as stored.
    urls: where it is served, tried in order (the official place first,
      unless it is known to be unreliable, then well-known mirrors).
    sha256: its SHA-256 (a download that differs is refused).
    size: its size in bytes.
    directory: where it is stored, relative to the data directory.
    members: an archive: the members extracted (their paths inside it,
      kept under ``directory``); empty for a file that is read as it is.
  """

  name: str
  urls: tuple[str, ...]
  sha256: str
  size: int
  directory: str
  members: tuple[str, ...] = ()


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
    cifar_files: the train split's CIFAR binary files, in order
      (:mod:`augfl_jax.data.cifar`); ``None`` for a dataset without them.
    test_cifar_files: the test split's CIFAR binary files, looked for
      beside the train files.
    cifar_label_bytes: label bytes of a CIFAR record (CIFAR-100: 2, the
      coarse and the fine label; the last one is read).
    label_offset: subtracted from stored labels (EMNIST letters: 1..26).
    tfds_name: the tfds name of a prepared copy, ``None`` if none is read.
    subdirs: sub-directories of a search root that may hold the IDX or
      CIFAR files (``--data.download`` stores them in one of them).
    system_dirs: directories a distribution package installs the files to.
    how_to_get: how else to put the files on this machine (one clause;
      :func:`remedy` adds ``--data.download`` where there are
      ``remote`` files).
    remote: the official files, for ``--data.download``
      (:mod:`augfl_jax.data.download`): the train and test splits' files,
      or the archive that holds them.
  """

  name: str
  num_classes: int
  num_clients: int
  server_size: int
  example_shape: tuple[int, ...]
  preset: Mapping[str, Any]
  idx_files: tuple[str, str] | None = None
  test_idx_files: tuple[str, str] | None = None
  cifar_files: tuple[str, ...] | None = None
  test_cifar_files: tuple[str, ...] | None = None
  cifar_label_bytes: int = 1
  label_offset: int = 0
  tfds_name: str | None = None
  subdirs: tuple[str, ...] = ()
  system_dirs: tuple[str, ...] = ()
  how_to_get: str = ""
  remote: tuple[RemoteFile, ...] = ()
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
                               self.cifar_files is None and
                               self.tfds_name is None):
      raise ValueError(f"dataset {self.name!r} needs either files (idx_files"
                       ", cifar_files or tfds_name) or a load function, not "
                       "both")
    if self.idx_files and self.cifar_files:
      raise ValueError(f"dataset {self.name!r}: idx_files or cifar_files, "
                       "not both")

  @property
  def embedded(self) -> bool:
    """Needs no files (``load`` makes it)."""
    return self.load is not None

  @property
  def natural_clients(self) -> bool:
    """Its examples come with their clients (no label partition)."""
    return self.natural_server_size is not None


# The official files. Every SHA-256 and size below is the one
# tensorflow-datasets 4.9.10 verifies its own downloads against (its
# url_checksums/<name>.txt); the URLs are the publishers' and the mirrors
# named beside them. Fashion-MNIST's are cross-checked against Debian's
# dataset-fashion-mnist package: its four files, with the gzip header field
# Debian strips restored (the file name, mtime 2017-08-31), have these
# SHA-256 and the MD5 sums of the upstream README.
_MNIST_URLS = (  # yann.lecun.com fails often: torchvision's mirror first,
    "https://ossci-datasets.s3.amazonaws.com/mnist/",  # then the original,
    "http://yann.lecun.com/exdb/mnist/",  # then tfds's mirror
    "https://storage.googleapis.com/cvdf-datasets/mnist/")
_FASHION_MNIST_URLS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    # The same files, in the project's repository.
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/"
    "master/data/fashion/")
_KMNIST_URLS = ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",)
# name -> (size, SHA-256) of the four gzipped IDX files, in the order
# train images, train labels, test images, test labels.
_IDX_CHECKSUMS = {
    "mnist": (
        (9912422,
         "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
        (28881,
         "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
        (1648877,
         "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
        (4542,
         "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6")),
    "fashion_mnist": (
        (26421880,
         "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"),
        (29515,
         "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"),
        (4422102,
         "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"),
        (5148,
         "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5")),
    "kmnist": (
        (18165135,
         "51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4"),
        (29497,
         "e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17"),
        (3041136,
         "edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5"),
        (5120,
         "20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c")),
}
# NIST's EMNIST archive: every split's IDX files, gzipped, under gzip/.
_EMNIST_ARCHIVE = dict(
    name="gzip.zip",
    urls=("https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip",),
    sha256="fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e",
    size=561753746, directory="emnist")
_CIFAR_ARCHIVES = {  # the binary versions (never the pickled ones)
    "cifar10": dict(
        name="cifar-10-binary.tar.gz",
        urls=("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
        sha256=("c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a"
                "59bca1dd"),
        size=170052171, directory="cifar10"),
    "cifar100": dict(
        name="cifar-100-binary.tar.gz",
        urls=("https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",),
        sha256=("58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a19916"
                "2a40d8ec"),
        size=168513733, directory="cifar100"),
}


def _idx_remote(name: str, urls: tuple[str, ...]) -> tuple[RemoteFile, ...]:
  """The four gzipped IDX files of ``name``, stored in ``<name>/``."""
  return tuple(
      RemoteFile(name=f + ".gz", urls=tuple(u + f + ".gz" for u in urls),
                 sha256=sha256, size=size, directory=name)
      for f, (size, sha256) in zip(_MNIST_FILES + _MNIST_TEST_FILES,
                                   _IDX_CHECKSUMS[name]))


def _emnist(split: str, num_classes: int, num_clients: int,
            label_offset: int = 0) -> DatasetSpec:
  prefix = f"emnist-{split}-"
  idx_files = (prefix + _MNIST_FILES[0], prefix + _MNIST_FILES[1])
  test_idx_files = (prefix + "test-images-idx3-ubyte",
                    prefix + "test-labels-idx1-ubyte")
  return DatasetSpec(
      name=f"emnist/{split}", num_classes=num_classes,
      num_clients=num_clients, server_size=10000, **_IMAGE_28,
      idx_files=idx_files, test_idx_files=test_idx_files,
      label_offset=label_offset, tfds_name=f"emnist/{split}",
      subdirs=("emnist", "gzip", os.path.join("emnist", "gzip")),
      remote=(RemoteFile(**_EMNIST_ARCHIVE, members=tuple(
          f"gzip/{f}.gz" for f in idx_files + test_idx_files)),))


def _cifar(name: str, num_classes: int, num_clients: int, folder: str,
           train: tuple[str, ...], test: tuple[str, ...],
           label_bytes: int) -> DatasetSpec:
  return DatasetSpec(
      name=name, num_classes=num_classes, num_clients=num_clients,
      server_size=10000, example_shape=(32, 32, 3),
      preset={"model": "resnet8x4"}, tfds_name=name, cifar_files=train,
      test_cifar_files=test, cifar_label_bytes=label_bytes,
      subdirs=(name, folder, os.path.join(name, folder)),
      remote=(RemoteFile(**_CIFAR_ARCHIVES[name], members=tuple(
          f"{folder}/{f}" for f in train + test)),))


_DATASETS = (
    DatasetSpec(
        name="fashion_mnist", num_classes=10, num_clients=50,
        server_size=10000, **_IMAGE_28, idx_files=_MNIST_FILES,
        test_idx_files=_MNIST_TEST_FILES, tfds_name="fashion_mnist",
        subdirs=("fashion_mnist", "fashion-mnist"),
        system_dirs=("/usr/share/datasets/fashion-mnist",),
        how_to_get=("on Debian or Ubuntu `sudo apt-get install "
                    "dataset-fashion-mnist` (found without any flag)"),
        remote=_idx_remote("fashion_mnist", _FASHION_MNIST_URLS)),
    DatasetSpec(
        name="mnist", num_classes=10, num_clients=50, server_size=10000,
        **_IMAGE_28, idx_files=_MNIST_FILES, test_idx_files=_MNIST_TEST_FILES,
        tfds_name="mnist", subdirs=("mnist",),
        remote=_idx_remote("mnist", _MNIST_URLS)),
    DatasetSpec(
        name="kmnist", num_classes=10, num_clients=50, server_size=10000,
        **_IMAGE_28, idx_files=_MNIST_FILES, test_idx_files=_MNIST_TEST_FILES,
        tfds_name="kmnist", subdirs=("kmnist",),
        remote=_idx_remote("kmnist", _KMNIST_URLS)),
    _emnist("letters", 26, 100, label_offset=1),
    _emnist("balanced", 47, 100),
    _emnist("digits", 10, 100),
    _emnist("byclass", 62, 100),
    _emnist("bymerge", 47, 100),
    _cifar("cifar10", 10, 50, "cifar-10-batches-bin",
           tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
           ("test_batch.bin",), label_bytes=1),
    _cifar("cifar100", 100, 100, "cifar-100-binary", ("train.bin",),
           ("test.bin",), label_bytes=2),
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
    kind: ``"idx"`` (IDX files), ``"cifar"`` (CIFAR binary files),
      ``"tfds"`` (a prepared copy) or ``"embedded"``.
    path: the directory: of the IDX or CIFAR files, or the tfds
      ``data_dir`` root.
    files: the IDX ``(images, labels)`` paths (``kind == "idx"``), or the
      CIFAR binary files of the split (``kind == "cifar"``).
  """

  kind: str
  path: str
  files: tuple[str, ...] = ()

  def describe(self) -> str:
    """One line for logs: what was found where."""
    if self.kind == "idx":
      return "IDX files " + ", ".join(self.files)
    if self.kind == "cifar":
      return "CIFAR binary files " + ", ".join(self.files)
    if self.kind == "tfds":
      return f"tfds prepared copy in {self.path}"
    return "embedded"


def size_text(num_bytes: int) -> str:
  """``"561.8 MB"``, ``"5.1 kB"``, ``"120 bytes"``."""
  if num_bytes >= 1e6:
    return f"{num_bytes / 1e6:.1f} MB"
  return f"{num_bytes / 1e3:.1f} kB" if num_bytes >= 1e3 else (
      f"{num_bytes} bytes")


def split_files(spec_: DatasetSpec, split: str) -> tuple[str, ...]:
  """The file names of a split (``"train"`` or ``"test"``): its IDX pair
  (each found raw or with ``.gz``) or its CIFAR binary files; ``()`` for
  a dataset without such files."""
  if spec_.idx_files:
    return (spec_.idx_files if split == "train" else
            spec_.test_idx_files or ())
  if spec_.cifar_files:
    return (spec_.cifar_files if split == "train" else
            spec_.test_cifar_files or ())
  return ()


def remedy(spec_: DatasetSpec) -> str:
  """How to get a dataset's files, one clause naming the flags:
  ``--data.download`` where its official files are known (what it fetches,
  how much and from where), the spec's ``how_to_get``, and
  ``--data.data_dir``."""
  if not spec_.remote:
    return spec_.how_to_get or ("put them in a directory and pass "
                                "--data.data_dir=DIR")
  files = list({r.name: r for r in spec_.remote}.values())
  what = files[0].name if len(files) == 1 else f"{len(files)} files"
  hosts = dict.fromkeys(urllib.parse.urlsplit(f.urls[0]).hostname
                        for f in files)
  return ", or ".join(
      [f"--data.download fetches them ({what}, "
       f"{size_text(sum(f.size for f in files))}, from {', '.join(hosts)})"]
      + ([spec_.how_to_get] if spec_.how_to_get else [])
      + ["pass --data.data_dir=DIR holding them"])


def _find(spec_: DatasetSpec, directory: str, names: tuple[str, ...],
          kind: str, suffixes: tuple[str, ...]) -> Location | None:
  """``names`` in ``directory``, each as the first of ``name + suffix``
  that is there; ``None`` when none is there; some of them raises
  ``DatasetUnavailableError``."""
  found = []
  for name in names:
    paths = [p for p in (os.path.join(directory, name + suffix)
                         for suffix in suffixes) if os.path.isfile(p)]
    found.append(paths[0] if paths else None)
  if all(f is None for f in found):
    return None
  if None in found:
    have = next(f for f in found if f is not None)
    either = "[.gz]" if ".gz" in suffixes else ""
    missing = " and ".join(n + either for n, f in zip(names, found)
                           if f is None)
    raise DatasetUnavailableError(
        f"dataset {spec_.name!r}: {have} is there but not {missing} beside "
        f"it in {directory}; a split's files go together: {remedy(spec_)}")
  return Location(kind, directory, tuple(found))


def find_idx(spec_: DatasetSpec, directory: str,
             names: tuple[str, str] | None = None) -> Location | None:
  """The IDX pair ``names`` (default: the train split's,
  ``spec_.idx_files``) in ``directory``, raw preferred to ``.gz``; ``None``
  when neither file is there. Half a pair raises
  ``DatasetUnavailableError``."""
  return _find(spec_, directory, names or spec_.idx_files, "idx",
               ("", ".gz"))


def find_split(spec_: DatasetSpec, directory: str, split: str = "train"
              ) -> Location | None:
  """A split's IDX pair or CIFAR binary files (:func:`split_files`) in
  ``directory``; ``None`` when none of them is there (or the dataset has
  no such files). Some of them without the others raises
  ``DatasetUnavailableError``."""
  names = split_files(spec_, split)
  if not names:
    return None
  if spec_.idx_files:
    return find_idx(spec_, directory, names)
  return _find(spec_, directory, names, "cifar", ("",))


def has_tfds_copy(spec_: DatasetSpec, root: str, split: str = "train"
                 ) -> bool:
  """Whether ``root/<tfds_name>/<version>/`` holds a prepared ``split``
  (its ``dataset_info.json`` and the split's shards)."""
  for version_dir in glob.glob(os.path.join(root, spec_.tfds_name, "*")):
    if (os.path.isfile(os.path.join(version_dir, "dataset_info.json")) and
        glob.glob(os.path.join(version_dir, f"*-{split}.*"))):
      return True
  return False


def missing_tfds() -> list[str]:
  """Which of TensorFlow and tensorflow-datasets (the ``tfds`` extra,
  which reads and prepares tfds copies) cannot be imported."""
  return [m for m in ("tensorflow", "tensorflow_datasets")
          if importlib.util.find_spec(m) is None]


def _require_tfds(spec_: DatasetSpec, root: str) -> None:
  """A tfds prepared copy is read with TensorFlow and tensorflow-datasets,
  the ``tfds`` extra; raises ``DatasetUnavailableError`` without them."""
  missing = missing_tfds()
  if missing:
    raise DatasetUnavailableError(
        f"dataset {spec_.name!r}: its tfds prepared copy in {root} is read "
        f"with TensorFlow and tensorflow-datasets ({', '.join(missing)} not "
        "installed): install the tfds extra, pip install -e \".[tfds]\" in "
        "the augfl_jax checkout")


def user_data_dir() -> str:
  """The user's data directory, where ``--data.download`` stores a dataset
  when neither ``--data.data_dir`` nor ``$AUGFL_JAX_DATA_DIR`` is given:
  ``pooch.os_cache("augfl_jax")``, the platform's user cache directory
  (``$XDG_CACHE_HOME/augfl_jax``, else ``~/.cache/augfl_jax``, on Linux)."""
  return str(pooch.os_cache("augfl_jax"))


def has_test_split(spec_: DatasetSpec, location: Location) -> bool:
  """Whether the test split is found beside ``location``'s train split
  (its files in the same directory, or the same tfds copy), or the dataset
  has none to look for."""
  if location.kind == "tfds":
    return has_tfds_copy(spec_, location.path, "test")
  if location.kind not in ("idx", "cifar") or not split_files(spec_, "test"):
    return True
  try:
    return find_split(spec_, location.path, "test") is not None
  except DatasetUnavailableError:  # half a split: reported when it is read
    return False


def _search_roots(data_dir: str | None) -> list[tuple[str, str | None]]:
  """``(label, directory)`` in search order (directory ``None``: unset)."""
  tfds_default = os.environ.get("TFDS_DATA_DIR") or os.path.join(
      "~", "tensorflow_datasets")
  return [("data_dir", data_dir), (f"${ENV_VAR}", os.environ.get(ENV_VAR)),
          ("user data dir", user_data_dir()), ("system", None),
          ("tfds default", tfds_default)]


def _in_root(spec_: DatasetSpec, label: str, root: str) -> Location | None:
  """Where one search root holds the dataset: the first place, in search
  order, with its test split beside its train split, else the first with
  its train split alone, else ``None``. The places: the IDX or CIFAR files
  in ``root`` and its ``subdirs`` (the system directories, for
  ``label == "system"``), then a tfds prepared copy under it. Part of a
  split with nothing found before it raises ``DatasetUnavailableError``."""
  if label == "system":
    directories = list(spec_.system_dirs)
  elif label == "tfds default":
    directories = []
  else:
    directories = [root] + [os.path.join(root, s) for s in spec_.subdirs]
  first = None
  for directory in directories:
    try:
      loc = os.path.isdir(directory) and find_split(spec_, directory)
    except DatasetUnavailableError:
      if first is None:
        raise
      continue
    if loc and has_test_split(spec_, loc):
      return loc
    first = first or loc or None
  if label != "system" and spec_.tfds_name and has_tfds_copy(spec_, root):
    loc = Location("tfds", root)
    if first is None or has_test_split(spec_, loc):
      return loc
  return first


def locate(name: str, data_dir: str | None = None) -> Location:
  """Finds a dataset's files in the search order of the module docstring.

  Within one place (a search root and its sub-directories), files with
  their test split beside them are preferred to a train split alone, so
  that a complete copy fetched beside train files found earlier is read.

  Args:
    name: a dataset name or alias.
    data_dir: ``--data.data_dir``, searched first (``~`` is expanded).

  Returns:
    The :class:`Location` (``kind="embedded"`` for digits and synthetic).

  Raises:
    ValueError: unknown ``name``.
    DatasetUnavailableError: ``data_dir`` is not a directory; or not found:
      one line naming every file a run reads (the train and the test
      split's), the places searched, ``--data.download`` and
      ``--data.data_dir``; or a tfds prepared copy found without TensorFlow
      and tensorflow-datasets installed (the ``tfds`` extra).
  """
  spec_ = spec(name)
  if data_dir is not None and not os.path.isdir(os.path.expanduser(data_dir)):
    raise DatasetUnavailableError(
        f"--data.data_dir {data_dir} is not a directory on this machine")
  if spec_.embedded:
    return Location("embedded", "")
  searched = []
  for label, root in _search_roots(data_dir):
    if root is not None:
      root = os.path.expanduser(root)
      searched.append(root)
    elif label == "system":
      searched += spec_.system_dirs
    else:
      continue
    loc = _in_root(spec_, label, root)
    if loc is not None:
      if loc.kind == "tfds":
        _require_tfds(spec_, root)
      return loc
  names = split_files(spec_, "train") + split_files(spec_, "test")
  files = (", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1
           else "".join(names))
  if names:
    files = (f"the IDX files {files} (each raw or .gz)" if spec_.idx_files
             else f"the CIFAR binary files {files}")
  if spec_.tfds_name:
    files = (files + " or a tfds prepared copy" if files
             else "a tfds prepared copy")
  raise DatasetUnavailableError(
      f"dataset {spec_.name!r} not found in "
      f"{', '.join(dict.fromkeys(searched))}: it needs {files}; "
      f"{remedy(spec_)}")
