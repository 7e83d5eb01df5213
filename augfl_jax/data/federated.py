"""From a dataset and a partition to stacked, padded, masked client arrays.

Ragged client sizes become padding plus a mask (``types.Batch``), so the client
axis is an ordinary array axis that ``vmap``/``lax.map``/sharding can run over.
Padding rows have ``x = 0``, ``y = 0`` and ``mask = 0``; every loss and metric
in the library is a masked mean, so padding changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.data.splits import Partition
from augfl_jax.data.sources import Dataset
from augfl_jax.core.types import Batch, ClientData

__all__ = ["FederatedData", "build_federated", "check_labels", "client_data",
           "pad_stack"]


def _pad_stack_np(x: np.ndarray, y: np.ndarray,
                  index_lists: Sequence[np.ndarray],
                  pad_to: int | None) -> dict[str, np.ndarray]:
  lengths = [len(idx) for idx in index_lists]
  longest = max(lengths, default=0)
  if pad_to is None:
    # At least one row so that a client axis of empty sets keeps a valid shape.
    pad_to = max(longest, 1)
  elif pad_to < longest:
    raise ValueError(
        f"pad_to={pad_to} is smaller than the largest index list "
        f"({longest}); use pad_to >= {longest} or None.")
  c = len(index_lists)
  xs = np.zeros((c, pad_to) + x.shape[1:], dtype=np.float32)
  ys = np.zeros((c, pad_to), dtype=np.int32)
  mask = np.zeros((c, pad_to), dtype=np.float32)
  for i, idx in enumerate(index_lists):
    idx = np.asarray(idx, dtype=np.int64)
    n = len(idx)
    xs[i, :n] = x[idx]
    ys[i, :n] = y[idx]
    mask[i, :n] = 1.0
  return {"x": xs, "y": ys, "mask": mask}


def check_labels(y: np.ndarray, num_classes: int, what: str = "labels"
                ) -> None:
  """Raises ``ValueError`` unless every label lies in ``[0, num_classes)``.

  The losses cannot check it under jit: an out-of-range label there gives
  a NaN or a finite but meaningless loss (the one-hot row is empty or the
  gather clamps), so data are checked where they are built.
  """
  y = np.asarray(y)
  if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or
                 y.max() >= num_classes):
    bad = y[(y < 0) | (y >= num_classes)] if np.issubdtype(
        y.dtype, np.integer) else y
    raise ValueError(
        f"{what} must be integers in 0..{num_classes - 1}; got "
        f"{np.unique(bad)[:5].tolist()} ({y.dtype}); check the dataset's "
        "labels and num_classes")


def pad_stack(
    x: np.ndarray,
    y: np.ndarray,
    index_lists: Sequence[np.ndarray],
    *,
    pad_to: int | None = None,
    num_classes: int | None = None,
) -> Batch:
  """Gathers ``C`` index lists into one padded, masked, stacked batch.

  Args:
    x: ``[n, ...]`` inputs of the whole dataset.
    y: ``[n]`` int labels.
    index_lists: ``C`` arrays of example indices (ragged).
    pad_to: padded length; ``None`` means the longest list (at least 1).
    num_classes: when given, the labels gathered must lie in
      ``[0, num_classes)`` (:func:`check_labels`).

  Returns:
    ``{"x": [C, pad_to, ...] float32, "y": [C, pad_to] int32,``
    ``"mask": [C, pad_to] float32}`` as device arrays; row ``j`` of client ``i``
    is real iff ``j < len(index_lists[i])``; padding rows are all zeros.

  Raises:
    ValueError: ``pad_to`` is shorter than the longest list, or a label is
      outside ``[0, num_classes)``.
  """
  if num_classes is not None:
    used = [np.asarray(i, dtype=np.int64) for i in index_lists]
    check_labels(np.asarray(y)[np.concatenate(used)] if used else y[:0],
                 num_classes)
  return jax.tree.map(jnp.asarray, _pad_stack_np(x, y, index_lists, pad_to))


def client_data(
    dataset: Dataset,
    partition: Partition,
    clients: np.ndarray,
    *,
    pad_to: int | None = None,
) -> ClientData:
  """Stacks the support and query sets of ``clients``.

  Args:
    dataset: the dataset the partition indexes.
    partition: the partition.
    clients: ``[C]`` client ids.
    pad_to: padded length of both support and query; ``None`` uses the
      longest support set among ``clients`` (support is never shorter than
      query), so support and query share one shape.

  Returns:
    ``ClientData`` with ``support``/``query`` batches of ``[C, pad_to, ...]``
    leaves and ``num_examples`` ``[C]`` float32 ``= |D_i^s| + |D_i^q|``.
  """
  clients = np.asarray(clients, dtype=np.int64).reshape(-1)
  support = [partition.support[c] for c in clients]
  query = [partition.query[c] for c in clients]
  if pad_to is None:
    pad_to = max([len(s) for s in support] + [len(q) for q in query] + [1])
  num_examples = np.array(
      [len(s) + len(q) for s, q in zip(support, query)], dtype=np.float32)
  return ClientData(
      support=pad_stack(dataset.x, dataset.y, support, pad_to=pad_to),
      query=pad_stack(dataset.x, dataset.y, query, pad_to=pad_to),
      num_examples=jnp.asarray(num_examples))


@dataclasses.dataclass(frozen=True, eq=False)
class FederatedData:
  """Everything a federated run needs, as device arrays.

  Attributes:
    train: ``ClientData`` of the training clients, leaves ``[C_train, P, ...]``.
    test: ``ClientData`` of the held-out clients, leaves ``[C_test, P, ...]``
      (same padded length ``P`` as ``train``).
    server: the server split ``{"x": [n_srv, ...], "y": [n_srv], "mask":
      ones [n_srv], "index": [n_srv] int32 = 0..n_srv-1}``; ``index`` is the
      position inside the server split (e.g. for CRD memory banks).
    num_classes: number of classes.
    input_shape: shape of one example, e.g. ``(8, 8, 1)``.
    partition: the index-level partition the arrays were built from.
    dataset_name: name of the source dataset.
    test_split: many more held-out clients, drawn from the dataset's test
      split (:mod:`augfl_jax.data.official_test_split`), or ``None``.
    test_split_off: why ``test_split`` is ``None`` (empty when it is not,
      or when it was not asked for).
    about: what was read and how it was partitioned, a few lines for logs
      (``data.load_federated`` writes it; :meth:`describe` adds the
      test-split clients).
  """

  train: ClientData
  test: ClientData
  server: Batch
  num_classes: int
  input_shape: tuple[int, ...]
  partition: Partition
  dataset_name: str
  test_split: Any = None  # official_test_split.OfficialTestClients | None
  test_split_off: str = ""
  about: str = ""

  def describe(self) -> str:
    """:attr:`about`, then where the test-split clients come from or why
    there are none (when they were asked for)."""
    note = (f"test-split clients: {self.test_split.source}"
            if self.test_split is not None else
            f"test-split scoring off: {self.test_split_off}"
            if self.test_split_off else "")
    return "\n".join(part for part in (self.about, note) if part)


def build_federated(dataset: Dataset, partition: Partition) -> FederatedData:
  """Gathers a partition of a dataset into padded device arrays.

  Train and test clients are padded to the same length (the longest support
  set over all clients), so per-client shapes are identical everywhere.

  Args:
    dataset: the dataset.
    partition: a partition of ``dataset`` (indices must be ``< n``).

  Returns:
    The :class:`FederatedData`.

  Raises:
    ValueError: indices outside the dataset, or a label outside
      ``[0, dataset.num_classes)``.
  """
  n = dataset.num_examples
  check_labels(dataset.y, dataset.num_classes,
               f"the labels of dataset {dataset.name!r}")
  all_idx = [partition.server, *partition.support, *partition.query]
  if any(len(i) and (i.min() < 0 or i.max() >= n) for i in all_idx):
    raise ValueError(
        f"The partition indexes examples outside the dataset {dataset.name!r}"
        f" of {n} examples; build it from this dataset's labels.")
  pad_to = max([len(s) for s in partition.support]
               + [len(q) for q in partition.query] + [1])
  server_idx = np.asarray(partition.server, dtype=np.int64)
  n_srv = len(server_idx)
  server = {
      "x": jnp.asarray(dataset.x[server_idx].astype(np.float32)),
      "y": jnp.asarray(dataset.y[server_idx].astype(np.int32)),
      "mask": jnp.ones((n_srv,), jnp.float32),
      "index": jnp.arange(n_srv, dtype=jnp.int32),
  }
  return FederatedData(
      train=client_data(dataset, partition, partition.train_clients,
                        pad_to=pad_to),
      test=client_data(dataset, partition, partition.test_clients,
                       pad_to=pad_to),
      server=server,
      num_classes=dataset.num_classes,
      input_shape=tuple(dataset.x.shape[1:]),
      partition=partition,
      dataset_name=dataset.name)
