"""The rounds of one run: :class:`RoundLoop`, which ``loop.run`` builds
once the directory is planned and the algorithm built.

The loop knows a built algorithm (its round, and whether that round can be
traced into the non-finite guard: ``FederatedAlgorithm.traceable``), a
loop-only config (:class:`LoopConfig`), the run's scorers
(``scoring.Scorers``) and who takes part in each round; nothing of any
method. It runs the guarded rounds, scores the clients, writes the records,
TensorBoard events and checkpoints, stops on a signal or a non-finite
value, and writes the summary at the end.

Its console lines are short (at most 100 columns; every evaluation in full
is in ``metrics.jsonl``): a line per evaluation, and at least every
:data:`LOG_SECONDS` without a live line, with the round's training loss,
the held-out clients' accuracy and its 95% interval, the time per round
(the median of the recent rounds: neither compilation nor an evaluation
counts) and the time left; a second line for the test-split clients. On a
terminal a live line (``core.progress.LiveLine``) shows every round.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any, Callable

import jax
import numpy as np

from augfl_jax import processes
from augfl_jax.core import fields, tree
from augfl_jax.core.progress import LiveLine, Progress, counted
from augfl_jax.training import resume as resuming
from augfl_jax.training import scoring
from augfl_jax.training.checkpoints import CheckpointError
from augfl_jax.training.config import (RunConfig, fields_to_lower,
                                       to_config_json)
from augfl_jax.training.events import EventWriter
from augfl_jax.training.guard import (NonFiniteError, RunInterrupted,
                                       describe, guard_round)

__all__ = ["LoopConfig", "RoundLoop", "committed", "partial",
           "sample_participants"]

# Rounds are logged at evaluations, and otherwise at least this often.
LOG_SECONDS = 10.0


def partial(clients_per_round: int, num_clients: int) -> bool:
  """Whether rounds take a subset of the ``num_clients`` clients."""
  return clients_per_round not in (0, num_clients)


def sample_participants(seed: int, round_: int, num_clients: int,
                        clients_per_round: int) -> np.ndarray | None:
  """The clients taking part in ``round_``: ``clients_per_round`` of them,
  uniformly without replacement, reproducible from (seed, round); ``None``
  (everyone) when all take part (``clients_per_round`` 0 or ``C``)."""
  if not partial(clients_per_round, num_clients):
    return None
  rng = np.random.default_rng([seed, round_])
  return np.sort(rng.choice(num_clients, clients_per_round, replace=False))


def committed(state: Any) -> Any:
  """On one device, ``state`` committed to it: a round's outputs are, and
  jit compiles again for committed inputs after uncommitted ones."""
  if jax.device_count() != 1:
    return state
  return jax.device_put(state, jax.devices()[0])


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """What the loop needs of the run's configuration, and writes of it.

  Attributes:
    rounds: the last round.
    eval_every: score the held-out clients every this many rounds.
    test_split_every: score the test-split clients every this many rounds
      too (0: after the last round only).
    checkpoint_every: save the state every this many rounds (0: at the
      end, on a stop and before a non-finite stop only).
    lower: the fields a non-finite round advises to lower.
    record: the configuration as every checkpoint records it.
    config_json: ``config.json``: ``record`` and the sections the run
      reads (``config.to_config_json``).
    head: the first fields of ``summary.json`` (dataset, algorithm, ...).
  """

  rounds: int
  eval_every: int
  test_split_every: int
  checkpoint_every: int
  lower: tuple[str, ...]
  record: dict[str, Any]
  config_json: dict[str, Any]
  head: dict[str, Any]

  @classmethod
  def of(cls, config: RunConfig, checkpoint_every: int,
         unread: tuple[str, ...] | None = None) -> LoopConfig:
    """The loop's config of a run of ``config`` whose sections ``unread``
    it never reads (``Plan.unread``; default: ``unread_sections``)."""
    return cls(rounds=config.rounds, eval_every=config.eval_every,
               test_split_every=config.eval.test_split_every,
               checkpoint_every=checkpoint_every,
               lower=fields_to_lower(config), record=fields.to_dict(config),
               config_json=to_config_json(config, unread),
               head={"dataset": config.dataset,
                     "algorithm": config.algorithm, "model": config.model,
                     "seed": config.seed, "rounds": config.rounds})

  def scores_test_split(self, round_: int) -> bool:
    every = self.test_split_every
    return round_ == self.rounds or bool(every and round_ % every == 0)

  def evaluates(self, round_: int) -> bool:
    return round_ % self.eval_every == 0 or self.scores_test_split(round_)


class RoundLoop:
  """The rounds of one run after its start (a fresh run or a checkpoint).

  Args:
    loop: the loop's configuration.
    out: the run's ``outputs.OutputDir`` (locked).
    checkpoints: its ``checkpoints.RunCheckpoints``.
    algo: the built algorithm.
    clients: the training clients (``ClientData``, leaves ``[C, ...]``).
    scorers: the run's evaluations.
    participants: ``participants(round) -> [K] ids | None`` (None: all);
      ids are checked as they are drawn.
    log: receives the progress lines.
    stop: the run's ``processes.signals.StopSignals``.
    description: ``partition.txt``.
    digest: the data's digest, recorded in every checkpoint.
    live: show a live line of the rounds on the terminal
      (``core.progress.LiveLine``); the log then gets the evaluations' and
      the first round's lines only.
  """

  def __init__(self, loop: LoopConfig, out, checkpoints, algo, clients,
               scorers: scoring.Scorers,
               participants: Callable[[int], np.ndarray | None],
               log: Callable[[str], None], stop, description: str,
               digest: str, live: bool = False):
    self.live = live
    self.loop, self.out, self.checkpoints = loop, out, checkpoints
    self.algo, self.clients, self.scorers = algo, clients, scorers
    self.participants, self.log, self.stop = participants, log, stop
    self.description, self.digest = description, digest
    self.num_clients = clients.num_examples.shape[0]
    self.done = 0  # the last round completed
    self.history: list[dict[str, Any]] = []
    self.change_records: list[dict[str, Any]] = []  # changes.jsonl
    self.train_losses: list[float] = []
    self.offset, self.start, self.saved_round = 0.0, 0.0, None
    self.events = None

  def run(self, state: Any, resumed: resuming.Resumed | None,
          start_round: int = 0) -> dict[str, Any]:
    """Trains from ``resumed`` (``None``: from ``start_round``, a fresh
    run) to ``loop.rounds``; returns the summary.

    Raises:
      OutputDirError: a file of the run could not be written (one line:
        after which round, and the newest checkpoint to resume from).
      NonFiniteError, RunInterrupted: as ``training.run``.
    """
    try:
      return self._run(state, resumed, start_round)
    except (OSError, CheckpointError) as e:
      raise resuming.write_error(e, self.out, self.checkpoints,
                                 self.done) from None

  def _run(self, state, resumed, start_round):
    loop, out = self.loop, self.out
    changes = {}
    if resumed is not None:
      start_round, self.history = resumed.round, resumed.history
      state = committed(resumed.state)
      self.train_losses, self.offset = resumed.train_losses, resumed.seconds
      changes = resumed.changes
      self.log(f"resuming from round {start_round} "
               f"({self.checkpoints.path(start_round)})")
      out.claim()  # a run of an older version claims changes.jsonl too
    else:
      out.clear_own()
      processes.sync("the run's old files are removed")
      self.checkpoints.reload()  # --overwrite removed the old steps
      out.claim()
    self.done = start_round
    self.change_records = resuming.record_changes(
        out, start_round, changes,
        resumed.change_records if resumed is not None else [], self.log)
    # What runs now (a resumed run may differ in resumable_fields: rounds,
    # strategy, the data's directory, ... and in the changes above).
    out.write_json("config.json", loop.config_json)
    out.write_text("partition.txt", self.description + "\n")
    out.write_records("metrics.jsonl", self.history)  # none past the save
    step = guard_round(self.algo.round, self.num_clients,
                       fused=self.algo.traceable)
    self.start = time.perf_counter()
    progress = Progress(loop.rounds, done=start_round)
    self.saved_round = None if resumed is None else start_round
    first_round_seconds, last_line = None, 0.0
    # The evaluations of this process compile at their first call: the
    # round after it (whose time includes it) is not timed.
    compiling = {"heldout", "test_split"}
    timed = True
    self.events = EventWriter(out.file("tb") if out.writes else None,
                              None if resumed is None else start_round + 1)
    # Across processes, the split state keeps its layout from round to
    # round (a checkpoint is restored into the layout it was saved from).
    layout = (jax.tree.map(lambda a: a.sharding, state)
              if processes.count() > 1 else None)
    clients = len(self.scorers.heldout_counts)
    self.log("accuracy: " + (
        f"the {clients} held-out clients' test-client accuracy (%), mean "
        "[95% CI across them]" if clients > 1 else "the held-out client's "
        "test-client accuracy (%); 1 client, no interval"))
    with self.events, open(out.file("metrics.jsonl") if out.writes
                           else os.devnull, "a") as metrics_file, LiveLine(
                               self.live) as live:
      if (self.train_losses and (start_round % loop.eval_every == 0 or
                                 start_round == loop.rounds) and
          all(h["round"] != start_round for h in self.history)):
        # Stopped by a non-finite evaluation: its round is scored again
        # (with the step size the resume changed).
        accuracy, split = self._evaluate(start_round, state, metrics_file)
        self._log_evaluation(f"round {start_round:4d}/{loop.rounds}",
                             f"(restored)  accuracy {accuracy}", split)
      for r in range(start_round + 1, loop.rounds + 1):
        t0 = time.perf_counter()
        if r == start_round + 1:
          self.log(f"round {r:4d}/{loop.rounds}  compiling the round (its "
                   "time is part of this round's) ...")
        ids = self.participants(r)
        tree.check_participants(ids, self.num_clients)
        state, metrics, ok, flags = step(state, self.clients, ids)
        if layout is not None:
          state = jax.device_put(state, layout)
        if not bool(ok):
          self._stop_nonfinite(r - 1, state, f"round {r}: non-finite "
                               + describe(processes.to_host(flags), ids,
                                          processes.to_host(metrics)),
                               loop.lower)
        values = scoring.scalars(processes.to_host(metrics))
        loss = values["loss"]
        if first_round_seconds is None:
          first_round_seconds = time.perf_counter() - t0
        self.train_losses.append(loss)
        progress.step(timed=timed)
        timed = True
        if (estimate := progress.long_estimate("round")):
          self.log(f"the rounds will take long: {estimate}")
        self.events.scalars(values, r, "train/")
        head = f"round {r:4d}/{loop.rounds}"
        timing = (f"{first_round_seconds:.2f} s (compiling included)"
                  if r == start_round + 1 else progress.describe("round"))
        live.update(r / loop.rounds, f"{head}  loss {loss:.4f}  {timing}")
        evaluating = loop.evaluates(r)
        self.done = r
        if evaluating:
          accuracy, split = self._evaluate(r, state, metrics_file,
                                           train=values)
          scored = {"heldout"} | ({"test_split"} if split else set())
          timed, compiling = not compiling & scored, compiling - scored
          self._log_evaluation(head, f"loss {loss:.4f}  accuracy "
                               f"{accuracy}  {timing}", split)
          last_line = time.perf_counter()
        elif r == start_round + 1 or not self.live and (
            time.perf_counter() - last_line >= LOG_SECONDS):
          self.log(f"{head}  loss {loss:.4f}  {timing}")
          last_line = time.perf_counter()
        if (loop.checkpoint_every and r % loop.checkpoint_every == 0 or
            r == loop.rounds):
          if out.writes:
            os.fsync(metrics_file.fileno())
          self._save(r, state)
          self.saved_round = r
        # Across processes, a signal to any of them stops all after round r.
        signum = processes.agree(self.stop.signum or 0) or None
        if signum is not None and r < loop.rounds:
          path = self._saved(r, state)
          raise RunInterrupted(
              f"{signal.Signals(signum).name} after round {r}/"
              f"{loop.rounds}" + ("" if self.stop.signum else
                                  " (received by another process)")
              + f": the run state is saved in {path}, where a resumed run "
              "continues", signum, r, path)
    self.checkpoints.wait()
    return self._finish(start_round, first_round_seconds)

  def _save(self, round_: int, state: Any) -> str:
    self.events.flush()
    return self.checkpoints.save(round_, state, {
        "round": round_, "config": self.loop.record,
        "pending_train_losses": self.train_losses, "records": self.history,
        "changes": self.change_records, "data_digest": self.digest,
        "seconds": self.offset + time.perf_counter() - self.start})

  def _saved(self, round_: int, state: Any) -> str:
    """The path of round ``round_``'s checkpoint, on disk: saved now unless
    it is saved already."""
    path = (self._save(round_, state) if self.saved_round != round_ else
            self.checkpoints.path(round_))
    self.checkpoints.wait()
    return path

  def _stop_nonfinite(self, good: int, state: Any, what: str,
                      names: tuple[str, ...]) -> None:
    path = self._saved(good, state)
    advice = (" ".join(f"--{n}=<smaller>" for n in names) +
              f" --resume_changes={','.join(names)}" if names else
              "and the step sizes it uses, smaller, named in "
              "--resume_changes")
    raise NonFiniteError(
        f"{what}. Stopped; the last good state (round {good}) is in {path}."
        f" Continue it with --resume {advice}; or check those clients' "
        "data")

  def _log_evaluation(self, head: str, rest: str, split: str | None
                     ) -> None:
    """Logs an evaluation's line, ``head`` (``round   10/300``) and
    ``rest``, then its test-split ``split`` (if any) on a line of its
    own under the same ``head``."""
    self.log(f"{head}  {rest}")
    if split is not None:
      self.log(f"{head}  {split}")

  def _evaluate(self, r: int, state: Any, metrics_file,
                train: dict[str, float] | None = None
               ) -> tuple[str, str | None]:
    """Scores the held-out clients after round ``r`` (and the test-split
    clients after the last round and every ``test_split_every``): a record
    in the history, ``metrics.jsonl`` and the events. Returns the held-out
    clients' accuracy for the round's line (``scoring.accuracy_text``) and
    the test-split clients' words (``None`` when they were not scored).
    ``train``: round ``r``'s scalar training metrics, kept in the record as
    ``train``."""
    ev = self.scorers.heldout(state)
    values = scoring.scalars(ev)
    if not all(np.isfinite(v) for v in values.values()):
      self._stop_nonfinite(r, state, f"round {r}: non-finite evaluation of "
                           "the held-out clients (" + ", ".join(
                               f"{k} = {v}" for k, v in values.items()
                               if not np.isfinite(v)) + ")", ("eval.alpha",))
    interval = ev["accuracy_interval"]
    record = scoring.heldout_record(ev, self.scorers.heldout_counts,
                                    self.scorers.heldout_digest, r,
                                    self.train_losses)
    if train is not None:
      record["train"] = train
    split_text = None
    if self.scorers.test_split is not None and (
        self.loop.scores_test_split(r)):
      t0 = time.perf_counter()
      split = self.scorers.test_split(state)
      if not all(np.isfinite(split[k]) for k in ("accuracy", "loss")):
        self._stop_nonfinite(r, state, f"round {r}: non-finite evaluation "
                             "of the test-split clients (loss = "
                             f"{split['loss']})", ("eval.alpha",))
      record["test_split"] = scoring.test_split_record(
          split, self.scorers.test_split_digest)
      self.events.scalars(scoring.finite({
          "test_split_accuracy": split["accuracy"],
          "test_split_accuracy_ci_low": split["accuracy_interval"].low,
          "test_split_accuracy_ci_high": split["accuracy_interval"].high}),
                          r, "eval/")
      clients = record["test_split"]["clients"]
      split_text = (
          f"test-split accuracy {scoring.accuracy_text(split['accuracy_interval'])}"
          + (f" across {clients} clients" if clients > 1 else "")
          + f" ({time.perf_counter() - t0:.1f} s)")
    record["seconds"] = self.offset + time.perf_counter() - self.start
    self.train_losses = []
    self.history.append(record)
    metrics_file.write(self.out.record_line(record))
    metrics_file.flush()
    self.events.scalars(scoring.finite(
        {k: values[k] for k in ("accuracy", "accuracy_std", "loss")}
        | {"accuracy_ci_low": interval.low,
           "accuracy_ci_high": interval.high}), r, "eval/")
    return scoring.accuracy_text(interval), split_text

  def _finish(self, start_round: int, first_round_seconds: float | None
             ) -> dict[str, Any]:
    """Writes ``summary.json`` and logs the final line."""
    out, loop = self.out, self.loop
    session = time.perf_counter() - self.start
    rounds_done = loop.rounds - start_round
    summary = scoring.summary(
        loop.head, self.history, self.scorers.test_split_summary, {
            "seconds": self.offset + session,
            "first_round_seconds": first_round_seconds,
            "seconds_per_round": (
                (session - first_round_seconds) / (rounds_done - 1)
                if rounds_done > 1 else session),
            "resumed_from_round": start_round})
    if self.change_records:
      summary["resume_changes"] = self.change_records
    out.write_json("summary.json", summary)
    final = self.history[-1]
    self.log(f"final test-client accuracy {scoring.format_record(final)}, "
             f"{counted(loop.rounds, 'round')} in "
             f"{self.offset + session:.1f} s")
    if "test_split" in final:
      self.log("final test-split accuracy "
               f"{scoring.format_record(final['test_split'])}")
    self.log(f"results in {out.path} (summary.json; every evaluation in "
             "full: metrics.jsonl)")
    return summary
