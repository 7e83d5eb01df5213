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
* ``summary.json``: final and best accuracy, timings.

What a run guarantees (README, "What a run guarantees"): one writer per
directory (a lock), no file it did not write is ever removed or reused,
JSON files are replaced atomically, checkpoints are verified on restore
(the previous one is used, with a message, when the newest is damaged),
and resuming is exact: ``R`` rounds straight and ``k`` + resume + ``R - k``
give the same state bit for bit (same device, strategy and conv_impl).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable

import jax
import numpy as np

from augfl_jax import data, fields
from augfl_jax.training import presets, wiring
from augfl_jax.training.checkpoints import RunCheckpoints
from augfl_jax.training.config import RESUMABLE_FIELDS, RunConfig
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


def _plan(config: RunConfig, out: OutputDir, checkpoints: RunCheckpoints,
          resume: bool, overwrite: bool, log) -> int | None:
  """The checkpoint step to resume from (``None``: a fresh run), after
  checking the directory against the run. Raises ``ValueError``."""
  if resume and overwrite:
    raise ValueError("--resume and --overwrite exclude each other: resume "
                     "continues the run in --output_dir, overwrite replaces "
                     "it")
  steps = checkpoints.steps()
  if resume:
    if not steps:
      raise ValueError(f"--resume: no checkpoint in {checkpoints.directory};"
                       " run without --resume to start the run (again)")
    saved = fields.from_dict(RunConfig, checkpoints.read_meta(steps[-1])[
        "config"])
    diff = fields.diff(saved, config, RESUMABLE_FIELDS)
    if diff:
      raise ValueError(
          f"--resume: the checkpoint in {checkpoints.directory} (round "
          f"{steps[-1]}) is of another configuration ({'; '.join(diff)}); "
          f"only {', '.join(RESUMABLE_FIELDS)} may change on resume")
    if steps[-1] > config.rounds:
      raise ValueError(f"--resume: the checkpoint is at round {steps[-1]}, "
                       f"beyond --rounds={config.rounds}")
    return steps[-1]
  foreign = out.foreign()
  if foreign:
    raise OutputDirError(
        f"{out.path} holds {', '.join(foreign)}, which augfl_jax did not "
        "write: it never removes or reuses such files; choose another "
        "--output_dir")
  if overwrite or not out.own_files():
    return None
  if os.path.exists(out.file("config.json")):
    saved = fields.from_dict(RunConfig, out.read_json("config.json"))
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


def run(config: RunConfig, output_dir: str,
        log: Callable[[str], None] = print, *,
        checkpoint_every: int = CHECKPOINT_EVERY, resume: bool = False,
        overwrite: bool = False,
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
      configuration may differ only in ``RESUMABLE_FIELDS``; a larger
      ``rounds`` trains further).
    overwrite: replace the run ``output_dir`` holds (only its own files).
    transform_data: applied to the federated data before training (tests
      put a NaN into a client; ``experiments.ood`` swaps in rotated
      domains); returns the data, or ``(data, description)``.

  Returns:
    The summary, also written to ``summary.json``.

  Raises:
    ValueError: a bad configuration, or an output directory that holds
      another run, is in use or cannot be written; before any work.
    NonFiniteError: a round or an evaluation produced a NaN or inf.
    RunInterrupted: SIGINT/SIGTERM.
  """
  config = presets.validate(config)
  if checkpoint_every < 0:
    raise ValueError(f"--checkpoint_every must be >= 0 (0: only at the "
                     f"end), got {checkpoint_every}")
  out = OutputDir(output_dir)
  created = not os.path.exists(output_dir)
  out.check_writable()
  try:
    with out.lock(), StopSignals() as stop:
      return _run_locked(config, out, log, checkpoint_every, resume,
                         overwrite, transform_data, stop)
  finally:
    if created and os.listdir(output_dir) == [".augfl_jax.lock"]:
      os.remove(out.file(".augfl_jax.lock"))  # failed before any output
      os.rmdir(output_dir)


def _run_locked(config, out, log, checkpoint_every, resume, overwrite,
                transform_data, stop) -> dict[str, Any]:
  checkpoints = RunCheckpoints(out.file("checkpoints"))
  try:
    return _train(config, out, checkpoints, log, checkpoint_every, resume,
                  overwrite, transform_data, stop)
  finally:  # a save in flight completes even when an exception stops the run
    checkpoints.close()


def _train(config, out, checkpoints, log, checkpoint_every, resume,
           overwrite, transform_data, stop) -> dict[str, Any]:
  start_round = _plan(config, out, checkpoints, resume, overwrite, log) or 0
  if start_round == config.rounds and os.path.exists(
      out.file("summary.json")):
    log(f"the run in {out.path} has done its {config.rounds} rounds; pass "
        "a larger --rounds to continue it")
    return out.read_json("summary.json")

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
        "nothing was trained or saved", stop.signum, start_round, None)

  history, train_losses, offset = [], [], 0.0
  if start_round:
    start_round, state, meta = checkpoints.restore(state, log)
    state = _committed(state)
    train_losses = list(meta["pending_train_losses"])
    offset = meta["seconds"]
    history = [r for r in out.read_records("metrics.jsonl", log)
               if r["round"] <= start_round]
    log(f"resuming from round {start_round} ({checkpoints.path(start_round)})")
  else:
    out.clear_own()
    checkpoints.reload()  # --overwrite removed the old steps
    out.claim()
  # What runs now (a resumed run may differ in RESUMABLE_FIELDS: rounds,
  # strategy, the data's directory, ...).
  out.write_json("config.json", fields.to_dict(config))
  out.write_text("partition.txt", description + "\n")
  out.write_records("metrics.jsonl", history)  # none past the checkpoint

  fused = not (presets.pm_role(config) == "regularizer" and
               config.crd.loop == "python")
  step = guard_round(algo.round, num_clients, fused=fused)
  start = time.perf_counter()
  progress = Progress(config.rounds, done=start_round)
  saved_round = start_round or None
  first_round_seconds, last_line = None, 0.0

  def save(round_: int, state_: Any) -> str:
    events.flush()
    path = checkpoints.save(round_, state_, {
        "round": round_, "config": fields.to_dict(config),
        "pending_train_losses": train_losses,
        "seconds": offset + time.perf_counter() - start})
    return path

  def stop_nonfinite(good: int, what: str) -> None:
    path = (save(good, state) if saved_round != good else
            checkpoints.path(good))
    checkpoints.wait()
    raise NonFiniteError(
        f"{what}. Stopped; the last good state (round {good}) is in {path}."
        " Continue it with --resume and smaller step sizes (e.g. "
        "--augfl.alpha, --fedavg.lr, --eval.alpha), or check those "
        "clients' data")

  events = EventWriter(out.file("tb"), start_round + 1 if start_round
                       else None)
  with events, open(out.file("metrics.jsonl"), "a") as metrics_file:
    for r in range(start_round + 1, config.rounds + 1):
      t0 = time.perf_counter()
      participants = sample_participants(config.seed, r, num_clients,
                                         config.clients_per_round)
      state, metrics, ok, flags = step(state, fed.train, participants)
      if not bool(ok):
        stop_nonfinite(r - 1, f"round {r}: non-finite "
                       + describe(flags, participants, metrics))
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
        ev_all = jax.device_get(algo.evaluate(state, fed.test))
        ev = _scalars(ev_all)
        if not all(np.isfinite(v) for v in ev.values()):
          stop_nonfinite(r, f"round {r}: non-finite evaluation of the "
                         "held-out clients (" + ", ".join(
                             f"{k} = {v}" for k, v in ev.items()
                             if not np.isfinite(v)) + ")")
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
        events.scalars({k: ev[k] for k in ("accuracy", "accuracy_std",
                                           "loss")}, r, "eval/")
        line += (f"  test-client accuracy {100 * ev['accuracy']:.2f}"
                 f" ± {100 * ev['accuracy_std']:.2f} (across clients)")
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
  checkpoints.close()

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
  out.write_json("summary.json", summary)
  log(f"final test-client accuracy {100 * final['accuracy']:.2f} ± "
      f"{100 * final['accuracy_std']:.2f} across clients after "
      f"{config.rounds} rounds ({offset + session:.1f} s); results in "
      f"{out.path}")
  return summary

