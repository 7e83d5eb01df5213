"""The rounds of one run (:func:`run_rounds`, called by ``loop.run`` once
the directory is planned and the algorithm built): the participants of each
round, the guarded round, the evaluations, checkpoints, the stops on a
signal or a non-finite value, and the summary at the end.
"""

from __future__ import annotations

import math
import os
import signal
import time
from typing import Any

import jax
import numpy as np

from augfl_jax.core import evaluation, fields, intervals
from augfl_jax.core.progress import Progress, counted
from augfl_jax.training import resume as resuming
from augfl_jax.training.config import fields_to_lower
from augfl_jax.training.events import EventWriter
from augfl_jax.training.safety import (NonFiniteError, RunInterrupted,
                                       describe, guard_round)

# Rounds are logged at evaluations, and otherwise at least this often.
LOG_SECONDS = 10.0


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
  return {k: float(v) for k, v in metrics.items()
          if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype,
                                               np.number)}


def _finite(values: dict[str, float]) -> dict[str, float]:
  """The entries with a finite value (an interval of one client has
  none)."""
  return {k: v for k, v in values.items() if np.isfinite(v)}


def committed(state: Any) -> Any:
  """On one device, ``state`` committed to it: a round's outputs are, and
  jit compiles again for committed inputs after uncommitted ones."""
  if jax.device_count() != 1:
    return state
  return jax.device_put(state, jax.devices()[0])


def run_rounds(config, out, checkpoints, log, checkpoint_every, stop, fed,
               description, digest, algo, state, resumed, done
              ) -> dict[str, Any]:
  """The rounds after ``resumed`` (a ``resume.Resumed``; ``None``: all of
  them; ``done[0]``: the last completed), each checkpoint recording the
  data's ``digest``; the files' writes raise ``OSError`` /
  ``CheckpointError``."""
  num_clients = fed.train.num_clients
  history, train_losses, offset, changes = [], [], 0.0, {}
  start_round = 0
  if resumed is not None:
    start_round, history = resumed.round, resumed.history
    state = committed(resumed.state)
    train_losses, offset = resumed.train_losses, resumed.seconds
    changes = resumed.changes
    log(f"resuming from round {start_round} ({checkpoints.path(start_round)})")
    out.claim()  # a run of an older version claims changes.jsonl too
  else:
    out.clear_own()
    checkpoints.reload()  # --overwrite removed the old steps
    out.claim()
  resuming.record_changes(out, start_round, changes, log)
  # What runs now (a resumed run may differ in resumable_fields: rounds,
  # strategy, the data's directory, ... and in the changes above).
  out.write_json("config.json", fields.to_dict(config))
  out.write_text("partition.txt", description + "\n")
  out.write_records("metrics.jsonl", history)  # none past the checkpoint

  step = guard_round(algo.round, num_clients, fused=algo.traceable)
  start = time.perf_counter()
  progress = Progress(config.rounds, done=start_round)
  saved_round = None if resumed is None else start_round
  first_round_seconds, last_line = None, 0.0

  def save(round_: int, state_: Any) -> str:
    events.flush()
    path = checkpoints.save(round_, state_, {
        "round": round_, "config": fields.to_dict(config),
        "pending_train_losses": train_losses, "records": history,
        "data_digest": digest,
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

  heldout_counts = evaluation.query_counts(fed.test)

  def test_split_record(r: int) -> tuple[dict[str, Any], str]:
    """Scores the test-split clients after round ``r``: their record and
    the log line's end."""
    t0 = time.perf_counter()
    ev = evaluation.score_in_chunks(algo.evaluate, state,
                                    fed.test_split.clients)
    if not all(np.isfinite(ev[k]) for k in ("accuracy", "loss")):
      stop_nonfinite(r, f"round {r}: non-finite evaluation of the "
                     "test-split clients (loss = {ev['loss']})",
                     ("eval.alpha",))
    interval = ev["accuracy_interval"]
    events.scalars(_finite({"test_split_accuracy": ev["accuracy"],
                            "test_split_accuracy_ci_low": interval.low,
                            "test_split_accuracy_ci_high": interval.high}),
                   r, "eval/")
    record = {"accuracy": ev["accuracy"], "accuracy_ci": interval.to_json(),
              "accuracy_std": ev["accuracy_std"], "test_loss": ev["loss"],
              "clients": int(len(ev["client_count"])),
              "client_correct": ev["client_correct"].tolist(),
              "client_count": ev["client_count"].tolist()}
    return record, (f"; test-split accuracy {interval.format()} (95% CI "
                    f"across {record['clients']} clients, "
                    f"{time.perf_counter() - t0:.1f} s)")

  def evaluate(r: int, metrics_file) -> str:
    """Scores the held-out clients after round ``r`` (and the test-split
    clients after the last round and every ``eval.test_split_every``): a
    record in ``history``, ``metrics.jsonl`` and the events; the log
    line's end."""
    nonlocal train_losses
    ev_all = evaluation.with_interval(
        jax.device_get(algo.evaluate(state, fed.test)), heldout_counts)
    ev = _scalars(ev_all)
    if not all(np.isfinite(v) for v in ev.values()):
      stop_nonfinite(r, f"round {r}: non-finite evaluation of the "
                     "held-out clients (" + ", ".join(
                         f"{k} = {v}" for k, v in ev.items()
                         if not np.isfinite(v)) + ")", ("eval.alpha",))
    interval = ev_all["accuracy_interval"]
    since = history[-1]["round"] if history else 0
    record = {"round": r,
              "mean_train_loss": float(np.mean(train_losses)),
              "accuracy": ev["accuracy"],
              "accuracy_ci": interval.to_json(),
              "accuracy_std": ev["accuracy_std"],
              "test_loss": ev["loss"],
              "client_accuracy": [
                  float(a) for a in ev_all["client_accuracy"]],
              "client_count": heldout_counts.tolist()}
    line = (f" (mean over rounds {since + 1}-{r}: "
            f"{record['mean_train_loss']:.4f}); test-client accuracy "
            f"{interval.format()} (95% CI across {len(heldout_counts)} "
            "clients)")
    every = config.eval.test_split_every
    if fed.test_split is not None and (
        r == config.rounds or every and r % every == 0):
      record["test_split"], more = test_split_record(r)
      line += more
    record["seconds"] = offset + time.perf_counter() - start
    train_losses = []
    history.append(record)
    metrics_file.write(out.record_line(record))
    metrics_file.flush()
    events.scalars(_finite(
        {k: ev[k] for k in ("accuracy", "accuracy_std", "loss")}
        | {"accuracy_ci_low": interval.low,
           "accuracy_ci_high": interval.high}), r, "eval/")
    return line

  events = EventWriter(out.file("tb"), None if resumed is None
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
      if r == start_round + 1:
        log(f"round {r:4d}/{config.rounds}  compiling the round (its time "
            "is part of this round's) ...")
      participants = sample_participants(config.seed, r, num_clients,
                                         config.clients_per_round)
      state, metrics, ok, flags = step(state, fed.train, participants)
      if not bool(ok):
        stop_nonfinite(r - 1, f"round {r}: non-finite "
                       + describe(flags, participants, metrics),
                       fields_to_lower(config))
      scalars = _scalars(jax.device_get(metrics))
      loss = scalars["loss"]
      if first_round_seconds is None:
        first_round_seconds = time.perf_counter() - t0
      train_losses.append(loss)
      progress.step()
      if (estimate := progress.long_estimate("round")):
        log(f"the rounds will take long: {estimate}")
      events.scalars(scalars, r, "train/")
      line = f"round {r:4d}/{config.rounds}  train loss {loss:.4f}"
      evaluating = (r % config.eval_every == 0 or r == config.rounds or
                    config.eval.test_split_every and
                    r % config.eval.test_split_every == 0)
      if evaluating:
        line += evaluate(r, metrics_file)
      done[0] = r
      if (evaluating or r == start_round + 1 or
          time.perf_counter() - last_line >= LOG_SECONDS):
        log(f"{line}  " + (
            f"{first_round_seconds:.2f} s (compiling included)"
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
      "final_accuracy_ci": final.get("accuracy_ci"),
      "final_accuracy_std": final["accuracy_std"],
      "best_accuracy": max(h["accuracy"] for h in history),
      "test_split": _test_split_summary(fed, history),
      "seconds": offset + session, "first_round_seconds": first_round_seconds,
      "seconds_per_round": ((session - first_round_seconds) /
                            (rounds_done - 1) if rounds_done > 1 else session),
      "resumed_from_round": start_round,
  }
  if changes or os.path.exists(out.file("changes.jsonl")):
    summary["resume_changes"] = out.read_records("changes.jsonl", log,
                                                 tolerant=True)
  out.write_json("summary.json", summary)
  log(f"final test-client accuracy {_format(final)} after "
      f"{counted(config.rounds, 'round')} ({offset + session:.1f} s)" + (
          f"; test-split accuracy {_format(final['test_split'])}"
          if "test_split" in final else "")
      + f"; results in {out.path}")
  return summary


def _format(record: dict[str, Any]) -> str:
  """``"89.10 [88.30, 89.90] (95% CI across 1000 clients)"`` of a
  record."""
  low, high = (math.nan if v is None else v
               for v in record.get("accuracy_ci") or (None, None))
  clients = record.get("clients", len(record.get("client_accuracy", ())))
  return (intervals.Interval(record["accuracy"], low, high, clients).format()
          + f" (95% CI across {clients} clients)")


def _test_split_summary(fed, history: list[dict[str, Any]]
                       ) -> dict[str, Any]:
  """``summary.json``'s ``test_split``: where the clients come from and
  the newest scoring (its round, accuracy, interval, std and loss; the
  per-client counts are in that round's ``metrics.jsonl`` record);
  ``{"off": why}`` without one."""
  if fed.test_split is None:
    return {"off": fed.test_split_off or "not scored"}
  summary = {"source": fed.test_split.source,
             "clients": fed.test_split.num_clients}
  scored = [h for h in history if "test_split" in h]
  if scored:
    newest = scored[-1]["test_split"]
    summary.update(round=scored[-1]["round"], **{
        k: newest[k] for k in ("accuracy", "accuracy_ci", "accuracy_std",
                               "test_loss")})
  return summary
