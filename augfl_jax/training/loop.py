"""One federated training run: :func:`run`.

``run(config, output_dir)`` trains ``config.algorithm``, scores the held-out
clients every ``config.eval_every`` rounds and writes to ``output_dir``:

* ``config.json``: the resolved configuration (every default filled in);
* ``partition.txt``: the files read, the partition, the server split;
* ``metrics.jsonl``: one JSON object per evaluation (round, mean training
  loss since the last one, test-client accuracy mean/std across clients and
  per client, test loss, seconds since the start);
* ``tb/``: TensorBoard events (``train/*`` every round, ``eval/*``);
* ``checkpoints/step_<round>/``: the newest two run states (orbax), every
  ``checkpoint_every`` rounds, at the end, on SIGINT/SIGTERM and before
  stopping on a non-finite round or evaluation;
* ``summary.json``: final and best accuracy, timings;
* ``changes.jsonl``: the step sizes a resumed run changed
  (``resume_changes``), one record per such resume.

What a run guarantees (README, "What a run guarantees"): one writer per
directory (a lock), no file it did not write is ever removed or reused,
JSON files are replaced atomically, checkpoints are verified on restore
(the previous one is used, with a message, when the newest is damaged),
and resuming is exact: ``R`` rounds straight and ``k`` + resume + ``R - k``
give the same state bit for bit (same device, strategy and conv_impl).
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from augfl_jax import data, fields
from augfl_jax.training import presets, wiring
from augfl_jax.training.checkpoints import CheckpointError, RunCheckpoints
from augfl_jax.training.config import (RESUMABLE_FIELDS, STEP_SIZE_FIELDS,
                                       RunConfig, step_size_fields)
from augfl_jax.training.events import EventWriter
from augfl_jax.training.outputs import OutputDir, OutputDirError
from augfl_jax.progress import Progress
from augfl_jax.training.safety import StopSignals, describe, guard_round

CHECKPOINT_EVERY = 50
# Rounds are logged at evaluations, and otherwise at least this often.
LOG_SECONDS = 10.0


class RunInterrupted(Exception):
  """SIGINT or SIGTERM stopped the run; its state, if any, was saved.

  Attributes: ``signum``, ``round`` (the last completed round) and
  ``checkpoint`` (the saved checkpoint's path, ``None`` before round 1).
  """

  def __init__(self, message: str, signum: int, round_: int,
               checkpoint_path: str | None):
    super().__init__(message)
    self.signum, self.round, self.checkpoint = signum, round_, checkpoint_path


class NonFiniteError(FloatingPointError):
  """A round or an evaluation produced a NaN or inf (the last good state
  was saved first)."""


def sample_participants(seed: int, round_: int, num_clients: int,
                        clients_per_round: int) -> np.ndarray | None:
  """The clients taking part in ``round_``: ``clients_per_round`` of them,
  uniformly without replacement, reproducible from (seed, round); ``None``
  (everyone) when all take part (``clients_per_round`` 0 or ``C``)."""
  if clients_per_round in (0, num_clients):
    return None
  rng = np.random.default_rng([seed, round_])
  return np.sort(rng.choice(num_clients, clients_per_round, replace=False))


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}


def _committed(state: Any) -> Any:
  """On one device, ``state`` committed to it: a round's outputs are, and
  jit compiles again for committed inputs after uncommitted ones."""
  if jax.device_count() != 1:
    return state
  return jax.device_put(state, jax.devices()[0])


def _check_resume_config(saved: RunConfig, config: RunConfig,
                         resume_changes: Sequence[str], where: str) -> None:
  """Refuses a resumed configuration that differs from the checkpoint's
  ``saved`` outside ``RESUMABLE_FIELDS`` and ``resume_changes``."""
  diff = fields.diff(saved, config, RESUMABLE_FIELDS + tuple(resume_changes))
  if not diff:
    return
  names = [d.partition(":")[0] for d in diff]
  if all(n in STEP_SIZE_FIELDS for n in names):
    way_out = ("to continue with these step sizes, add --resume_changes="
               + ",".join(list(resume_changes) + names))
  else:
    way_out = (f"only {', '.join(RESUMABLE_FIELDS)} may change on resume, "
               "and the step sizes named in --resume_changes")
  raise ValueError(f"--resume: the checkpoint {where} is of another "
                   f"configuration ({'; '.join(diff)}); {way_out}")


def _changed(saved: RunConfig, config: RunConfig,
             resume_changes: Sequence[str]) -> dict[str, list[Any]]:
  """``{name: [before, after]}`` of the fields in ``resume_changes`` that
  differ between the checkpoint's ``saved`` and ``config``."""
  return {n: [fields.get(saved, n), fields.get(config, n)]
          for n in resume_changes
          if fields.get(saved, n) != fields.get(config, n)}


def _saved_config(out: OutputDir, checkpoints: RunCheckpoints,
                  log) -> RunConfig | None:
  """The configuration of the run ``out`` holds: its ``config.json``, or,
  when that is missing, empty or torn (a crash or a full disk while it was
  written), the one saved with its newest readable checkpoint; ``None``
  when neither reads."""
  path = out.file("config.json")
  if os.path.exists(path):
    try:
      return fields.from_dict(RunConfig, out.read_json("config.json"))
    except OutputDirError:
      log(f"{path} is empty or cut short (a crash or a full disk while it "
          "was written); " + ("using the configuration saved with the "
                              "newest checkpoint" if checkpoints.steps()
                              else "it is written again"))
  if checkpoints.steps():
    try:
      return fields.from_dict(RunConfig,
                              checkpoints.latest_meta(log)[1]["config"])
    except CheckpointError:
      return None
  return None


def _plan(config: RunConfig, out: OutputDir, checkpoints: RunCheckpoints,
          resume: bool, overwrite: bool, resume_changes: Sequence[str],
          log) -> int | None:
  """The checkpoint step to resume from (``None``: a fresh run), after
  checking the directory against the run. Raises ``ValueError``."""
  foreign = out.foreign()
  if foreign:
    raise OutputDirError(
        f"{out.path} holds {', '.join(foreign)}, which augfl_jax did not "
        "write: it never removes or reuses such files; choose another "
        "--output_dir")
  steps = checkpoints.steps()
  if resume:
    if not steps:
      raise ValueError(f"--resume: no checkpoint in {checkpoints.directory};"
                       " run without --resume to start the run (again)")
    step, meta = checkpoints.latest_meta(log)
    _check_resume_config(fields.from_dict(RunConfig, meta["config"]), config,
                         resume_changes, f"{checkpoints.path(step)}")
    if step > config.rounds:
      raise ValueError(f"--resume: the checkpoint is at round {step}, "
                       f"beyond --rounds={config.rounds}")
    return step
  if overwrite or not out.own_files():
    return None
  saved = _saved_config(out, checkpoints, log)
  if saved is not None:
    diff = fields.diff(saved, config)
    if diff:
      raise OutputDirError(
          f"{out.path} holds a different run ({'; '.join(diff)}); pass "
          "--overwrite to replace it or choose another --output_dir")
  if steps:
    raise OutputDirError(
        f"{out.path} already holds this run; pass --resume to continue it "
        "from its latest checkpoint or --overwrite to start again")
  log(f"{out.path} holds this run without a checkpoint: starting it again")
  return None


def _check_run_control(config: RunConfig, checkpoint_every: int,
                       resume: bool, overwrite: bool,
                       resume_changes: Sequence[str]) -> None:
  """The checks of ``run``'s own arguments (and of ``clients_per_round``
  against the partition's size), before anything is read or written."""
  if checkpoint_every < 0:
    raise ValueError(f"--checkpoint_every must be >= 0 (0: only at the "
                     f"end), got {checkpoint_every}")
  if resume and overwrite:
    raise ValueError("--resume and --overwrite exclude each other: resume "
                     "continues the run in --output_dir, overwrite replaces "
                     "it")
  if resume_changes and not resume:
    raise ValueError("--resume_changes names step sizes a resumed run "
                     "changes: it needs --resume")
  for name in resume_changes:
    if name not in STEP_SIZE_FIELDS:
      raise ValueError(
          f"--resume_changes: {name} is not a step size; these may change "
          f"on resume: {', '.join(STEP_SIZE_FIELDS)}")
  if config.dataset != "synthetic":  # synthetic: its natural clients
    train = data.num_train_clients(config.data.num_clients)
    if config.clients_per_round > train:
      raise ValueError(
          f"--clients_per_round={config.clients_per_round} is more than the "
          f"{train} training clients (80% of --data.num_clients="
          f"{config.data.num_clients})")


def run(config: RunConfig, output_dir: str,
        log: Callable[[str], None] = print, *,
        checkpoint_every: int = CHECKPOINT_EVERY, resume: bool = False,
        overwrite: bool = False, resume_changes: Sequence[str] = (),
        transform_data: Callable[[data.FederatedData], data.FederatedData
                                 | tuple[data.FederatedData, str]]
        | None = None) -> dict[str, Any]:
  """Trains ``config.algorithm`` and scores it on the held-out clients.

  Args:
    config: the run's configuration (resolved and checked here).
    output_dir: where the run's files go (module docstring).
    log: receives progress lines.
    checkpoint_every: save the run state every this many rounds and at the
      end; 0: only at the end, on a signal and before a non-finite stop.
    resume: continue from ``output_dir``'s newest readable checkpoint (its
      configuration may differ only in ``RESUMABLE_FIELDS`` and
      ``resume_changes``; a larger ``rounds`` trains further).
    overwrite: replace the run ``output_dir`` holds (only its own files).
    resume_changes: dotted names of step sizes (``STEP_SIZE_FIELDS``) that
      this resumed run may change, e.g. ``("fedavg.lr",)`` after a
      non-finite round; each change is logged and recorded in
      ``changes.jsonl``.
    transform_data: applied to the federated data before training (tests
      put a NaN into a client; ``experiments.ood`` swaps in rotated
      domains); returns the data, or ``(data, description)``.

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
  config = presets.validate(config)
  resume_changes = tuple(resume_changes)
  _check_run_control(config, checkpoint_every, resume, overwrite,
                     resume_changes)
  out = OutputDir(output_dir)
  created = not os.path.exists(output_dir)
  out.check_writable()
  with out.lock(remove_if_unused=created), StopSignals() as stop:
    return _run_locked(config, out, log, checkpoint_every, resume,
                       overwrite, resume_changes, transform_data, stop)


def _run_locked(config, out, log, checkpoint_every, resume, overwrite,
                resume_changes, transform_data, stop) -> dict[str, Any]:
  checkpoints = RunCheckpoints(out.file("checkpoints"))
  try:
    summary = _train(config, out, checkpoints, log, checkpoint_every,
                     resume, overwrite, resume_changes, transform_data, stop)
  except BaseException:
    # A save in flight completes even when an exception stops the run; its
    # own failure, if any, is not reported over the one propagating.
    checkpoints.close(quiet=True)
    raise
  checkpoints.close()
  return summary


def _write_error(e: BaseException, out: OutputDir,
                 checkpoints: RunCheckpoints, done: int) -> OutputDirError:
  """One line for a file of the run that could not be written (a full
  disk, a file system gone read-only): what failed, after which round,
  and the newest checkpoint to resume from."""
  if isinstance(e, OSError) and e.strerror:
    reason = e.strerror + (f": {e.filename}" if e.filename else "")
  else:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  try:
    checkpoints.wait()  # the saves before the failed one are on disk
  except CheckpointError:
    pass
  try:
    checkpoints.reload()
    steps = checkpoints.steps()
  except Exception:  # pylint: disable=broad-except
    steps = []
  way_out = (f"the newest checkpoint is round {steps[-1]} "
             f"({checkpoints.path(steps[-1])}): make room (or fix the "
             "directory) and continue with --resume" if steps else
             "no checkpoint was saved: make room (or fix the directory) and "
             "run again")
  return OutputDirError(f"writing the run's files in {out.path} failed "
                        f"after round {done} ({reason}); {way_out}")


def _train(config, out, checkpoints, log, checkpoint_every, resume,
           overwrite, resume_changes, transform_data, stop
          ) -> dict[str, Any]:
  resumed_from = _plan(config, out, checkpoints, resume, overwrite,
                      resume_changes, log)
  start_round = resumed_from or 0  # a resume may start at round 0
  if start_round == config.rounds and os.path.exists(
      out.file("summary.json")):
    try:
      summary = out.read_json("summary.json")
      log(f"the run in {out.path} has done its {config.rounds} rounds; "
          "pass a larger --rounds to continue it")
      return summary
    except OutputDirError:
      log(f"{out.file('summary.json')} is cut short: it is written again")

  fed, description = wiring.load_federated(config)
  if transform_data is not None:
    fed = transform_data(fed)
    if isinstance(fed, tuple):
      fed, description = fed
  num_clients = fed.train.num_clients
  if config.clients_per_round > num_clients:  # before anything compiles
    raise ValueError(f"--clients_per_round={config.clients_per_round} is "
                     f"more than the {num_clients} training clients")
  log(description)
  algo, params = wiring.build_algorithm(config, fed, log)
  run_key = jax.random.split(jax.random.key(config.seed))[1]
  state = _committed(algo.init(params, num_clients, run_key))
  if stop.signum is not None:
    raise RunInterrupted(
        f"{signal.Signals(stop.signum).name} before the first round: "
        "nothing was trained or saved", stop.signum, start_round,
        None if resumed_from is None else checkpoints.path(start_round))

  done = [start_round]  # the last round completed (for error messages)
  try:
    return _rounds(config, out, checkpoints, log, checkpoint_every,
                   resume_changes, stop, fed, description, algo, state,
                   resumed_from, done)
  except (OSError, CheckpointError) as e:
    raise _write_error(e, out, checkpoints, done[0]) from None


def _rounds(config, out, checkpoints, log, checkpoint_every, resume_changes,
            stop, fed, description, algo, state, resumed_from, done
           ) -> dict[str, Any]:
  """The rounds after ``resumed_from`` (``None``: all of them; ``done[0]``:
  the last completed); the files' writes raise ``OSError`` /
  ``CheckpointError``."""
  num_clients = fed.train.num_clients
  history, train_losses, offset, changes = [], [], 0.0, {}
  start_round = 0
  if resumed_from is not None:
    start_round, state, meta = checkpoints.restore(state, log)
    done[0] = start_round
    state = _committed(state)
    saved = fields.from_dict(RunConfig, meta["config"])
    _check_resume_config(saved, config, resume_changes,
                         checkpoints.path(start_round))
    changes = _changed(saved, config, resume_changes)
    train_losses = list(meta["pending_train_losses"])
    offset = meta["seconds"]
    on_disk = out.read_records("metrics.jsonl", log, tolerant=True)
    # The checkpoint holds the records up to its round (older ones: only
    # metrics.jsonl does).
    history = meta["records"] if "records" in meta else [
        r for r in on_disk if r.get("round", start_round + 1) <= start_round]
    log(f"resuming from round {start_round} ({checkpoints.path(start_round)})")
    out.claim()  # a run of an older version claims changes.jsonl too
  else:
    out.clear_own()
    checkpoints.reload()  # --overwrite removed the old steps
    out.claim()
  if changes:
    text = ", ".join(f"{n} {a} -> {b}" for n, (a, b) in changes.items())
    log(f"changed on resume from round {start_round} (--resume_changes): "
        f"{text}; recorded in {out.file('changes.jsonl')}")
    out.write_records("changes.jsonl", out.read_records(
        "changes.jsonl", log, tolerant=True) + [{
            "round": start_round, "changes": changes,
            "time": datetime.datetime.now().isoformat(timespec="seconds")}])
  # What runs now (a resumed run may differ in RESUMABLE_FIELDS: rounds,
  # strategy, the data's directory, ... and in the changes above).
  out.write_json("config.json", fields.to_dict(config))
  out.write_text("partition.txt", description + "\n")
  out.write_records("metrics.jsonl", history)  # none past the checkpoint

  fused = not (presets.pm_role(config) == "regularizer" and
               config.crd.loop == "python")
  step = guard_round(algo.round, num_clients, fused=fused)
  start = time.perf_counter()
  progress = Progress(config.rounds, done=start_round)
  saved_round = None if resumed_from is None else start_round
  first_round_seconds, last_line = None, 0.0

  def save(round_: int, state_: Any) -> str:
    events.flush()
    path = checkpoints.save(round_, state_, {
        "round": round_, "config": fields.to_dict(config),
        "pending_train_losses": train_losses, "records": history,
        "seconds": offset + time.perf_counter() - start})
    return path

  def stop_nonfinite(good: int, what: str, names: tuple[str, ...]) -> None:
    path = (save(good, state) if saved_round != good else
            checkpoints.path(good))
    checkpoints.wait()
    advice = (" ".join(f"--{n}=<smaller>" for n in names) +
              f" --resume_changes={','.join(names)}" if names else
              "and the step sizes it uses, smaller, named in "
              "--resume_changes")
    raise NonFiniteError(
        f"{what}. Stopped; the last good state (round {good}) is in {path}."
        f" Continue it with --resume {advice}; or check those clients' "
        "data")

  def evaluate(r: int, metrics_file) -> str:
    """Scores the held-out clients after round ``r``: a record in
    ``history``, ``metrics.jsonl`` and the events; the log line's end."""
    nonlocal train_losses
    ev_all = jax.device_get(algo.evaluate(state, fed.test))
    ev = _scalars(ev_all)
    if not all(np.isfinite(v) for v in ev.values()):
      stop_nonfinite(r, f"round {r}: non-finite evaluation of the "
                     "held-out clients (" + ", ".join(
                         f"{k} = {v}" for k, v in ev.items()
                         if not np.isfinite(v)) + ")", ("eval.alpha",))
    record = {"round": r, "train_loss": float(np.mean(train_losses)),
              "accuracy": ev["accuracy"],
              "accuracy_std": ev["accuracy_std"],
              "test_loss": ev["loss"],
              "client_accuracy": [
                  float(a) for a in ev_all["client_accuracy"]],
              "seconds": offset + time.perf_counter() - start}
    train_losses = []
    history.append(record)
    metrics_file.write(out.record_line(record))
    metrics_file.flush()
    events.scalars({k: ev[k] for k in ("accuracy", "accuracy_std", "loss")},
                   r, "eval/")
    return (f"  test-client accuracy {100 * ev['accuracy']:.2f}"
            f" ± {100 * ev['accuracy_std']:.2f} (across clients)")

  events = EventWriter(out.file("tb"), None if resumed_from is None
                       else start_round + 1)
  with events, open(out.file("metrics.jsonl"), "a") as metrics_file:
    if (train_losses and (start_round % config.eval_every == 0 or
                          start_round == config.rounds) and
        all(h["round"] != start_round for h in history)):
      # Stopped by a non-finite evaluation: its round is scored again (with
      # the step size the resume changed).
      log(f"round {start_round:4d}/{config.rounds}  (restored)"
          + evaluate(start_round, metrics_file))
    for r in range(start_round + 1, config.rounds + 1):
      t0 = time.perf_counter()
      participants = sample_participants(config.seed, r, num_clients,
                                         config.clients_per_round)
      state, metrics, ok, flags = step(state, fed.train, participants)
      if not bool(ok):
        stop_nonfinite(r - 1, f"round {r}: non-finite "
                       + describe(flags, participants, metrics),
                       step_size_fields(config))
      scalars = _scalars(jax.device_get(metrics))
      loss = scalars["loss"]
      if first_round_seconds is None:
        first_round_seconds = time.perf_counter() - t0
      train_losses.append(loss)
      progress.step()
      events.scalars(scalars, r, "train/")
      line = f"round {r:4d}/{config.rounds}  train loss {loss:.4f}"
      evaluating = r % config.eval_every == 0 or r == config.rounds
      if evaluating:
        line += evaluate(r, metrics_file)
      done[0] = r
      if (evaluating or r == start_round + 1 or
          time.perf_counter() - last_line >= LOG_SECONDS):
        log(f"{line}  " + (
            f"{first_round_seconds:.2f} s (compilation included)"
            if r == start_round + 1 else progress.describe("round")))
        last_line = time.perf_counter()
      if checkpoint_every and r % checkpoint_every == 0 or r == config.rounds:
        os.fsync(metrics_file.fileno())
        save(r, state)
        saved_round = r
      if stop.signum is not None and r < config.rounds:
        path = (save(r, state) if saved_round != r else
                checkpoints.path(r))
        checkpoints.wait()
        raise RunInterrupted(
            f"{signal.Signals(stop.signum).name} after round {r}/"
            f"{config.rounds}: the run state is saved in {path}; continue "
            "it with --resume (same flags)", stop.signum, r, path)
  checkpoints.wait()

  session = time.perf_counter() - start
  rounds_done = config.rounds - start_round
  final = history[-1]
  summary = {
      "dataset": config.dataset, "algorithm": config.algorithm,
      "model": config.model, "seed": config.seed, "rounds": config.rounds,
      "final_accuracy": final["accuracy"],
      "final_accuracy_std": final["accuracy_std"],
      "best_accuracy": max(h["accuracy"] for h in history),
      "seconds": offset + session, "first_round_seconds": first_round_seconds,
      "seconds_per_round": ((session - first_round_seconds) /
                            (rounds_done - 1) if rounds_done > 1 else session),
      "resumed_from_round": start_round,
  }
  if changes or os.path.exists(out.file("changes.jsonl")):
    summary["resume_changes"] = out.read_records("changes.jsonl", log,
                                                 tolerant=True)
  out.write_json("summary.json", summary)
  log(f"final test-client accuracy {100 * final['accuracy']:.2f} ± "
      f"{100 * final['accuracy_std']:.2f} across clients after "
      f"{config.rounds} rounds ({offset + session:.1f} s); results in "
      f"{out.path}")
  return summary
