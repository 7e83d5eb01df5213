"""The figures of a comparison of methods over seeds, with their intervals.

A run's score is what its newest checkpoint sealed: the last evaluation's
held-out clients (the protocol's own, e.g. 10) and, where the run scored
them, its test-split clients (many clients from the dataset's test split,
the same for every method of a seed: :mod:`augfl_jax.data.official_test_split`).
Its ``metrics.jsonl``, ``summary.json`` and ``config.json`` must be what
the checkpoint sealed (:func:`augfl_jax.training.resume.differing_files`):
a file copied from another run, edited or torn is refused in one line
with the command that writes it again from the checkpoint
(:func:`resume_command`), as is a run without a sealed checkpoint.
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

With fewer than 3 seeds a table says that an interval across seeds needs
at least 3 (:func:`few_seeds_note`): 1 seed gives none, 2 a t-interval
with 1 degree of freedom, 12.7 standard errors either side.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any, Callable

import numpy as np

from augfl_jax import training
from augfl_jax.core import fields, intervals
from augfl_jax.training import checkpoints, outputs
from augfl_jax.training import resume as resuming


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
  # where the run's wall time went (its summary's ``phase_seconds``,
  # ``training.phases``); None for a run of a version without them
  phase_seconds: dict[str, float] | None = None

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


def _flag(name: str, value: Any) -> str:
  """``--name=value`` as ``experiments.run`` reads it."""
  if isinstance(value, bool):
    value = str(value).lower()
  elif isinstance(value, (list, tuple)):
    value = ",".join(map(str, value))
  return shlex.quote(f"--{name}={value}")


def resume_command(run_dir: str, recorded: dict[str, Any]) -> str:
  """The ``experiments.run --resume`` command of the run in ``run_dir``
  whose (sealed, resolved) configuration is ``recorded``: the flags of the
  fields that the defaults and presets do not fill with the same value, in
  the sections its run reads."""
  cls = training.config.config_class()
  try:
    target = fields.from_dict(cls, recorded)
  except (ValueError, TypeError, AttributeError):
    return (f"python -m experiments.run --output_dir={shlex.quote(run_dir)}"
            " --resume and the run's own flags")
  unread = set(training.unread_sections(target))
  chosen: dict[str, Any] = {}
  current = training.resolve(cls())
  for name, _, _, value in fields.walk(target):
    if ("." in name and name.partition(".")[0] in unread) or (
        value is None or fields.get(current, name) == value):
      continue
    chosen[name] = value
    try:
      current = training.resolve(fields.replace(cls(), **chosen))
    except (ValueError, TypeError):  # a combination refused on its way
      pass
  return " ".join(["python -m experiments.run",
                   shlex.quote(f"--output_dir={run_dir}")] +
                  [_flag(n, v) for n, v in chosen.items()] + ["--resume"])


def sealed(run_dir: str, log: Callable[[str], None] = lambda line: None
          ) -> tuple[str, dict[str, Any]]:
  """``(path, meta)`` of the newest checkpoint of the run in ``run_dir``:
  what the run sealed.

  Raises:
    ValueError: one line: the run has no checkpoint, or its newest one
      does not read back (damaged, or unsealed).
  """
  root = os.path.join(run_dir, "checkpoints")
  manager = checkpoints.RunCheckpoints(root)  # touches nothing
  try:
    steps = manager.steps() if os.path.isdir(root) else []
    if not steps:
      raise ValueError(
          f"{run_dir}: no checkpoint, so nothing sealed its scores (its "
          "checkpoints were removed, or another tool wrote it); rerun the "
          "run")
    path = manager.path(steps[-1])
    try:
      meta = manager.read_meta(steps[-1])
      if not isinstance(meta, dict) or "config" not in meta:
        raise ValueError("its metadata has no configuration")
    except Exception as e:  # pylint: disable=broad-except
      reason = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
      raise ValueError(
          f"{run_dir}: its newest checkpoint {path} does not read back "
          f"({reason[:200]}), so it cannot vouch for the run's scores; "
          "continue the run with its command and --resume (it goes back to "
          "the checkpoint before, if one reads back, and trains the rounds "
          "since), or rerun the run") from None
    return path, meta
  finally:
    manager.close()


def check_files(run_dir: str, path: str, meta: dict[str, Any],
                log: Callable[[str], None]) -> None:
  """Refuses (``ValueError``, one line with the command that writes them
  again) the run in ``run_dir`` when its files are not what its newest
  checkpoint (``path``, ``meta``) sealed
  (``training.resume.differing_files``; a torn last line of
  ``metrics.jsonl`` past the checkpoint is dropped, telling ``log``)."""
  differ = resuming.differing_files(outputs.OutputDir(run_dir), meta, log)
  if differ:
    raise ValueError(
        f"{run_dir}: {differ[0]}" + (f" (and {len(differ) - 1} more)"
                                     if len(differ) > 1 else "")
        + f": not what its checkpoint {path} sealed (copied from another "
        "run, edited, or cut short); write the run's files again from it "
        f"with: {resume_command(run_dir, meta['config'])}")


def load_run_score(run_dir: str, method: str, seed: int,
                   log: Callable[[str], None] = lambda line: None
                  ) -> RunScore:
  """The final scores of the run in ``run_dir``: its newest checkpoint's
  sealed records (:func:`sealed`), once its ``metrics.jsonl``,
  ``summary.json`` and ``config.json`` are checked to be what it sealed
  (:func:`check_files`; a torn last line of ``metrics.jsonl``, a run
  stopped while it wrote a record past its checkpoint, is dropped, saying
  so to ``log``).

  Raises:
    ValueError: one line naming the file: no sealed checkpoint, files that
      are not what it sealed, a run without an evaluation, written by a
      version that did not record per-client query sizes, whose last
      evaluation is not of the round its summary says (it went on after it
      finished), or with scores no run writes.
  """
  scores = load_round_scores(run_dir, method, seed, log)
  return scores[max(scores)]


def load_round_scores(run_dir: str, method: str, seed: int,
                      log: Callable[[str], None] = lambda line: None
                     ) -> dict[int, RunScore]:
  """``{round: scores}`` of every evaluation the run in ``run_dir``
  sealed, checked as :func:`load_run_score` checks its final one (whose
  scores are the last entry); ``RunScore.rounds`` is the evaluated round,
  ``test_split`` ``None`` at a round whose test-split clients were not
  scored.

  Raises:
    ValueError: as :func:`load_run_score`.
  """
  out = outputs.OutputDir(run_dir)
  path = out.file("metrics.jsonl")
  checkpoint, meta = sealed(run_dir)
  records = meta.get("records")
  if not isinstance(records, list) or not records or (
      "client_count" not in records[-1]):
    raise ValueError(f"{checkpoint}: no evaluation with per-client query "
                     "sizes sealed (a run of an older version): run it "
                     "again")
  try:
    summary = out.read_json("summary.json")
    rounds = int(summary["rounds"])
  except (OSError, ValueError, KeyError, TypeError):
    summary = rounds = None  # named by check_files
  if rounds is not None and records[-1].get("round") != rounds:
    raise ValueError(
        f"{path}: its last evaluation is of round {records[-1].get('round')}"
        f", but its summary.json of a {rounds}-round run: the run went on "
        "after it finished (resumed with a larger --rounds and stopped); "
        "finish it, or score it with the --rounds of its last round")
  check_files(run_dir, checkpoint, meta, log)
  try:
    best = max(float(r["accuracy"]) for r in records)
    seconds = float(meta.get("seconds", summary["seconds"]))
    phase_seconds = (summary or {}).get("phase_seconds")
    return {int(r["round"]): RunScore(
        method, seed, run_dir, int(r["round"]), *_record_scores(r, path),
        best, seconds, _protocol(meta["config"]),
        phase_seconds if isinstance(phase_seconds, dict) else None)
            for r in records if "client_count" in r}
  except (KeyError, TypeError) as e:
    raise ValueError(f"{run_dir}: its summary.json or metrics.jsonl lacks "
                     f"{e} (an edited or damaged file); rerun the run"
                     ) from None


def _record_scores(record: dict[str, Any], path: str
                  ) -> tuple[ClientScores, ClientScores | None]:
  """``(held-out, test-split or None)`` of one evaluation record of the
  run's file ``path`` (named in errors)."""
  counts = _ints(record["client_count"], path, "held-out")
  accuracy = np.asarray(record["client_accuracy"], np.float64)
  if not np.all(np.isfinite(accuracy)):
    raise ValueError(f"{path}: the held-out scores hold non-finite "
                     "accuracies (an edited or damaged file); rerun the run")
  _check_lengths(path, "held-out", accuracy, counts)
  heldout = ClientScores(np.rint(accuracy * counts).astype(np.int64),
                         counts, record.get("clients_digest"))
  _check_scores(path, "held-out", heldout.correct, heldout.count)
  split = record.get("test_split")
  test_split = None
  if split is not None:
    test_split = ClientScores(
        _ints(split["client_correct"], path, "test-split"),
        _ints(split["client_count"], path, "test-split"),
        split.get("clients_digest"))
    _check_scores(path, "test-split", test_split.correct, test_split.count)
  return heldout, test_split


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


def minus_reference(scores: list[RunScore], run: RunScore, reference: str,
                    test_split: bool) -> intervals.Interval | None:
  """``run`` minus the ``reference`` method's run of its seed, on the same
  clients (:func:`check_same_clients`), with its interval across clients;
  ``None`` where ``run`` is the reference's or the reference has no run of
  its seed.

  Raises:
    ValueError: the two runs were not scored on the same clients.
  """
  same = next((s for s in scores if s.method == reference
               and s.seed == run.seed), None)
  if same is None or run.method == reference:
    return None
  check_same_clients(run, same, test_split)
  return run.headline(test_split).minus(same.headline(test_split))


def percent(interval: intervals.Interval | None) -> tuple[str, str, str]:
  """``(estimate, low, high)`` of ``interval`` in % with two decimals, as a
  table's CSV file holds them; ``""`` for an end it lacks (one seed or
  client: no interval), and for all three without an interval."""
  if interval is None:
    return "", "", ""
  return tuple("" if np.isnan(v) else f"{100 * v:.2f}"
               for v in (interval.mean, interval.low, interval.high))


def few_seeds_note(seeds: dict[str, int]) -> str:
  """One line saying that an interval across seeds needs at least 3
  seeds, where any of ``seeds`` (a column's name -> the seeds its interval
  across seeds rests on) has fewer: a Student-t interval with ``n - 1``
  degrees of freedom is none from 1 seed, and from 2 spans 12.71 standard
  errors either side (4.30 from 3). ``""`` when every one has 3 or more. The names are listed only
  where the columns differ."""
  few = {n: [name for name, k in seeds.items() if k == n]
         for n in (1, 2) if n in seeds.values()}
  if not few:
    return ""
  wide = ("a t-interval with 1 degree of freedom, ± "
          f"{intervals.t_quantile(1):.2f} standard errors (± "
          f"{intervals.t_quantile(2):.2f} with 3 seeds)")
  if len(set(seeds.values())) == 1:
    said = {1: "with 1 seed there is none (each run has its own, across its "
               "clients)", 2: f"with 2 seeds it is {wide}"}
  else:
    said = {n: ", ".join(names) + (" has" if len(names) == 1 else " have")
               + (" 1 seed, so no interval" if n == 1 else
                  f" 2 seeds, so {wide}") for n, names in few.items()}
  return ("An interval across seeds needs at least 3 seeds "
          "(--seeds=0,1,2): " + "; ".join(said[n] for n in few) + ".")
