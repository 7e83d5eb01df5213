"""The rounds of one run: :class:`RoundLoop`, which ``loop.run`` builds
once the directory is planned and the run built (``training.build``).

The loop is given the built run (its algorithm, its training clients and
who takes part in each round: :class:`~augfl_jax.training.experiment.
Experiment`), a loop-only config (:class:`LoopConfig`), the run's
directory and its evaluations by name (``scoring.Evaluation``, as FedJAX's
eval_fn maps); nothing of any method. It jits the round, wrapped in the
non-finite guard (``guard.keep_finite``: one program that donates the
state, where the round can be traced), runs it, scores the evaluations
that are due, writes the records, TensorBoard events and checkpoints,
stops on a signal or a non-finite value, and writes the summary at the
end; it times the run's phases (``training.phases``: its rounds, the
first with its compilation, its evaluations, its checkpoints) into
``summary.json``.

Its console lines are short (at most 100 columns; every evaluation in full
is in ``metrics.jsonl``): a line per evaluation, and at least every
:data:`LOG_SECONDS` without a live line, with the round's training loss,
the headline's accuracy and its 95% interval, the time per round (the
median of the recent rounds: neither compilation nor an evaluation
counts) and the time left; a line for each other evaluation. On a
terminal a live line (``core.progress.LiveLine``) shows every round.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from augfl_jax import algorithms, processes
from augfl_jax.core import fields, jit, tree
from augfl_jax.core.progress import LiveLine, Progress, counted
from augfl_jax.processes.signals import StopSignals
from augfl_jax.training import guard, resume, scoring
from augfl_jax.training.checkpoints import CheckpointError
from augfl_jax.training.config import to_config_json
from augfl_jax.training.events import EventWriter
from augfl_jax.training.experiment import Experiment
from augfl_jax.training.phases import Phases, eval_phase
from augfl_jax.training.plan import Plan
from augfl_jax.training.stops import NonFiniteError, RunInterrupted

__all__ = ["LoopConfig", "RoundLoop", "compiled_round"]

# Rounds are logged at evaluations, and otherwise at least this often.
LOG_SECONDS = 10.0
# What a non-finite evaluation advises to lower.
EVAL_STEP = ("eval.alpha",)


def compiled_round(algorithm: algorithms.FederatedAlgorithm
                  ) -> Callable[..., Any]:
  """``algorithm``'s round in the non-finite guard (``guard.keep_finite``),
  jitted as one program that donates the state (``core.jit.hoisted_jit``);
  a round that cannot be traced (``traceable`` False) runs as it is."""
  guarded = guard.keep_finite(algorithm)
  if not guarded.traceable:
    return guarded.round
  return jit.hoisted_jit(guarded.round, donate_first=True)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """What the loop needs of the run's plan and of ``run``'s arguments,
  and writes of them.

  Attributes:
    rounds: the last round.
    checkpoint_every: save the state every this many rounds (0: at the
      end, on a stop and before a non-finite stop only).
    live: show a live line of the rounds on the terminal
      (``core.progress.LiveLine``); the log then gets the evaluations' and
      the first round's lines only.
    lower: the fields a non-finite round advises to lower.
    record: the configuration as every checkpoint records it.
    config_json: ``config.json``: ``record`` and the sections the run
      reads (``config.to_config_json``).
    head: the first fields of ``summary.json`` (dataset, algorithm, ...).
  """

  rounds: int
  checkpoint_every: int
  live: bool
  lower: tuple[str, ...]
  record: dict[str, Any]
  config_json: dict[str, Any]
  head: dict[str, Any]

  @classmethod
  def of(cls, plan: Plan, checkpoint_every: int,
         live: bool = False) -> LoopConfig:
    """The loop's config of a run of ``plan``."""
    config = plan.config
    return cls(rounds=config.rounds, checkpoint_every=checkpoint_every,
               live=live, lower=plan.lower, record=fields.to_dict(config),
               config_json=to_config_json(config, plan.unread),
               head={"dataset": config.dataset,
                     "algorithm": config.algorithm, "model": config.model,
                     "seed": config.seed, "rounds": config.rounds})


class RoundLoop:
  """The rounds of one run after its start (a fresh run or a checkpoint).

  Args:
    experiment: the built run (``training.build``).
    config: the loop's configuration.
    run_dir: the run's directory (locked) and its checkpoints.
    evaluations: the evaluations by name, the headline first
      (``Experiment.evaluations``, and any of one's own).
    log: receives the progress lines.
    stop: the run's ``processes.signals.StopSignals``.
    phases: the run's phases, timed from its start (``training.run``'s);
      None: from now on.
  """

  def __init__(self, experiment: Experiment, config: LoopConfig,
               run_dir: resume.RunDir,
               evaluations: Mapping[str, scoring.Evaluation],
               log: Callable[[str], None], stop: StopSignals,
               phases: Phases | None = None):
    self.experiment, self.config, self.run_dir = experiment, config, run_dir
    self.phases = phases or Phases()
    self.out, self.checkpoints = run_dir.out, run_dir.checkpoints
    self.evaluations, self.log, self.stop = dict(evaluations), log, stop
    self.clients = processes.place_clients(experiment.data.train,
                                           experiment.plan.strategy)
    self.num_clients = self.clients.num_examples.shape[0]
    self.step = compiled_round(experiment.algorithm)
    self.done = 0  # the last round completed
    self.history: list[dict[str, Any]] = []
    self.change_records: list[dict[str, Any]] = []  # changes.jsonl
    self.train_losses: list[float] = []
    self.offset = self.start = 0.0
    self.saved_round = self.first_round_seconds = None
    self.events = self.metrics_file = self.live = self.progress = None
    # The evaluations of this process compile at their first call: the
    # round after it (whose time includes it) is not timed.
    self.compiling = {n for n, ev in self.evaluations.items() if ev.score}
    self.scored: set[str] = set()
    self.called: set[str] = set()  # the evaluations called this session
    self.timed, self.last_line, self.layout = True, 0.0, None

  def run(self, state: Any, resumed: resume.Resumed | None = None
         ) -> dict[str, Any]:
    """Trains from ``state`` (a fresh run) or from ``resumed`` to
    ``config.rounds``; returns the summary.

    Raises:
      OutputDirError: a file of the run could not be written (one line:
        after which round, and the newest checkpoint to resume from).
      NonFiniteError, RunInterrupted: as ``training.run``.
    """
    try:
      return self._run(state, resumed)
    except (OSError, CheckpointError) as e:
      raise resume.write_error(e, self.run_dir, self.done) from None

  def _run(self, state: Any, resumed: resume.Resumed | None
          ) -> dict[str, Any]:
    start_round, state = self._begin(state, resumed)
    # Across processes, the split state keeps its layout from round to
    # round (a checkpoint is restored into the layout it was saved from).
    self.layout = (jax.tree.map(lambda a: a.sharding, state)
                   if processes.count() > 1 else None)
    self.log(next(iter(self.evaluations.values())).legend)
    with self.events, open(self.out.file("metrics.jsonl") if self.out.writes
                           else os.devnull, "a") as self.metrics_file, \
        LiveLine(self.config.live) as self.live:
      self._score_restored(start_round, state)
      for r in range(start_round + 1, self.config.rounds + 1):
        # The round's evaluations and checkpoint are timed as theirs.
        with self.phases.timed("first_round" if r == start_round + 1
                               else "rounds"):
          state = self._round(r, state, start_round)
          self._after(r, state)
    with self.phases.timed("checkpoints"):
      self.checkpoints.wait()
    return self._finish(start_round)

  def _begin(self, state: Any, resumed: resume.Resumed | None
            ) -> tuple[int, Any]:
    """``(start round, state)``: the loop's own state from ``resumed``
    (or a fresh run's, the directory's old files removed), and the
    files of what runs now written (a resumed run may differ in
    ``resumable_fields``: rounds, strategy, the data's directory, ... and
    in the step sizes its resume changed)."""
    out, start_round, changes, records = self.out, 0, {}, []
    if resumed is not None:
      start_round, self.history, state = (resumed.round, resumed.history,
                                          resumed.state)
      self.train_losses, self.offset = resumed.train_losses, resumed.seconds
      self.phases.carry(resumed.phase_seconds)
      changes, records = resumed.changes, resumed.change_records
      self.log(f"resuming from round {start_round} "
               f"({self.checkpoints.path(start_round)})")
    else:
      out.clear_own()
      processes.sync("the run's old files are removed")
      self.checkpoints.reload()  # --overwrite removed the old steps
    out.claim()  # a run of an older version claims changes.jsonl too
    self.done = start_round
    self.change_records = resume.record_changes(out, start_round, changes,
                                                records, self.log)
    out.write_json("config.json", self.config.config_json)
    out.write_text("partition.txt", self.experiment.loaded.description + "\n")
    out.write_records("metrics.jsonl", self.history)  # none past the save
    self.start = time.perf_counter()
    self.progress = Progress(self.config.rounds, done=start_round)
    self.saved_round = None if resumed is None else start_round
    self.events = EventWriter(out.file("tb") if out.writes else None,
                              None if resumed is None else start_round + 1)
    return start_round, state

  def _due(self, round_: int) -> bool:
    """Whether any evaluation is due after ``round_``."""
    return any(ev.due(round_, self.config.rounds)
               for ev in self.evaluations.values())

  def _score_restored(self, start_round: int, state: Any) -> None:
    """A run stopped by a non-finite evaluation of its headline's round
    scores that round again (with the step size the resume changed)."""
    headline = next(iter(self.evaluations.values()))
    if (self.train_losses and headline.due(start_round, self.config.rounds)
        and all(h["round"] != start_round for h in self.history)):
      lines = self._evaluate(start_round, state)
      self._log_evaluation(
          f"round {start_round:4d}/{self.config.rounds}",
          f"(restored)  accuracy {lines[0]}", lines[1:])

  def _round(self, r: int, state: Any, start_round: int) -> Any:
    """Round ``r``: trained (a non-finite one stops the run with the
    previous state saved), its line, its evaluations; returns the state."""
    t0, rounds = time.perf_counter(), self.config.rounds
    if r == start_round + 1:
      self.log(f"round {r:4d}/{rounds}  compiling the round (its time is "
               "part of this round's) ...")
    ids = self.experiment.participants(r)
    tree.check_participants(ids, self.num_clients)
    state, metrics = self.step(state, self.clients, ids)
    if self.layout is not None:
      state = jax.device_put(state, self.layout)
    metrics, ok, flags = guard.split(metrics)
    if not bool(ok):
      self._stop_nonfinite(r - 1, state, f"round {r}: non-finite "
                           + guard.describe(processes.to_host(flags), ids,
                                            processes.to_host(metrics)),
                           self.config.lower)
    values = scoring.scalars(processes.to_host(metrics))
    loss = values["loss"]
    if self.first_round_seconds is None:
      self.first_round_seconds = time.perf_counter() - t0
    self.train_losses.append(loss)
    self.progress.step(timed=self.timed)
    self.timed = True
    if (estimate := self.progress.long_estimate("round")):
      self.log(f"the rounds will take long: {estimate}")
    self.events.scalars(values, r, "train/")
    first = r == start_round + 1
    timing = (f"{self.first_round_seconds:.2f} s (compiling included)"
              if first else self.progress.describe("round"))
    self.live.update(r / rounds, f"round {r:4d}/{rounds}  loss {loss:.4f}  "
                     f"{timing}")
    self.done = r
    self._log_round(r, state, values, timing, first)
    return state

  def _log_round(self, r: int, state: Any, values: dict[str, float],
                 timing: str, first: bool) -> None:
    """Round ``r``'s line (its loss, of ``values``, and ``timing``; a
    ``first`` round's always), with its evaluations where they are due,
    else at least every :data:`LOG_SECONDS` without a live line."""
    head = f"round {r:4d}/{self.config.rounds}"
    loss = f"loss {values['loss']:.4f}"
    if self._due(r):
      texts = self._evaluate(r, state, train=values)
      self.timed = not self.compiling & self.scored
      self.compiling -= self.scored
      self._log_evaluation(head, f"{loss}  accuracy {texts[0]}  {timing}",
                           texts[1:])
      self.last_line = time.perf_counter()
    elif first or not self.config.live and (
        time.perf_counter() - self.last_line >= LOG_SECONDS):
      self.log(f"{head}  {loss}  {timing}")
      self.last_line = time.perf_counter()

  def _after(self, r: int, state: Any) -> None:
    """After round ``r``: its checkpoint when one is due; a signal to any
    process stops every process, the state saved."""
    rounds = self.config.rounds
    every = self.config.checkpoint_every
    if every and r % every == 0 or r == rounds:
      with self.phases.timed("checkpoints"):
        if self.out.writes:
          os.fsync(self.metrics_file.fileno())
        self._save(r, state)
      self.saved_round = r
    signum = processes.agree(self.stop.signum or 0) or None
    if signum is not None and r < rounds:
      path = self._saved(r, state)
      raise RunInterrupted(
          f"{signal.Signals(signum).name} after round {r}/{rounds}"
          + ("" if self.stop.signum else " (received by another process)")
          + f": the run state is saved in {path}, where a resumed run "
          "continues", signum, r, path)

  def _save(self, round_: int, state: Any) -> str:
    self.events.flush()
    return self.checkpoints.save(round_, state, {
        "round": round_, "config": self.config.record,
        "pending_train_losses": self.train_losses, "records": self.history,
        "changes": self.change_records,
        "data_digest": self.experiment.loaded.digest,
        "seconds": self.offset + time.perf_counter() - self.start,
        "phase_seconds": self.phases.seconds()})

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

  def _log_evaluation(self, head: str, rest: str, more: list[str]) -> None:
    """Logs an evaluation's line, ``head`` (``round   10/300``) and
    ``rest``, then each of ``more`` (the other evaluations' words) on a
    line of its own under the same ``head``."""
    self.log(f"{head}  {rest}")
    for text in more:
      self.log(f"{head}  {text}")

  def _evaluate(self, r: int, state: Any,
                train: dict[str, float] | None = None) -> list[str]:
    """Scores, after round ``r``, the headline and every other evaluation
    that is due: a record in the history, ``metrics.jsonl`` and the
    events. Returns their words, the headline's first (its accuracy, for
    the round's line). ``train``: round ``r``'s scalar training metrics,
    kept in the record as ``train``."""
    record = {"round": r, "mean_train_loss": float(np.mean(
        self.train_losses))}
    texts, scored = [], set()
    for name, ev in self.evaluations.items():
      if ev.score is None or texts and not ev.due(r, self.config.rounds):
        continue
      with self.phases.timed(eval_phase(name, name not in self.called)):
        self.called.add(name)
        t0 = time.perf_counter()
        metrics = ev.score(state)
        self._check_finite(r, state, ev, metrics)
        if texts:
          record[name] = ev.record(metrics)
          texts.append(
              f"{ev.text(metrics)} ({time.perf_counter() - t0:.1f} s)")
        else:  # the headline
          record.update(ev.record(metrics))
          record.update({} if train is None else {"train": train})
          texts.append(ev.text(metrics))
        self.events.scalars(scoring.finite(ev.events(metrics)), r, "eval/")
      scored.add(name)
    record["seconds"] = self.offset + time.perf_counter() - self.start
    self.train_losses = []
    self.history.append(record)
    self.metrics_file.write(self.out.record_line(record))
    self.metrics_file.flush()
    self.scored = scored
    return texts

  def _check_finite(self, r: int, state: Any, ev: scoring.Evaluation,
                    metrics: scoring.Metrics) -> None:
    """Stops the run, round ``r``'s state saved, where an evaluation's
    numbers are not finite."""
    bad = {k: v for k, v in scoring.scalars(metrics).items()
           if not np.isfinite(v)}
    if bad:
      self._stop_nonfinite(r, state, f"round {r}: non-finite evaluation of "
                           f"{ev.clients} (" + ", ".join(
                               f"{k} = {v}" for k, v in bad.items()) + ")",
                           EVAL_STEP)

  def _finish(self, start_round: int) -> dict[str, Any]:
    """Writes ``summary.json`` and logs the final lines."""
    out, rounds = self.out, self.config.rounds
    session = time.perf_counter() - self.start
    first, rounds_done = self.first_round_seconds, rounds - start_round
    phase_seconds = self.phases.seconds()
    summary = scoring.summary(self.config.head, self.history,
                              self.evaluations, {
        "seconds": self.offset + session, "first_round_seconds": first,
        "seconds_per_round": ((session - first) / (rounds_done - 1)
                              if rounds_done > 1 else session),
        "resumed_from_round": start_round, "phase_seconds": phase_seconds,
        "wall_seconds": round(sum(phase_seconds.values()), 3)})
    if self.change_records:
      summary["resume_changes"] = self.change_records
    out.write_json("summary.json", summary)
    final = self.history[-1]
    for i, (name, ev) in enumerate(self.evaluations.items()):
      scored = final if i == 0 else final.get(name)
      if scored is not None:
        self.log(f"final {ev.title} accuracy "
                 f"{scoring.format_record(scored)}" + (
                     f", {counted(rounds, 'round')} in "
                     f"{self.offset + session:.1f} s" if i == 0 else ""))
    self.log(f"results in {out.path} (summary.json; every evaluation in "
             "full: metrics.jsonl)")
    return summary
