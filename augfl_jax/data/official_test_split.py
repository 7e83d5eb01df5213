"""Many held-out clients from a dataset's official test split, to score a run.

The paper's protocol scores a run on its held-out clients: 20% of N, 10 for
Fashion-MNIST, each with 10-20 query examples. Their per-client accuracies
spread by 10-20 points, so the mean of 10 has a standard error of 4-7
points from the choice of clients alone. This module draws many more
held-out clients (``num_clients``; ``--eval.test_clients``) from examples
that no training client, the server split or the PM has seen:

* datasets with IDX or CIFAR binary files: the official test split beside
  the train files (``t10k-*``, ``emnist-<split>-test-*``,
  ``test_batch.bin``, ``test.bin``);
* a tfds prepared copy: its ``test`` split;
* ``digits`` (embedded, no test split): the examples its partition left
  unused (in no client and not in the server split), and it says so;
* ``synthetic`` has none: every example belongs to a natural client.

Images are standardised with the train split's per-channel statistics, as
the training examples are.

Each client follows the run's own partition protocol: its size ``|D_i|`` is
uniform on ``{M, ..., 2M}``; it holds ``classes_per_client`` distinct
classes (``pathological``, ``|D_i| // k`` examples a class with the
remainder spread one each over random classes among them) or a class mix
``p_i ~ Dir(dirichlet_alpha)`` (``dirichlet``); its examples are split into
support and query sets as the partition splits them (``support_fraction``,
:mod:`augfl_jax.data.splits`). Clients are drawn independently of each
other: an example may serve several clients, never twice within one (the
test split has 10,000 images, 1,000 clients need about 30,000). The draws
use the fifth stream of ``np.random.SeedSequence(seed)`` (the partition
uses the first four), so they depend only on the seed and the protocol:
every method and every configuration of a seed is scored on the same
clients.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from augfl_jax.data import catalog, sources
from augfl_jax.data.dataset import Dataset
from augfl_jax.data.federated import pad_stack
from augfl_jax.data.splits import Partition
from augfl_jax.core.types import ClientData

__all__ = ["OfficialTestClients", "OfficialTestSplitUnavailable", "draw_clients",
           "load_test_split_clients", "locate_test_split",
           "test_split_clients"]

UNUSED = "unused"  # Location.kind of digits' left-over examples
PARTITIONS = ("pathological", "dirichlet")


class OfficialTestSplitUnavailable(RuntimeError):
  """A run's dataset has no test split to draw clients from (the message
  says why)."""


@dataclasses.dataclass(frozen=True, eq=False)
class OfficialTestClients:
  """Held-out clients drawn from a test split.

  Attributes:
    clients: their ``ClientData``, leaves ``[C, P, ...]``.
    support: per client, ``[S_i]`` indices of its support set in the pool's
      dataset (the test split; for ``digits``, the dataset itself).
    query: per client, ``[Q_i]`` indices of its query set.
    source: one line: where the clients come from.
  """

  clients: ClientData
  support: tuple[np.ndarray, ...]
  query: tuple[np.ndarray, ...]
  source: str

  @property
  def num_clients(self) -> int:
    return len(self.support)

  def query_counts(self) -> np.ndarray:
    """``[C]`` int64 query examples per client (the examples scored)."""
    return np.array([len(q) for q in self.query], dtype=np.int64)


def locate_test_split(name: str, location: catalog.Location
                     ) -> catalog.Location:
  """Where ``name``'s test split is, given where its train split was found.

  Returns:
    The IDX pair beside the train files, the same tfds copy (its ``test``
    split), or ``Location("unused", "")`` for a dataset whose test-split
    clients come from the examples its partition leaves unused (digits).

  Raises:
    OfficialTestSplitUnavailable: none, with the reason (the files expected and
      where they were looked for).
  """
  spec = catalog.spec(name)
  if spec.test_split_from_unused:
    return catalog.Location(UNUSED, "")
  if location.kind == "embedded":
    raise OfficialTestSplitUnavailable(
        f"{spec.name} has no test split: every example belongs to a natural "
        "client" if spec.natural_clients else f"{spec.name} has no test "
        "split: its load function makes one set of examples")
  if location.kind in ("idx", "cifar"):
    found = catalog.find_split(spec, location.path, "test")
    if found is None:
      either = "[.gz]" if location.kind == "idx" else ""
      raise OfficialTestSplitUnavailable(
          f"{spec.name}'s test split is not beside its train files: no "
          + " and ".join(f"{f}{either}"
                         for f in catalog.split_files(spec, "test"))
          + f" in {location.path}"
          + ("; --data.download fetches them" if spec.remote else ""))
    return found
  if not catalog.has_tfds_copy(spec, location.path, "test"):
    raise OfficialTestSplitUnavailable(
        f"the tfds copy of {spec.name} in {location.path} holds no prepared "
        "test split")
  return location


def _check_protocol(num_clients: int, M: int, classes_per_client: int,
                    support_fraction: float, partition: str,
                    dirichlet_alpha: float) -> None:
  if isinstance(num_clients, bool) or int(num_clients) < 1:
    raise ValueError(f"num_clients must be >= 1, got {num_clients}")
  if M < 2:
    raise ValueError(f"M must be >= 2 (a support and a query example), got "
                     f"{M}")
  if not 1 <= classes_per_client <= M:
    raise ValueError(f"classes_per_client must be in [1, M={M}], got "
                     f"{classes_per_client}")
  if not 0.0 < support_fraction < 1.0:
    raise ValueError("support_fraction must be strictly between 0 and 1, "
                     f"got {support_fraction}")
  if partition not in PARTITIONS:
    raise ValueError(f"unknown partition {partition!r}; use one of "
                     f"{', '.join(PARTITIONS)}")
  if partition == "dirichlet" and not dirichlet_alpha > 0:
    raise ValueError(f"dirichlet_alpha must be > 0, got {dirichlet_alpha}")


def _class_counts(rng: np.random.Generator, size: int, available: np.ndarray,
                  classes_per_client: int, partition: str,
                  dirichlet_alpha: float) -> np.ndarray:
  """``[K]`` examples per class of one client of ``size`` examples, each
  at most what the pool has of the class (``available``)."""
  counts = np.zeros(len(available), np.int64)
  if partition == "pathological":
    k = classes_per_client
    base, extra = divmod(size, k)
    big_ok = np.flatnonzero(available >= base + 1)
    small_ok = np.flatnonzero(available >= base)
    if len(big_ok) < extra or len(small_ok) < k:
      raise OfficialTestSplitUnavailable(
          f"the pool has too few examples for a client of {size} examples "
          f"from {k} classes ({base}+ a class; per class: "
          f"{available.tolist()})")
    big = rng.choice(big_ok, size=extra, replace=False)
    small = rng.choice(np.setdiff1d(small_ok, big), size=k - extra,
                       replace=False)
    counts[big] = base + 1
    counts[small] = base
    return counts
  if available.sum() < size:
    raise OfficialTestSplitUnavailable(f"the pool holds {available.sum()} examples, "
                               f"fewer than a client's {size}")
  p = rng.dirichlet(np.full(len(available), float(dirichlet_alpha)))
  while (need := size - int(counts.sum())) > 0:
    room = available - counts
    weights = np.where(room > 0, np.nan_to_num(p), 0.0)
    if weights.sum() <= 0:
      weights = (room > 0).astype(np.float64)
    counts += np.minimum(rng.multinomial(need, weights / weights.sum()),
                         room)
  return counts


def draw_clients(labels: np.ndarray, pool: np.ndarray, *, num_clients: int,
                 M: int, classes_per_client: int = 2,  # pylint: disable=invalid-name
                 support_fraction: float = 0.5, seed: int,
                 partition: str = "pathological",
                 dirichlet_alpha: float = 0.5, num_classes: int
                ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
  """Draws ``num_clients`` clients from ``pool`` (module docstring).

  Args:
    labels: ``[n]`` int labels of the pool's dataset.
    pool: ``[m]`` indices the clients may take examples from.
    num_clients: how many clients.
    M: client sizes are uniform on ``{M, ..., 2M}``.
    classes_per_client: distinct classes a client (pathological).
    support_fraction: a client's share of support examples,
      ``ceil(support_fraction |D_i|)``, each set at least one example.
    seed: the run's seed.
    partition: ``"pathological"`` or ``"dirichlet"``.
    dirichlet_alpha: the Dirichlet concentration.
    num_classes: number of classes.

  Returns:
    ``(support, query)``: per client, ``[S_i]`` and ``[Q_i]`` int64
    indices into ``labels``.

  Raises:
    ValueError: bad arguments.
    OfficialTestSplitUnavailable: a pool too small for one client.
  """
  _check_protocol(num_clients, M, classes_per_client, support_fraction,
                  partition, dirichlet_alpha)
  labels = np.asarray(labels)
  pool = np.asarray(pool, dtype=np.int64)
  by_class = [pool[labels[pool] == c] for c in range(num_classes)]
  available = np.array([len(b) for b in by_class], np.int64)
  rng = np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(5)[4])
  support, query = [], []
  for _ in range(int(num_clients)):
    size = int(rng.integers(M, 2 * M + 1))
    counts = _class_counts(rng, size, available, classes_per_client,
                           partition, dirichlet_alpha)
    examples = rng.permutation(np.concatenate(
        [rng.choice(by_class[c], size=counts[c], replace=False)
         for c in np.flatnonzero(counts)]))
    n_support = min(max(math.ceil(support_fraction * size - 1e-9), 1),
                    size - 1)
    support.append(examples[:n_support])
    query.append(examples[n_support:])
  return tuple(support), tuple(query)


def test_split_clients(dataset: Dataset, partition: Partition,
                       test: Dataset | None, *, num_clients: int, M: int,  # pylint: disable=invalid-name
                       classes_per_client: int = 2,
                       support_fraction: float = 0.5, seed: int,
                       partition_kind: str = "pathological",
                       dirichlet_alpha: float = 0.5) -> OfficialTestClients:
  """Held-out clients from ``test`` (the test split, read with
  ``load_split(..., "test", like=dataset)``), or, when it is ``None``, from
  the examples of ``dataset`` that ``partition`` left unused (``digits``).

  Args:
    dataset: the train split the run trains on.
    partition: the run's partition of ``dataset``.
    test: the test split, or ``None`` for the partition's left-overs.
    num_clients, M, classes_per_client, support_fraction: the protocol, as
      :func:`draw_clients`.
    seed, partition_kind, dirichlet_alpha: the protocol, as
      :func:`draw_clients` (``partition_kind`` is its ``partition``).

  Returns:
    The :class:`OfficialTestClients`.

  Raises:
    OfficialTestSplitUnavailable: a pool too small for one client.
  """
  if test is None:
    taken = np.concatenate([partition.server, *partition.support,
                            *partition.query]).astype(np.int64)
    pool = np.setdiff1d(np.arange(dataset.num_examples), taken)
    source_data = dataset
    source = (f"the {len(pool)} examples of {dataset.name} that the "
              f"partition left unused ({dataset.name} has no test split)")
  else:
    pool = np.arange(test.num_examples)
    source_data = test
    source = f"the test split ({test.source}, {test.num_examples} examples)"
  support, query = draw_clients(
      source_data.y, pool, num_clients=num_clients, M=M,
      classes_per_client=classes_per_client,
      support_fraction=support_fraction, seed=seed, partition=partition_kind,
      dirichlet_alpha=dirichlet_alpha, num_classes=dataset.num_classes)
  pad_to = max(len(s) for s in support + query)
  x, y = source_data.x, source_data.y
  clients = ClientData(
      support=pad_stack(x, y, support, pad_to=pad_to,
                        num_classes=dataset.num_classes),
      query=pad_stack(x, y, query, pad_to=pad_to,
                      num_classes=dataset.num_classes),
      num_examples=jnp.asarray([len(s) + len(q)
                                for s, q in zip(support, query)],
                               jnp.float32))
  return OfficialTestClients(
      clients, support, query,
      f"{num_clients} clients drawn from {source}")


def load_test_split_clients(dataset: Dataset, partition: Partition, *,
                            data_dir: str | None = None,
                            location: catalog.Location | None = None,
                            num_clients: int, M: int,  # pylint: disable=invalid-name
                            classes_per_client: int = 2,
                            support_fraction: float = 0.5, seed: int,
                            partition_kind: str = "pathological",
                            dirichlet_alpha: float = 0.5
                           ) -> OfficialTestClients:
  """Finds and reads ``dataset``'s test split (:func:`locate_test_split`,
  beside its train files: at ``location``, else under ``data_dir``'s search
  order) and draws the clients (:func:`test_split_clients`, the same
  arguments).

  Raises:
    OfficialTestSplitUnavailable: no test split, or one too small for a client.
    idx.DataFileError: test-split files that are damaged or hold examples
      of another shape than ``dataset``'s (read with
      ``sources.load_split(..., like=dataset)``): under
      ``--eval.test_split=auto`` too, as the files are there but wrong,
      which a run must not pass over by scoring without them.
  """
  location = locate_test_split(
      dataset.name, location or catalog.locate(dataset.name, data_dir))
  test = (None if location.kind == UNUSED else
          sources.load_split(dataset.name, location, "test", like=dataset))
  return test_split_clients(
      dataset, partition, test, num_clients=num_clients, M=M,
      classes_per_client=classes_per_client,
      support_fraction=support_fraction, seed=seed,
      partition_kind=partition_kind, dirichlet_alpha=dirichlet_alpha)
