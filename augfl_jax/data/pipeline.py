"""From a dataset's name and a protocol to the padded client arrays a run
trains on: the one pipeline (:func:`load_federated`) that a library user
and ``training.run`` both call.

The dataset is found once (:func:`~augfl_jax.data.catalog.locate`, or the
``location`` a caller already has), read or made (``DatasetSpec.load``),
partitioned (:func:`make_partition`, or the authors' division of
:mod:`augfl_jax.data.authors`), gathered into stacked, padded arrays, and,
when asked, scored clients are drawn from its test split
(:mod:`augfl_jax.data.official_test_split`).
"""

from __future__ import annotations

import dataclasses

from augfl_jax.data import authors, catalog, official_test_split, sources
from augfl_jax.data.dataset import Dataset
from augfl_jax.data.federated import FederatedData, build_federated
from augfl_jax.data.partition import (describe, dirichlet_partition,
                                      natural_partition,
                                      pathological_partition)
from augfl_jax.data.splits import Partition

__all__ = ["PARTITIONS", "TEST_SPLIT", "load_federated", "make_partition"]

# The label partitions, then the authors' division, which reads a pool of
# its own (train and test files joined): ``load_federated`` builds it,
# ``make_partition`` not.
PARTITIONS = ("pathological", "dirichlet", "authors")
# What ``load_federated`` does without a test split when test clients are
# asked for: raise (on), or say why in ``FederatedData.test_split_off``.
TEST_SPLIT = ("on", "auto")


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

  Args: as :func:`load_federated` (``num_clients`` and ``server_size``
  default to the registered dataset's, and must be given for another).

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
  spec = catalog.DATASETS.get(dataset.name)
  if spec is None and (num_clients is None or server_size is None):
    raise ValueError(
        f"dataset {dataset.name!r} is not registered "
        "(data.register_dataset); pass num_clients and server_size")
  num_clients = spec.num_clients if num_clients is None else num_clients
  server_size = spec.server_size if server_size is None else server_size
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
  raise ValueError(f"unknown partition {partition!r}; make_partition takes "
                   f"{', '.join(PARTITIONS[:2])}")


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
    location: catalog.Location | None = None,
    test_clients: int = 0,
    test_split: str = "on",
    server_overlap: bool = False,
) -> FederatedData:
  """Loads a dataset, partitions it and builds the padded client arrays.

  Args:
    name: a registered dataset (:data:`~augfl_jax.data.catalog.DATASETS`)
      or an alias (``"emnist"``).
    num_clients: number of clients ``N`` (default: the dataset's); for a
      dataset of natural clients (``synthetic``), how many it generates.
    M: minimum client size; sizes are uniform on ``{M, ..., 2M}``.
    classes_per_client: classes per client (pathological partition).
    server_size: size of the server split (the first examples; for
      ``synthetic``, examples drawn at random from its natural clients, see
      :func:`natural_partition`); default: the dataset's.
    partition: ``"pathological"`` (the paper's), ``"dirichlet"`` or
      ``"authors"`` (the authors' code's division of the train and test
      files joined, :mod:`augfl_jax.data.authors`; IDX datasets only).
      A dataset of natural clients ignores it (and ``M``,
      ``classes_per_client``).
    dirichlet_alpha: Dirichlet concentration for ``partition="dirichlet"``.
    train_fraction: fraction of clients that train; the rest are held out.
    support_fraction: fraction of a client's examples in its support set
      (the paper's 0.5; the reference code's 0.2 for Fashion-MNIST, EMNIST).
    seed: seed of the partition (and of a generated dataset).
    data_dir: searched first for the dataset's files (IDX files or a tfds
      prepared copy; never downloads), see :func:`catalog.locate`.
    location: where the dataset's files are, when the caller has found
      them already (``data_dir`` is then not searched).
    test_clients: when > 0, also draw that many held-out clients from the
      dataset's test split under the same protocol
      (:func:`~augfl_jax.data.official_test_split.load_test_split_clients`)
      into ``test_split``.
    test_split: without a test split, ``"on"`` raises
      ``OfficialTestSplitUnavailable`` and ``"auto"`` records why in
      ``test_split_off``.
    server_overlap: clients may take examples of the server split (the
      authors' code); by default they never do (the paper's).

  Returns:
    The :class:`FederatedData`; ``describe()`` says what was read and how
    it was partitioned.

  Raises:
    ValueError: an unknown dataset or partition, or bad sizes.
    OfficialTestSplitUnavailable: ``test_clients > 0``, ``test_split="on"`` and no
      test split.
    DatasetUnavailableError: the dataset's files are not on this machine.
    DataFileError: a dataset file that is truncated, corrupt or mismatched.
  """
  spec = catalog.spec(name)
  if partition not in PARTITIONS:  # fail before any (slow) loading
    raise ValueError(f"unknown partition {partition!r}; use one of "
                     f"{', '.join(PARTITIONS)}")
  if test_split not in TEST_SPLIT:
    raise ValueError(f"test_split must be one of {TEST_SPLIT}, got "
                     f"{test_split!r}")
  location = location or catalog.locate(spec.name, data_dir)
  num_clients = spec.num_clients if num_clients is None else num_clients
  server_size = spec.server_size if server_size is None else server_size
  if partition == "authors":
    fed, dataset = authors.load_federated(
        spec.name, location=location, num_clients=num_clients, M=M,
        classes_per_client=classes_per_client, server_size=server_size,
        support_fraction=support_fraction, train_fraction=train_fraction,
        server_overlap=server_overlap, test_clients=test_clients, seed=seed)
  else:
    dataset = sources.load_dataset(spec.name, seed=seed,
                                   num_clients=num_clients,
                                   location=location)
    part = make_partition(
        dataset, num_clients=num_clients, M=M,
        classes_per_client=classes_per_client, server_size=server_size,
        partition=partition, dirichlet_alpha=dirichlet_alpha,
        train_fraction=train_fraction, support_fraction=support_fraction,
        seed=seed, server_overlap=server_overlap)
    fed = build_federated(dataset, part)
    if test_clients:
      try:
        fed = dataclasses.replace(
            fed, test_split=official_test_split.load_test_split_clients(
                dataset, part, location=location, num_clients=test_clients,
                M=M, classes_per_client=classes_per_client,
                support_fraction=support_fraction, seed=seed,
                partition_kind=partition, dirichlet_alpha=dirichlet_alpha))
      except official_test_split.OfficialTestSplitUnavailable as e:
        if test_split == "on":
          raise
        fed = dataclasses.replace(fed, test_split_off=str(e))
  return dataclasses.replace(
      fed, about=f"dataset {dataset.name}: {dataset.source}\n"
      + describe(fed.partition, dataset.y))
