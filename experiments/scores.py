"""The figures of a comparison of methods over seeds, with their intervals.

A run's score is read from its ``metrics.jsonl``: the last evaluation's
held-out clients (the protocol's own, e.g. 10) and, where the run scored
them, its test-split clients (many clients from the dataset's test split,
the same for every method of a seed: :mod:`augfl_jax.data.official_test_split`).
Per-client correct predictions and query sizes are kept, so that two
methods of one seed can be compared client by client.

The headline figure is the test-split accuracy when every run has one, and
the held-out accuracy otherwise. Intervals (``augfl_jax.core.intervals``):

* one run: the sample-weighted accuracy's 95% interval across its clients;
* a method over seeds: the mean of its seeds' accuracies with the 95%
  Student-t interval across seeds (``n - 1`` degrees of freedom);
* a paired difference (method minus a reference, e.g. AugFL w/ PM, on the
  same seed and clients): per seed, the interval across clients of the
  difference of the two sample-weighted accuracies; over seeds, the mean
  of the per-seed differences with its t-interval across seeds.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from augfl_jax.core import intervals


@dataclasses.dataclass(frozen=True)
class ClientScores:
  """One scoring of one run: ``correct`` and ``count`` ``[C]`` int."""

  correct: np.ndarray
  count: np.ndarray

  @property
  def interval(self) -> intervals.Interval:
    """The sample-weighted accuracy with its interval across clients."""
    return intervals.ratio_interval(self.correct, self.count).clipped()

  def minus(self, other: "ClientScores") -> intervals.Interval:
    """``self - other`` on the same clients, with its interval across
    clients.

    Raises:
      ValueError: the two were not scored on the same clients.
    """
    if not np.array_equal(self.count, other.count):
      raise ValueError("the two runs were not scored on the same clients "
                       "(their query sizes differ): compare runs of one "
                       "seed and one partition protocol")
    return intervals.ratio_interval(self.correct - other.correct, self.count)


@dataclasses.dataclass(frozen=True)
class RunScore:
  """What a comparison needs of one finished run."""

  method: str
  seed: int
  run_dir: str
  rounds: int
  heldout: ClientScores
  test_split: ClientScores | None
  best_heldout: float
  seconds: float

  def headline(self, test_split: bool) -> ClientScores:
    return self.test_split if test_split else self.heldout


def load_run_score(run_dir: str, method: str, seed: int) -> RunScore:
  """The final scores of the run in ``run_dir`` (its ``metrics.jsonl`` and
  ``summary.json``).

  Raises:
    ValueError: a run without an evaluation, or written by a version
      that did not record per-client query sizes.
  """
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(run_dir, "summary.json")) as f:
    summary = json.load(f)
  if not records or "client_count" not in records[-1]:
    raise ValueError(f"{run_dir}: no evaluation with per-client query sizes "
                     "(a run of an older version): run it again")
  final = records[-1]
  counts = np.asarray(final["client_count"], np.int64)
  heldout = ClientScores(
      np.rint(np.asarray(final["client_accuracy"]) * counts).astype(np.int64),
      counts)
  split = final.get("test_split")
  test_split = None if split is None else ClientScores(
      np.asarray(split["client_correct"], np.int64),
      np.asarray(split["client_count"], np.int64))
  return RunScore(method, seed, run_dir, int(summary["rounds"]), heldout,
                  test_split, float(summary["best_accuracy"]),
                  float(summary["seconds"]))


def uses_test_split(scores: list[RunScore]) -> bool:
  """Whether every run has test-split scores (then they are the
  headline)."""
  return bool(scores) and all(s.test_split is not None for s in scores)


def across_seeds(scores: list[RunScore], method: str, test_split: bool
                ) -> intervals.Interval | None:
  """``method``'s mean accuracy over its seeds with the interval across
  seeds; ``None`` when it has no run."""
  values = [s.headline(test_split).interval.mean for s in scores
            if s.method == method]
  return intervals.mean_interval(values).clipped() if values else None


def paired(scores: list[RunScore], method: str, reference: str,
           test_split: bool) -> tuple[dict[int, intervals.Interval],
                                      intervals.Interval | None]:
  """``method - reference`` on the seeds both have: per seed, with its
  interval across clients; and over those seeds, with the interval across
  seeds (``None`` without a common seed)."""
  runs = {(s.method, s.seed): s for s in scores}
  seeds = sorted(seed for m, seed in runs if m == method
                 and (reference, seed) in runs)
  per_seed = {seed: runs[method, seed].headline(test_split).minus(
      runs[reference, seed].headline(test_split)) for seed in seeds}
  overall = (intervals.mean_interval([d.mean for d in per_seed.values()])
             if per_seed else None)
  return per_seed, overall
