"""The data layer: sources, federated partitions, padded client arrays.

Typical use::

  fed = augfl_jax.data.load_federated("digits", seed=0)
  fed.train.support["x"]   # [C_train, P, 8, 8, 1]
  augfl_jax.data.locate("fashion_mnist")   # where its files are, or why not

TensorFlow is only imported when a tfds prepared copy is read.
"""

from __future__ import annotations

import dataclasses

from augfl_jax.data import authors
from augfl_jax.data.catalog import ALIASES
from augfl_jax.data.catalog import DATASETS
from augfl_jax.data.catalog import DatasetSpec
from augfl_jax.data.catalog import Location
from augfl_jax.data.catalog import canonical_name
from augfl_jax.data.catalog import locate
from augfl_jax.data.embedded import digits_dataset
from augfl_jax.data.embedded import synthetic_dataset
from augfl_jax.data.federated import FederatedData
from augfl_jax.data.federated import build_federated
from augfl_jax.data.federated import client_data
from augfl_jax.data.federated import pad_stack
from augfl_jax.data.partition import Partition
from augfl_jax.data.partition import describe
from augfl_jax.data.partition import dirichlet_partition
from augfl_jax.data.partition import natural_partition
from augfl_jax.data.partition import num_train_clients
from augfl_jax.data.partition import pathological_partition
from augfl_jax.data.partition import server_split
from augfl_jax.data.sources import DATASET_DEFAULTS
from augfl_jax.data.sources import Dataset
from augfl_jax.data.sources import DatasetUnavailableError
from augfl_jax.data.sources import available_datasets
from augfl_jax.data.sources import load_dataset
from augfl_jax.data.sources import load_split
from augfl_jax.data.idx import DataFileError
from augfl_jax.data.official_test_split import TestSplitClients
from augfl_jax.data.official_test_split import TestSplitUnavailable
from augfl_jax.data.official_test_split import load_test_split_clients
from augfl_jax.data.official_test_split import locate_test_split

__all__ = [
    "ALIASES",
    "DATASETS",
    "DATASET_DEFAULTS",
    "DataFileError",
    "Dataset",
    "DatasetSpec",
    "DatasetUnavailableError",
    "FederatedData",
    "Location",
    "Partition",
    "TestSplitClients",
    "TestSplitUnavailable",
    "authors",
    "available_datasets",
    "build_federated",
    "canonical_name",
    "client_data",
    "describe",
    "digits_dataset",
    "dirichlet_partition",
    "load_dataset",
    "load_federated",
    "load_split",
    "load_test_split_clients",
    "locate",
    "locate_test_split",
    "make_partition",
    "natural_partition",
    "num_train_clients",
    "pad_stack",
    "pathological_partition",
    "server_split",
    "synthetic_dataset",
]

_PARTITIONS = ("pathological", "dirichlet")
# The authors' division (``data.authors``) reads a pool of its own (train and
# test files joined): ``load_federated`` builds it, ``make_partition`` not.
AUTHORS = "authors"


def make_partition(
    dataset: Dataset,
    *,
    num_clients: int | None = None,
    M: int = 20,  # pylint: disable=invalid-name
    classes_per_client: int = 2,
    server_size: int | None = None,
    partition: str = "pathological",
    dirichlet_alpha: float = 0.5,
    train_fraction: float = 0.8,
    support_fraction: float = 0.5,
    seed: int = 0,
    server_overlap: bool = False,
) -> Partition:
  """Partitions a loaded dataset as :func:`load_federated` does.

  Args: as :func:`load_federated`.

  Returns:
    The :class:`Partition`.
  """
  if dataset.client_ids is not None:
    if server_overlap:
      raise ValueError(
          "server_overlap applies to label partitions; the server examples "
          f"of {dataset.name} are taken out of its natural clients")
    # Natural clients: a server split, if any, is drawn from their examples.
    return natural_partition(dataset.client_ids, train_fraction=train_fraction,
                             support_fraction=support_fraction,
                             seed=seed, labels=dataset.y,
                             server_size=server_size or 0)
  defaults = DATASET_DEFAULTS.get(dataset.name)
  if defaults is None and (num_clients is None or server_size is None):
    raise ValueError(
        f"Dataset {dataset.name!r} has no DATASET_DEFAULTS entry; pass "
        "num_clients and server_size explicitly.")
  if num_clients is None:
    num_clients = defaults["num_clients"]
  if server_size is None:
    server_size = defaults["server_size"]
  common = dict(num_clients=num_clients, M=M, server_size=server_size,
                train_fraction=train_fraction,
                support_fraction=support_fraction, seed=seed,
                num_classes=dataset.num_classes,
                server_overlap=server_overlap)
  if partition == "pathological":
    return pathological_partition(
        dataset.y, classes_per_client=classes_per_client, **common)
  if partition == "dirichlet":
    return dirichlet_partition(dataset.y, concentration=dirichlet_alpha,
                               **common)
  raise ValueError(
      f"Unknown partition {partition!r}; use one of {', '.join(_PARTITIONS)}.")


def load_federated(
    name: str,
    *,
    num_clients: int | None = None,
    M: int = 20,  # pylint: disable=invalid-name
    classes_per_client: int = 2,
    server_size: int | None = None,
    partition: str = "pathological",
    dirichlet_alpha: float = 0.5,
    train_fraction: float = 0.8,
    support_fraction: float = 0.5,
    seed: int = 0,
    data_dir: str | None = None,
    synthetic_alpha: float = 1.0,
    synthetic_beta: float = 1.0,
    test_clients: int = 0,
    server_overlap: bool = False,
) -> FederatedData:
  """Loads a dataset, partitions it and builds the padded client arrays.

  Args:
    name: one of :func:`available_datasets` or an alias (``"emnist"``).
    num_clients: number of clients ``N``; ``None``: ``DATASET_DEFAULTS``. For
      ``synthetic`` it is the number of natural clients (default 30).
    M: minimum client size; sizes are uniform on ``{M, ..., 2M}``.
    classes_per_client: classes per client (pathological partition).
    server_size: size of the server split (the first examples; for
      ``synthetic``, examples drawn at random from its natural clients, see
      :func:`natural_partition`); ``None``: ``DATASET_DEFAULTS``.
    partition: ``"pathological"`` (the paper's), ``"dirichlet"`` or
      ``"authors"`` (the authors' code's division of the train and test
      files joined, :mod:`augfl_jax.data.authors`; IDX datasets only).
      Ignored by ``synthetic``, which always uses its natural clients (as
      are ``M`` and ``classes_per_client``).
    dirichlet_alpha: Dirichlet concentration for ``partition="dirichlet"``.
    train_fraction: fraction of clients that train; the rest are held out.
    support_fraction: fraction of a client's examples in its support set
      (the paper's 0.5; the reference code's 0.2 for Fashion-MNIST, EMNIST).
    seed: seed of the partition (and of the ``synthetic`` generator).
    data_dir: searched first for the dataset's files (IDX files or a tfds
      prepared copy; never downloads), see :func:`locate`.
    synthetic_alpha: alpha of Synthetic(alpha, beta).
    synthetic_beta: beta of Synthetic(alpha, beta).
    test_clients: when > 0, also draw that many held-out clients from the
      dataset's test split under the same protocol
      (:func:`load_test_split_clients`) into ``test_split``.
    server_overlap: clients may take examples of the server split (the
      authors' code); by default they never do (the paper's).

  Returns:
    The :class:`FederatedData`.

  Raises:
    ValueError: an unknown dataset or partition, or bad sizes.
    TestSplitUnavailable: ``test_clients > 0`` and no test split.
    DatasetUnavailableError: the dataset's files are not on this machine.
    DataFileError: a dataset file that is truncated, corrupt or mismatched.
  """
  name = canonical_name(name)
  if partition == AUTHORS:
    defaults = DATASET_DEFAULTS[name]
    return authors.load_federated(
        name, data_dir=data_dir,
        num_clients=num_clients or defaults["num_clients"], M=M,
        classes_per_client=classes_per_client,
        server_size=(defaults["server_size"] if server_size is None
                     else server_size),
        support_fraction=support_fraction, train_fraction=train_fraction,
        server_overlap=server_overlap, test_clients=test_clients,
        seed=seed)[0]
  if partition not in _PARTITIONS:  # Fail before any (slow) loading.
    raise ValueError(
        f"Unknown partition {partition!r}; use one of "
        f"{', '.join(_PARTITIONS + (AUTHORS,))}.")
  synthetic_clients = DATASET_DEFAULTS["synthetic"]["num_clients"]
  if name == "synthetic" and num_clients is not None:
    synthetic_clients = num_clients
  dataset = load_dataset(
      name, data_dir=data_dir, seed=seed, synthetic_alpha=synthetic_alpha,
      synthetic_beta=synthetic_beta, synthetic_clients=synthetic_clients)
  part = make_partition(
      dataset, num_clients=num_clients, M=M,
      classes_per_client=classes_per_client, server_size=server_size,
      partition=partition, dirichlet_alpha=dirichlet_alpha,
      train_fraction=train_fraction, support_fraction=support_fraction,
      seed=seed, server_overlap=server_overlap)
  fed = build_federated(dataset, part)
  if test_clients:
    fed = dataclasses.replace(fed, test_split=load_test_split_clients(
        dataset, part, data_dir=data_dir, num_clients=test_clients, M=M,
        classes_per_client=classes_per_client,
        support_fraction=support_fraction, seed=seed,
        partition_kind=partition, dirichlet_alpha=dirichlet_alpha))
  return fed
