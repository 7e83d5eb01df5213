"""What a run scores and records of it: the evaluations the rounds loop is
given (:class:`Evaluation`, by name, as FedJAX's ``periodic_eval_fn_map``
and ``final_eval_fn_map``: :func:`heldout`, :func:`test_split`,
:func:`not_scored`), their ``metrics.jsonl`` records (with their 95%
intervals), the words of the console, and ``summary.json``.

Every record names the clients it scored by their identity
(``clients_digest``: the digest of their examples, labels and masks, which
the dataset, the split, the protocol and the seed decide): two runs are
compared client by client only when their digests are equal.

The loop knows nothing else of how clients are scored: adding an
evaluation is one more entry in the mapping it is given, e.g. the
held-out clients scored by another procedure after the last round::

  evaluations = {**experiment.evaluations(),
                 "other": scoring.heldout(other_evaluate, fed.test,
                                          every=0, title="other")}
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from augfl_jax import processes
from augfl_jax.core import evaluation, intervals, tree
from augfl_jax.core.progress import counted

__all__ = ["Evaluation", "accuracy_text", "finite", "format_record",
           "heldout", "not_scored", "scalars", "summary", "test_split"]

Metrics = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """One evaluation of a run's state, as the rounds loop is given it.

  The loop scores every evaluation that is due after a round, and then
  always the first of its mapping, the run's headline: its record is the
  body of the round's ``metrics.jsonl`` record and its accuracy is in the
  round's line; each other one's record goes under its name, its words on
  a line of their own.

  Attributes:
    score: ``score(state)``: host metrics with ``accuracy`` and
      ``accuracy_interval``; None: nothing to score (``summary`` says
      why).
    every: scored after every this many rounds (0: after the last round
      only, a final evaluation) and after the last.
    title: what the final line calls its accuracy (``final <title>
      accuracy``).
    clients: the clients it scores, in the line of a non-finite
      evaluation (``the held-out clients``).
    record: ``record(metrics)``: its part of a ``metrics.jsonl`` record.
    events: ``events(metrics)``: its TensorBoard scalars (``eval/``).
    text: ``text(metrics)``: its words on the console.
    summary: ``summary.json``'s entry before any scoring (None: none).
    legend: the line that says, before the rounds, what its numbers are.
  """

  score: Callable[[Any], Metrics] | None
  every: int
  title: str
  clients: str
  record: Callable[[Metrics], dict[str, Any]]
  events: Callable[[Metrics], dict[str, float]]
  text: Callable[[Metrics], str]
  summary: dict[str, Any] | None = None
  legend: str | None = None

  def due(self, round_: int, rounds: int) -> bool:
    """Whether it is scored after ``round_`` of ``rounds``."""
    return round_ == rounds or bool(self.every and round_ % self.every == 0)


def heldout(evaluate: Callable[[Any, Any], Metrics], clients: Any,
            every: int, title: str = "test-client") -> Evaluation:
  """``evaluate(state, clients)`` (an algorithm's) on ``clients`` (the
  protocol's held-out clients: a run's headline), every ``every`` rounds;
  its record holds the accuracy per client and the query examples they
  count."""
  counts = evaluation.query_counts(clients)
  digest = tree.digest(clients)
  n = len(counts)
  return Evaluation(
      score=lambda state: evaluation.with_interval(
          processes.to_host(evaluate(state, clients)), counts),
      every=every, title=title, clients="the held-out clients",
      record=lambda ev: _heldout_record(ev, counts, digest),
      events=lambda ev: {k: float(ev[k]) for k in (
          "accuracy", "accuracy_std", "loss")} | {
              "accuracy_ci_low": ev["accuracy_interval"].low,
              "accuracy_ci_high": ev["accuracy_interval"].high},
      text=lambda ev: accuracy_text(ev["accuracy_interval"]),
      legend="accuracy: " + (
          f"the {n} held-out clients' test-client accuracy (%), mean "
          "[95% CI across them]" if n > 1 else "the held-out client's "
          "test-client accuracy (%); 1 client, no interval"))


def test_split(evaluate: Callable[[Any, Any], Metrics],
               split: Any, every: int) -> Evaluation:
  """``evaluate(state, clients)`` on the test-split clients ``split``
  (``data.TestSplitClients``), in chunks (``evaluation.score_in_chunks``),
  after the last round and every ``every`` rounds."""
  digest = tree.digest(split.clients)
  return Evaluation(
      score=lambda state: evaluation.score_in_chunks(
          lambda s, c: processes.to_host(evaluate(s, c)), state,
          split.clients),
      every=every, title="test-split", clients="the test-split clients",
      record=lambda ev: _test_split_record(ev, digest),
      events=lambda ev: {
          "test_split_accuracy": ev["accuracy"],
          "test_split_accuracy_ci_low": ev["accuracy_interval"].low,
          "test_split_accuracy_ci_high": ev["accuracy_interval"].high},
      text=lambda ev: (
          f"test-split accuracy {accuracy_text(ev['accuracy_interval'])}"
          + (f" across {len(ev['client_count'])} clients"
             if len(ev["client_count"]) > 1 else "")),
      summary={"source": split.source, "clients": split.num_clients})


def not_scored(why: str, every: int) -> Evaluation:
  """The test-split clients of a run without them: nothing is scored;
  ``summary.json`` says ``why`` (``off``). Its ``every`` still makes a
  round an evaluation round, as a run with them would have it."""
  return Evaluation(score=None, every=every, title="test-split",
                    clients="the test-split clients", record=dict,
                    events=dict, text=str, summary={"off": why})


def scalars(metrics: Metrics) -> dict[str, float]:
  """The scalar numbers of ``metrics``, as floats."""
  return {k: float(v) for k, v in metrics.items()
          if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype,
                                               np.number)}


def finite(values: dict[str, float]) -> dict[str, float]:
  """The entries with a finite value (an interval of one client has
  none)."""
  return {k: v for k, v in values.items() if np.isfinite(v)}


def _heldout_record(ev: Metrics, counts: np.ndarray,
                    digest: str) -> dict[str, Any]:
  """:func:`heldout`'s part of a ``metrics.jsonl`` record (the clients'
  identity ``digest``)."""
  values = scalars(ev)
  return {"accuracy": values["accuracy"],
          "accuracy_ci": ev["accuracy_interval"].to_json(),
          "accuracy_std": values["accuracy_std"],
          "test_loss": values["loss"],
          "client_accuracy": [float(a) for a in ev["client_accuracy"]],
          "client_count": counts.tolist(), "clients_digest": digest}


def _test_split_record(ev: Metrics, digest: str) -> dict[str, Any]:
  """:func:`test_split`'s part of a ``metrics.jsonl`` record (the
  clients' identity ``digest``)."""
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
            evaluations: dict[str, Evaluation], timing: dict[str, Any]
           ) -> dict[str, Any]:
  """``summary.json``: ``head`` (the run's dataset, algorithm, ...), the
  final and best accuracy of the headline (the first of
  ``evaluations``), each other evaluation's entry (its ``summary``) with
  its newest scoring (its round, accuracy, interval, std and loss; the
  per-client counts are in that round's ``metrics.jsonl`` record), and
  ``timing``."""
  final = history[-1]
  entries = {}
  for name, ev in list(evaluations.items())[1:]:
    if ev.summary is None:
      continue
    entries[name] = dict(ev.summary)
    scored = [h for h in history if name in h]
    if "off" not in ev.summary and scored:
      newest = scored[-1][name]
      entries[name].update({"round": scored[-1]["round"], **{
          k: newest[k] for k in ("accuracy", "accuracy_ci", "accuracy_std",
                                 "test_loss")}})
  return {**head,
          "final_accuracy": final["accuracy"],
          "final_accuracy_ci": final.get("accuracy_ci"),
          "final_accuracy_std": final["accuracy_std"],
          "best_accuracy": max(h["accuracy"] for h in history),
          **entries, **timing}
