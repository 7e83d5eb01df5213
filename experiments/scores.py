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
import os
from typing import Any, Callable

import numpy as np

from augfl_jax.core import intervals
from augfl_jax.training import outputs


@dataclasses.dataclass(frozen=True)
class ClientScores:
  """One scoring of one run: ``correct`` and ``count`` ``[C]`` int, and the
  identity of the clients (``clients_digest`` of the record; None for a
  run of a version that did not record it)."""

  correct: np.ndarray
  count: np.ndarray
  digest: str | None = None

  @property
  def interval(self) -> intervals.Interval:
    """The sample-weighted accuracy with its interval across clients."""
    return intervals.ratio_interval(self.correct, self.count).clipped()

  def minus(self, other: "ClientScores") -> intervals.Interval:
    """``self - other`` on the same clients, with its interval across
    clients.

    Raises:
      ValueError: the two were not scored on the same clients (their
        identities, or without one their query sizes, differ).
    """
    if (self.digest and other.digest and self.digest != other.digest) or (
        not np.array_equal(self.count, other.count)):
      raise ValueError("the two runs were not scored on the same clients: "
                       "compare runs of one seed and one protocol")
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
  protocol: dict[str, Any] = dataclasses.field(default_factory=dict)

  def headline(self, test_split: bool) -> ClientScores:
    return self.test_split if test_split else self.heldout


# What decides a run's clients, from its config.json (dotted; data.* but
# where its files are and whether they were fetched): two runs differing in
# one of them scored other clients.
PROTOCOL = ("dataset", "seed", "eval.test_clients")


def _protocol(config: dict[str, Any]) -> dict[str, Any]:
  data = config.get("data") if isinstance(config.get("data"), dict) else {}
  evaluation = (config.get("eval") if isinstance(config.get("eval"), dict)
                else {})
  return {"dataset": config.get("dataset"), "seed": config.get("seed"),
          "eval.test_clients": evaluation.get("test_clients"),
          **{f"data.{k}": v for k, v in sorted(data.items())
             if k not in ("data_dir", "download", "download_as")}}


def check_same_clients(a: RunScore, b: RunScore, test_split: bool) -> None:
  """Raises ``ValueError`` (one line: what differs) unless ``a`` and ``b``
  were scored on the same clients: the same identity of the scored
  clients, or, for runs that did not record one, the same protocol."""
  differing = [f"{k} {a.protocol.get(k)!r} against {b.protocol.get(k)!r}"
               for k in sorted(set(a.protocol) | set(b.protocol))
               if a.protocol.get(k) != b.protocol.get(k)]
  sa, sb = a.headline(test_split), b.headline(test_split)
  if not differing and sa.digest and sb.digest and sa.digest != sb.digest:
    differing = ["the same protocol, but the clients' examples differ "
                 "(another copy or version of the dataset)"]
  if differing or not np.array_equal(sa.count, sb.count):
    raise ValueError(
        f"{a.run_dir} and {b.run_dir} were not scored on the same clients: "
        + ("; ".join(differing[:3]) or "their query sizes differ")
        + "; a paired difference needs runs of one seed and one protocol")


def _check_lengths(path: str, what: str, scores: np.ndarray,
                   count: np.ndarray) -> None:
  """Refuses per-client lists of different lengths, or none: one line
  naming the file."""
  if count.ndim != 1 or scores.shape != count.shape or not count.size:
    raise ValueError(f"{path}: the {what} scores are not a run's "
                     f"({scores.size} per-client scores for {count.size} "
                     "query sizes: an edited or damaged file); rerun the run")


def _check_scores(path: str, what: str, correct: np.ndarray,
                  count: np.ndarray) -> None:
  """Refuses scores no run writes (edited, or torn): one line naming the
  file."""
  _check_lengths(path, what, correct, count)
  if (count <= 0).any() or (correct < 0).any() or (correct > count).any():
    raise ValueError(f"{path}: the {what} scores are not a run's (a count "
                     "of at most 0, or correct predictions outside 0..count: "
                     "an edited or damaged file); rerun the run")


def _ints(values: Any, path: str, what: str) -> np.ndarray:
  array = np.asarray(values, dtype=np.float64)
  if not np.all(np.isfinite(array)) or not np.all(array == np.rint(array)):
    raise ValueError(f"{path}: the {what} scores hold non-integer or "
                     "non-finite counts (an edited or damaged file); rerun "
                     "the run")
  return array.astype(np.int64)


def load_run_score(run_dir: str, method: str, seed: int,
                   log: Callable[[str], None] = lambda line: None
                  ) -> RunScore:
  """The final scores of the run in ``run_dir`` (its ``metrics.jsonl``,
  ``summary.json`` and ``config.json``); a torn last line of
  ``metrics.jsonl`` (a run stopped mid-write) is dropped, saying so to
  ``log``.

  Raises:
    ValueError: one line naming the file: an unreadable file, a run
      without an evaluation, written by a version that did not record
      per-client query sizes, whose last evaluation is not of the round its
      summary says (it went on after it finished), or with scores no run
      writes.
  """
  out = outputs.OutputDir(run_dir)
  try:
    records = out.read_records("metrics.jsonl", log)
    summary = out.read_json("summary.json")
    config = (out.read_json("config.json")
              if os.path.exists(out.file("config.json")) else {})
  except OSError as e:
    raise ValueError(f"{run_dir}: {e.strerror or e}: "
                     f"{e.filename or ''}") from None
  path = out.file("metrics.jsonl")
  if not records or "client_count" not in records[-1]:
    raise ValueError(f"{path}: no evaluation with per-client query sizes "
                     "(a run of an older version): run it again")
  final = records[-1]
  try:
    rounds = int(summary["rounds"])
    if int(final["round"]) != rounds:
      raise ValueError(
          f"{path}: its last evaluation is of round {final['round']}, but "
          f"its summary.json of a {rounds}-round run: the run went on after "
          "it finished (resumed with a larger --rounds and stopped); finish "
          "it, or score it with the --rounds of its last round")
    counts = _ints(final["client_count"], path, "held-out")
    accuracy = np.asarray(final["client_accuracy"], np.float64)
    if not np.all(np.isfinite(accuracy)):
      raise ValueError(f"{path}: the held-out scores hold non-finite "
                       "accuracies (an edited or damaged file); rerun the run")
    _check_lengths(path, "held-out", accuracy, counts)
    heldout = ClientScores(np.rint(accuracy * counts).astype(np.int64),
                           counts, final.get("clients_digest"))
    _check_scores(path, "held-out", heldout.correct, heldout.count)
    split = final.get("test_split")
    test_split = None
    if split is not None:
      test_split = ClientScores(
          _ints(split["client_correct"], path, "test-split"),
          _ints(split["client_count"], path, "test-split"),
          split.get("clients_digest"))
      _check_scores(path, "test-split", test_split.correct,
                    test_split.count)
    return RunScore(method, seed, run_dir, rounds, heldout, test_split,
                    float(summary["best_accuracy"]),
                    float(summary["seconds"]), _protocol(config))
  except (KeyError, TypeError) as e:
    raise ValueError(f"{run_dir}: its summary.json or metrics.jsonl lacks "
                     f"{e} (an edited or damaged file); rerun the run"
                     ) from None


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
  for seed in seeds:
    check_same_clients(runs[method, seed], runs[reference, seed], test_split)
  per_seed = {seed: runs[method, seed].headline(test_split).minus(
      runs[reference, seed].headline(test_split)) for seed in seeds}
  overall = (intervals.mean_interval([d.mean for d in per_seed.values()])
             if per_seed else None)
  return per_seed, overall
