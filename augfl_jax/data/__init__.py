"""The data layer: sources, federated partitions, padded client arrays.

Typical use::

  fed = augfl_jax.data.load_federated("digits", seed=0)
  fed.train.support["x"]   # [C_train, P, 8, 8, 1]
  augfl_jax.data.locate("fashion_mnist")   # where its files are, or why not
  augfl_jax.data.fetch("mnist")   # its official files, fetched if missing

TensorFlow is only imported when a tfds prepared copy is read.
"""

from __future__ import annotations

from augfl_jax.data import authors
from augfl_jax.data.catalog import ALIASES
from augfl_jax.data.catalog import DATASETS
from augfl_jax.data.catalog import DatasetSpec
from augfl_jax.data.catalog import Location
from augfl_jax.data.catalog import canonical_name
from augfl_jax.data.catalog import locate
from augfl_jax.data.catalog import register_dataset
from augfl_jax.data.catalog import spec
from augfl_jax.data.download import DownloadError
from augfl_jax.data.download import DownloadInterrupted
from augfl_jax.data.download import fetch
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
from augfl_jax.data.sources import Dataset
from augfl_jax.data.sources import DatasetUnavailableError
from augfl_jax.data.sources import available_datasets
from augfl_jax.data.sources import load_dataset
from augfl_jax.data.sources import load_split
from augfl_jax.data.idx import DataFileError
from augfl_jax.data.official_test_split import OfficialTestClients
from augfl_jax.data.official_test_split import OfficialTestSplitUnavailable
from augfl_jax.data.official_test_split import load_test_split_clients
from augfl_jax.data.official_test_split import locate_test_split
from augfl_jax.data.pipeline import PARTITIONS
from augfl_jax.data.pipeline import load_federated
from augfl_jax.data.pipeline import make_partition

__all__ = [
    "ALIASES",
    "DATASETS",
    "DataFileError",
    "Dataset",
    "DatasetSpec",
    "DatasetUnavailableError",
    "DownloadError",
    "DownloadInterrupted",
    "FederatedData",
    "Location",
    "PARTITIONS",
    "Partition",
    "OfficialTestClients",
    "OfficialTestSplitUnavailable",
    "authors",
    "available_datasets",
    "build_federated",
    "canonical_name",
    "client_data",
    "describe",
    "digits_dataset",
    "dirichlet_partition",
    "fetch",
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
    "register_dataset",
    "server_split",
    "spec",
    "synthetic_dataset",
]
