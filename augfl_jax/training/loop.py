"""One federated training run: :func:`run`.

``run(config, output_dir)`` trains ``config.algorithm``, scores the held-out
clients every ``config.eval_every`` rounds and writes to ``output_dir``:

* ``config.json``: the resolved configuration (every default filled in),
  with ``read_sections``, the sections the run reads
  (``config.to_config_json``);
* ``partition.txt``: the files read, the partition, the server split;
* ``metrics.jsonl``: one JSON object per evaluation (round, mean training
  loss since the last one, test-client accuracy mean/std across clients and
  per client, test loss, seconds since the start);
* ``tb/``: TensorBoard events (``train/*`` every round, ``eval/*``);
* ``checkpoints/step_<round>/``: the newest two run states (orbax), every
  ``checkpoint_every`` rounds, at the end, on SIGINT/SIGTERM and before
  stopping on a non-finite round or evaluation;
* ``summary.json``: final and best accuracy, timings: ``seconds`` (the
  rounds' time, from the first round's start), ``phase_seconds`` (where
  the run's wall time went, by phase, summing to ``wall_seconds``: setup,
  the PM, the first round with its compilation, the other rounds, the
  evaluations, the checkpoints; ``training.phases``);
* ``changes.jsonl``: the step sizes a resumed run changed
  (``resume_changes``), one record per such resume.

What a run guarantees (docs/guarantees.md): one writer per
directory (a lock), no file it did not write is ever removed or reused,
JSON files are replaced atomically, checkpoints are verified on restore
(the previous one is used, with a message, when the newest is damaged),
and resuming is exact: ``R`` rounds straight and ``k`` + resume + ``R - k``
give the same state bit for bit (same device, strategy and conv_impl).

Across processes (``processes.group.initialize`` before ``run``, in
every process; ``experiments.run --distributed.*``) the client axis runs
sharded over every process's devices, each process holds its own
training clients, process 0 alone takes the lock and writes these files
and ``log``, and every process saves its own part of each checkpoint.
Before the directory is touched the processes agree on the configuration,
the run control and the directory, then on the data they loaded
(``processes.group.agree_on``); a difference stops them all in one line.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from typing import Any, Callable, Sequence

import jax

from augfl_jax import data, processes
from augfl_jax.core import fields, tree
from augfl_jax.core.progress import counted
from augfl_jax.pm import pretrain
from augfl_jax.processes import group
from augfl_jax.processes.signals import StopSignals
from augfl_jax.storage import checkpoint
from augfl_jax.training import experiment
from augfl_jax.training import resume as resuming
from augfl_jax.training.checkpoints import RunCheckpoints
from augfl_jax.training.config import RunConfig
from augfl_jax.training.experiment import (Experiment, TransformData,
                                           sample_participants)
from augfl_jax.training.outputs import OutputDir, PeerOutputDir
from augfl_jax.training.phases import Phases
from augfl_jax.training.plan import Plan, prepare
from augfl_jax.training.rounds import LoopConfig, RoundLoop
from augfl_jax.training.stops import NonFiniteError, RunInterrupted

__all__ = ["run", "CHECKPOINT_EVERY", "NonFiniteError", "RunInterrupted",
           "sample_participants", "shows_live_line"]

CHECKPOINT_EVERY = 50
Log = Callable[[str], None]


def run(config: RunConfig | Plan, output_dir: str,
        log: Callable[[str], None] = print, *,
        checkpoint_every: int = CHECKPOINT_EVERY, resume: bool = False,
        overwrite: bool = False, resume_changes: Sequence[str] = (),
        transform_data: TransformData | None = None,
        live: bool | None = None) -> dict[str, Any]:
  """Trains ``config.algorithm`` and scores it on the held-out clients.

  Args:
    config: the run's configuration (resolved and checked here: its
      :class:`Plan`), or the plan ``training.prepare`` made of it.
    output_dir: where the run's files go (module docstring).
    log: receives the progress lines (each at most 100 columns during the
      rounds; every evaluation in full is in ``metrics.jsonl``).
    checkpoint_every: save the run state every this many rounds and at the
      end; 0: only at the end, on a signal and before a non-finite stop.
    resume: continue from ``output_dir``'s newest readable checkpoint (its
      configuration may differ only in ``resumable_fields`` and
      ``resume_changes``; a larger ``rounds`` trains further; a finished
      run's ``config.json``, ``metrics.jsonl``, ``changes.jsonl`` and
      ``summary.json`` that are not what its checkpoint sealed are written
      again from it).
    overwrite: replace the run ``output_dir`` holds (only its own files).
    resume_changes: dotted names of step sizes, or AugFL's lam
      (``resume_changes``), that this resumed run may change, e.g.
      ``("fedavg.lr",)`` after a non-finite round; each change is logged
      and recorded in ``changes.jsonl``.
    transform_data: applied to the federated data before training (tests
      put a NaN into a client; ``experiments.ood`` swaps in rotated
      domains); returns the data, or ``(data, description)``.
    live: a live line of the rounds at the bottom of the terminal
      (``core.progress.LiveLine``), above which ``log``'s lines scroll,
      which then gets the evaluations' lines only (not one every 10 s).
      ``None``: shown where ``log`` is ``print`` (the default) and
      standard output is a terminal (:func:`shows_live_line`); a ``log``
      of one's own gets its lines as before.

  Returns:
    The summary, also written to ``summary.json``.

  Raises:
    ValueError: a bad configuration, or an output directory that holds
      another run, is in use or cannot be written (before any work); a
      file of the run that cannot be written during the run
      (``OutputDirError``, one line with the newest checkpoint).
    NonFiniteError: a round or an evaluation produced a NaN or inf.
    RunInterrupted: SIGINT/SIGTERM.
  """
  phases = Phases()  # the run's wall time starts here
  plan = config if isinstance(config, Plan) else prepare(config)
  control = resuming.RunControl(checkpoint_every, resume, overwrite,
                                tuple(resume_changes))
  loaded = None
  if processes.count() > 1:  # before anything is read or written
    _agree_on_flags(plan, output_dir, control)
  resuming.check_run_control(plan, control)
  _check_pm_outside(plan, output_dir)
  if processes.count() > 1:  # process 0 writes; all run the client axis
    plan, log, live, loaded = _across_processes(plan, log, live,
                                                transform_data)
  out = (OutputDir if processes.is_writer() else PeerOutputDir)(output_dir)
  created = not os.path.exists(output_dir)
  out.check_writable()
  loop_config = LoopConfig.of(plan, checkpoint_every,
                              shows_live_line(log, live))
  with out.lock(remove_if_unused=created), StopSignals() as stop:
    processes.sync("the run directory is locked")
    checkpoints = RunCheckpoints(out.file("checkpoints"))
    run_dir = resuming.RunDir(out, checkpoints)
    try:
      checkpoints.remove_unfinished_saves()  # this run holds the lock
      summary = _LockedRun(plan, run_dir, control, loop_config, log, stop,
                           phases).train(lambda: loaded or experiment.load(
                               plan, transform_data))
    except BaseException:
      # A save in flight completes even when an exception stops the run;
      # its own failure, if any, is not reported over the one propagating.
      checkpoints.close(quiet=True)
      raise
    checkpoints.close()
    return summary


def _across_processes(plan: Plan, log: Log, live: bool | None,
                      transform_data: TransformData | None):
  """``(plan, log, live, loaded)`` of a run across processes, before its
  directory is touched: its PM pretrained already, its client axis over
  every process's devices, the log of process 0 alone, and its data
  loaded (``transform_data`` applied) and agreed on."""
  if _pretrains_pm(plan):
    # Saving a checkpoint is a collective of every process (orbax): one
    # process cannot save the PM while the others wait for it.
    raise ValueError(
        f"a run across processes does not pretrain its PM, and "
        f"{plan.config.pm.dir} holds none: pretrain it first, in one "
        "process, with python -m experiments.pretrain_pm and the run's "
        "flags (or run the run once in one process)")
  plan = dataclasses.replace(
      plan, strategy=processes.run_strategy(plan.strategy))
  if not processes.is_writer():
    log, live = (lambda line: None), False
  log(f"client axis: {processes.describe(plan.strategy)}")
  loaded = experiment.load(plan, transform_data)  # agreed before the
  _agree_on_data(plan, loaded.data)              # directory is touched
  return plan, log, live, loaded


def _agree_on_flags(plan: Plan, output_dir: str,
                    control: resuming.RunControl) -> None:
  """Across processes: every process runs the same configuration (but
  ``data.data_dir``, where its host keeps the files, which
  :func:`_agree_on_data` checks by their contents; and the sections the
  run does not read), with the same run control, into the same directory;
  otherwise a ``ValueError`` naming the flags that differ, in every
  process."""
  ignored = plan.unused + ("data.data_dir",)
  record = {f"--{name}": str(value)
            for name, _, _, value in fields.walk(plan.config)
            if not any(name == i or name.startswith(i + ".")
                       for i in ignored)}
  record.update({"--checkpoint_every": str(control.checkpoint_every),
                 "--resume": str(control.resume),
                 "--overwrite": str(control.overwrite),
                 "--resume_changes": ",".join(control.resume_changes),
                 "--output_dir": os.path.abspath(output_dir)})
  differ = group.agree_on("flags", record)
  if differ:
    raise ValueError(
        f"the {processes.count()} processes of the run were given different "
        f"flags ({'; '.join(differ)}): give every process the same flags, "
        "each its own --distributed.process_id; nothing was written")


def _agree_on_data(plan: Plan, fed: data.FederatedData) -> None:
  """Across processes: every process read the same data (the digests of
  the partition's clients and of the server split); otherwise a
  ``ValueError`` naming the parts that differ, in every process."""
  parts = {"training clients": fed.train, "held-out clients": fed.test,
           "server split": fed.server,
           "test-split clients": None if fed.test_split is None
           else fed.test_split.clients}
  differ = group.agree_on(
      "data", {f"the {name}' digest" if name.endswith("s") else
               f"the {name}'s digest": tree.digest(part)[:12]
               for name, part in parts.items()})
  if differ:
    raise ValueError(
        f"the {processes.count()} processes of the run read different data "
        f"({'; '.join(differ)}): give every process the same dataset files "
        f"(this process read {plan.location.describe()}) and the same "
        "flags; nothing was written")


def shows_live_line(log: Callable[[str], None], live: bool | None) -> bool:
  """``live``, or for ``None`` whether ``log`` is ``print`` and standard
  output is a terminal (not a log file, a pipe or a notebook)."""
  if live is not None:
    return live
  isatty = getattr(sys.stdout, "isatty", None)
  return log is print and bool(isatty and isatty())


def _check_pm_outside(plan: Plan, output_dir: str) -> None:
  """Raises ``ValueError`` where the run's PM directory lies inside its
  output directory: the run directory holds only the run's own files, so
  every later run there (a rerun, ``--resume``) would be refused."""
  if plan.pm_role == "none":
    return
  pm_dir = os.path.realpath(plan.config.pm.dir)
  run_dir = os.path.realpath(output_dir)
  if os.path.commonpath([pm_dir, run_dir]) == run_dir:
    raise ValueError(
        f"--pm.dir {plan.config.pm.dir} lies inside --output_dir "
        f"{output_dir}, which holds only the run's own files (a rerun or "
        "--resume would refuse it): put the PM beside the run, e.g. "
        f"--pm.dir={os.path.join(os.path.dirname(run_dir), 'pm')}")


def _pretrains_pm(plan: Plan) -> bool:
  """Whether the run needs a PM and none is saved in ``pm.dir`` yet (the
  run pretrains it)."""
  return plan.pm_role != "none" and not checkpoint.exists(plan.config.pm.dir)


class _LockedRun:
  """One run, its directory locked: where it starts, its data checked
  against the checkpoint it resumes, the run built (``training.build``),
  its state, and the rounds (``rounds.RoundLoop``); ``phases`` times it
  from the run's start (``training.phases``)."""

  def __init__(self, plan: Plan, run_dir: resuming.RunDir,
               control: resuming.RunControl, loop_config: LoopConfig,
               log: Log, stop: StopSignals, phases: Phases):
    self.plan, self.run_dir, self.control = plan, run_dir, control
    self.loop_config, self.log, self.stop = loop_config, log, stop
    self.phases = phases

  def train(self, load: Callable[[], experiment.Loaded]) -> dict[str, Any]:
    """Trains (or, a finished run, reports) the run; its data from
    ``load()``, unless it is finished already; returns the summary."""
    plan, (out, checkpoints) = self.plan, self.run_dir
    resumed_from = resuming.find_start(plan, self.run_dir, self.control,
                                       self.log)
    if resumed_from is not None and resumed_from == plan.config.rounds:
      # A finished run: its files are written again from the checkpoint
      # where they are not what it sealed (torn, or another run's).
      differ = resuming.differing_files(out,
                                        checkpoints.read_meta(resumed_from))
      if not differ:
        return self._done()
      self.log(f"{out.path}: {'; '.join(differ)}: written again from "
               f"{checkpoints.path(resumed_from)}")
    built = self._build(self._checked(load(), resumed_from), resumed_from)
    loop = RoundLoop(built, self.loop_config, self.run_dir,
                     built.evaluations(), self.log, self.stop, self.phases)
    if resumed_from is None:
      return loop.run(built.start())
    with self.phases.timed("checkpoints"):
      restored = built.restore(checkpoints, self.log)
    return loop.run(None, resuming.resumed(
        plan, self.run_dir, restored, self.control.resume_changes, self.log))

  def _done(self) -> dict[str, Any]:
    """The summary of the finished run the directory holds, said so."""
    out, rounds = self.run_dir.out, self.plan.config.rounds
    self.log(f"the run in {out.path} has done its "
             f"{counted(rounds, 'round')}: nothing to train; its summary is "
             f"{out.file('summary.json')} (a larger --rounds " + (
                 "continues it" if self.control.resume else "with --resume "
                 "continues it, --overwrite starts it again") + ")")
    return out.read_json("summary.json")

  def _checked(self, loaded: experiment.Loaded, resumed_from: int | None
              ) -> experiment.Loaded:
    """``loaded``, checked before anything compiles: the clients of a
    round against the training clients and the devices, and the data
    against those of the checkpoint it resumes; its description logged."""
    config, checkpoints = self.plan.config, self.run_dir.checkpoints
    num_clients = loaded.data.train.num_clients
    if config.clients_per_round > num_clients:
      raise ValueError(f"--clients_per_round={config.clients_per_round} is "
                       f"more than the {num_clients} training clients")
    if processes.count() > 1 and num_clients % jax.device_count():
      raise ValueError(
          f"the {num_clients} training clients cannot be split evenly over "
          f"the {jax.device_count()} devices of the {processes.count()} "
          "processes; choose --data.num_clients or the devices per process "
          "so that they divide the training clients")
    if resumed_from is not None:  # before the PM and the algorithm are built
      resuming.check_data(checkpoints.read_meta(resumed_from),
                          loaded.digest, checkpoints.path(resumed_from),
                          self.log)
    self.log(loaded.description)
    return loaded

  def _build(self, loaded: experiment.Loaded, resumed_from: int | None
            ) -> Experiment:
    """The run built from ``loaded`` (its PM pretrained if need be); a
    signal meanwhile stops it before its first round."""
    kept = (None if resumed_from is None else
            self.run_dir.checkpoints.path(resumed_from))
    new_pm, stop, start_round = (_pretrains_pm(self.plan), self.stop,
                                 resumed_from or 0)
    try:
      built = experiment.build(self.plan, loaded, log=self.log,
                               should_stop=lambda: stop.signum is not None,
                               phases=self.phases)
    except pretrain.Stopped as e:
      raise RunInterrupted(
          f"{signal.Signals(stop.signum).name}: {e}; no round was trained",
          stop.signum, start_round, kept) from None
    if stop.signum is not None:
      pm_dir = self.plan.config.pm.dir
      pm_kept = (f"; the PM it pretrained is saved in {pm_dir} and is "
                 "reused" if new_pm and checkpoint.exists(pm_dir) else "")
      raise RunInterrupted(
          f"{signal.Signals(stop.signum).name} before the first round: "
          f"nothing was trained{'' if pm_kept else ' or saved'}{pm_kept}",
          stop.signum, start_round, kept)
    return built
