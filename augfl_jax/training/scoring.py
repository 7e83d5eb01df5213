"""What a run records of its scores: the evaluations of the held-out and
test-split clients as ``metrics.jsonl`` records (with their 95% intervals),
the words of the console, and ``summary.json``.

Every record names the clients it scored by their identity
(``clients_digest``: the digest of their examples, labels and masks, which
the dataset, the split, the protocol and the seed decide): two runs are
compared client by client only when their digests are equal.

:class:`Scorers` holds a run's two evaluations (the rounds loop calls them
and knows nothing else of how clients are scored); the other functions turn
their results into records, log lines and the summary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from augfl_jax import processes
from augfl_jax.core import evaluation, intervals, tree
from augfl_jax.core.progress import counted

__all__ = ["Scorers", "accuracy_text", "finite", "format_record",
           "heldout_record", "scalars", "summary", "test_split_record"]

Metrics = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Scorers:
  """A run's evaluations of a state.

  Attributes:
    heldout: ``heldout(state)``: the protocol's held-out clients, host
      metrics with ``accuracy_interval`` (``evaluation.with_interval``).
    heldout_counts: ``[C]`` their query examples.
    heldout_digest: their identity (``core.tree.digest`` of their data).
    test_split: ``test_split(state)``: the test-split clients, the same
      metrics (``evaluation.score_in_chunks``); None without them.
    test_split_digest: their identity (None without them).
    test_split_summary: ``summary.json``'s ``test_split`` before any
      scoring: ``source`` and ``clients``, or ``off`` and why.
  """

  heldout: Callable[[Any], Metrics]
  heldout_counts: np.ndarray
  heldout_digest: str
  test_split: Callable[[Any], Metrics] | None
  test_split_digest: str | None
  test_split_summary: dict[str, Any]

  @classmethod
  def of(cls, evaluate: Callable[[Any, Any], Metrics], fed: Any) -> Scorers:
    """The scorers of ``evaluate(state, clients)`` (an algorithm's) on the
    held-out and test-split clients of ``fed`` (``data.FederatedData``)."""
    counts = evaluation.query_counts(fed.test)
    split = fed.test_split
    return cls(
        heldout=lambda state: evaluation.with_interval(
            processes.to_host(evaluate(state, fed.test)), counts),
        heldout_counts=counts,
        heldout_digest=tree.digest(fed.test),
        test_split=None if split is None else (
            lambda state: evaluation.score_in_chunks(
                lambda s, c: processes.to_host(evaluate(s, c)), state,
                split.clients)),
        test_split_digest=None if split is None else tree.digest(
            split.clients),
        test_split_summary=(
            {"off": fed.test_split_off or "not scored"} if split is None
            else {"source": split.source, "clients": split.num_clients}))


def scalars(metrics: Metrics) -> dict[str, float]:
  """The scalar numbers of ``metrics``, as floats."""
  return {k: float(v) for k, v in metrics.items()
          if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype,
                                               np.number)}


def finite(values: dict[str, float]) -> dict[str, float]:
  """The entries with a finite value (an interval of one client has
  none)."""
  return {k: v for k, v in values.items() if np.isfinite(v)}


def heldout_record(ev: Metrics, counts: np.ndarray, digest: str,
                   round_: int, train_losses: list[float]) -> dict[str, Any]:
  """The ``metrics.jsonl`` record of an evaluation of the held-out clients
  (their identity ``digest``) after ``round_`` (``ev``:
  :attr:`Scorers.heldout`'s), with the mean of the training losses since
  the previous one."""
  values = scalars(ev)
  return {"round": round_,
          "mean_train_loss": float(np.mean(train_losses)),
          "accuracy": values["accuracy"],
          "accuracy_ci": ev["accuracy_interval"].to_json(),
          "accuracy_std": values["accuracy_std"],
          "test_loss": values["loss"],
          "client_accuracy": [float(a) for a in ev["client_accuracy"]],
          "client_count": counts.tolist(), "clients_digest": digest}


def test_split_record(ev: Metrics, digest: str) -> dict[str, Any]:
  """A record's ``test_split`` of a scoring of the test-split clients
  (their identity ``digest``)."""
  return {"accuracy": ev["accuracy"],
          "accuracy_ci": ev["accuracy_interval"].to_json(),
          "accuracy_std": ev["accuracy_std"], "test_loss": ev["loss"],
          "clients": int(len(ev["client_count"])),
          "client_correct": ev["client_correct"].tolist(),
          "client_count": ev["client_count"].tolist(),
          "clients_digest": digest}


def accuracy_text(interval: intervals.Interval) -> str:
  """``"89.10 [88.30, 89.90]"`` (%), or ``"89.10 (1 client, no
  interval)"`` where the interval cannot be computed (fewer than 2
  clients)."""
  if math.isnan(interval.low):
    return f"{interval.format()} ({counted(interval.n, 'client')}, no interval)"
  return interval.format()


def format_record(record: dict[str, Any]) -> str:
  """``"89.10 [88.30, 89.90] (95% CI across 1000 clients)"`` of a record
  (:func:`accuracy_text` without an interval)."""
  low, high = (math.nan if v is None else v
               for v in record.get("accuracy_ci") or (None, None))
  clients = record.get("clients", len(record.get("client_accuracy", ())))
  interval = intervals.Interval(record["accuracy"], low, high, clients)
  if math.isnan(low):
    return accuracy_text(interval)
  return f"{interval.format()} (95% CI across {clients} clients)"


def summary(head: dict[str, Any], history: list[dict[str, Any]],
            test_split: dict[str, Any], timing: dict[str, Any]
           ) -> dict[str, Any]:
  """``summary.json``: ``head`` (the run's dataset, algorithm, ...), the
  final and best accuracy of the held-out clients, the newest scoring of
  the test-split clients (its round, accuracy, interval, std and loss; the
  per-client counts are in that round's ``metrics.jsonl`` record) after
  ``test_split`` (:attr:`Scorers.test_split_summary`), and ``timing``."""
  final = history[-1]
  if "off" not in test_split:
    scored = [h for h in history if "test_split" in h]
    if scored:
      newest = scored[-1]["test_split"]
      test_split = {**test_split, "round": scored[-1]["round"], **{
          k: newest[k] for k in ("accuracy", "accuracy_ci", "accuracy_std",
                                 "test_loss")}}
  return {**head,
          "final_accuracy": final["accuracy"],
          "final_accuracy_ci": final.get("accuracy_ci"),
          "final_accuracy_std": final["accuracy_std"],
          "best_accuracy": max(h["accuracy"] for h in history),
          "test_split": test_split, **timing}
