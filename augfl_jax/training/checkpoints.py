"""A run's numbered checkpoints: orbax's ``CheckpointManager``, verified.

``<dir>/step_<round>/`` holds two items: ``state`` (the whole run state: the
algorithm's server and stacked client state, the regulariser's state, PRNG
keys) and ``meta`` (JSON: the round, the configuration, the metrics records,
the step sizes changed on resume, the training losses not yet reported, the
seconds spent, the digest of the data, a CRC-32 of every array of
``state``, all sealed with a SHA-256 of ``meta`` itself,
:func:`augfl_jax.storage.checkpoint.seal`). orbax writes each step to a temporary
directory and renames it into place, saves in the background (the arrays
are copied to the host before :meth:`RunCheckpoints.save` returns) and
keeps the newest ``keep`` steps. :meth:`RunCheckpoints.restore` checks the
CRCs and falls back to the previous step, saying so, when the newest is
truncated, corrupt, edited or unsealed (a ``meta`` without its seal is
damaged: removing the seal must not pass an edit; an earlier version's
CRC-32 seal is checked by its own rule), and moves the damaged newer steps
aside
(``step_<n>.damaged``, which orbax ignores), so that the resumed run can
save those steps again. A step is its sealed ``meta``'s round, not its
directory's name: a step whose ``meta`` records another round (a directory
renamed or copied) is damaged.

Building a :class:`RunCheckpoints` writes and removes nothing, so a tool
may look at a run's steps without holding its lock; only the run that holds
the lock removes what its unfinished saves left
(:meth:`RunCheckpoints.remove_unfinished_saves`).

Across processes (``augfl_jax.processes``) every process saves and restores
its own part of the state (orbax's multi-process saving, process 0 writing
``meta``), the checksums are one per process, a step is damaged when any
process's part is, and process 0 alone removes or renames directories.

A save that fails (a full disk, a file system gone read-only) raises
:class:`CheckpointError` in one line, at the next save, :meth:`wait` or
:meth:`close`: orbax saves in the background.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from augfl_jax import processes
from augfl_jax.storage.checkpoint import (OLD_SEAL, DamagedCheckpointError,
                                          check_checksums, check_seal,
                                          checksums, failure_reason,
                                          quiet_closed_loop_callbacks,
                                          restore_target, seal)

__all__ = ["CheckpointError", "RunCheckpoints", "checksums"]


class CheckpointError(ValueError):
  """No checkpoint of the run can be restored, or one cannot be saved (one
  line: which, and why; then ``way_out``, what to do, when given).

  Attributes:
    what: the message without its way out (a command that does not take
      ``--overwrite`` gives its own).
    way_out: what to do; ``None`` for a save that failed, whose way out
      the caller knows (make room, the newest checkpoint).
  """

  def __init__(self, what: str, way_out: str | None = None):
    super().__init__(what if way_out is None else f"{what}; {way_out}")
    self.what, self.way_out = what, way_out


# One line for an exception of orbax's, without TensorStore's internals.
_reason = failure_reason


def _check_round(step: int, meta: dict[str, Any]) -> None:
  """Refuses (``DamagedCheckpointError``) the ``meta`` of ``step`` when the
  round it records is not ``step``: the directory was renamed or copied,
  and the round a resume starts from is the one its state was saved at."""
  saved = meta.get("round", step)
  if saved != step:
    raise DamagedCheckpointError(
        f"its metadata records round {saved}, not round {step}: the "
        f"directory step_{step} was renamed or copied from another step")


def _check_sealed(step: int, meta: Any) -> str | None:
  """The seal of ``meta`` of ``step``, checked (``check_seal``); an
  unsealed ``meta`` is damaged (``DamagedCheckpointError``)."""
  if not isinstance(meta, dict):
    return None  # refused by its reader: no configuration
  kind = check_seal(meta, f"step {step}")
  if kind is None:
    raise DamagedCheckpointError(
        "its metadata carries no seal: edited, or saved by a version that "
        "did not seal it")
  return kind


def _every_process(sums: dict[str, int]) -> dict[str, int | list[int]]:
  """``sums`` (this process's :func:`checksums`) in one process; across
  processes, ``{leaf path: [checksum of process 0's part, ...]}``."""
  if processes.count() == 1:
    return sums
  every = processes.gather(np.array(list(sums.values()), np.uint32))
  return {k: [int(v) for v in every[:, i]] for i, k in enumerate(sums)}


class RunCheckpoints:
  """The checkpoints under ``directory`` (module docstring).

  Args:
    directory: ``<output_dir>/checkpoints``.
    keep: how many of the newest steps are kept (>= 2, so that a damaged
      newest one has a predecessor).
  """

  def __init__(self, directory: str, keep: int = 2):
    if keep < 2:
      raise ValueError(f"keep must be >= 2, got {keep}")
    self.directory = os.path.abspath(directory)
    self._reported = set()  # the damaged steps already logged
    quiet_closed_loop_callbacks()
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=("state", "meta"),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, step_prefix="step", create=False,
            enable_async_checkpointing=True,
            cleanup_tmp_directories=False))

  def remove_unfinished_saves(self) -> None:
    """Removes what saves that never finished left (orbax's
    ``*.orbax-checkpoint-tmp*`` directories), before this run saves: done
    synchronously, because orbax's own clean-up can race with the first
    save of the new run and remove its files. Only the holder of the run
    directory's lock may call it: another process's save in flight is such
    a directory too."""
    if processes.is_writer() and os.path.isdir(self.directory):
      for name in os.listdir(self.directory):
        if ".orbax-checkpoint-tmp" in name:
          shutil.rmtree(os.path.join(self.directory, name),
                        ignore_errors=True)
    processes.sync("unfinished saves removed")

  def reload(self) -> None:
    """Reads the steps on disk again (after the directory was cleared by
    ``--overwrite``, the cached steps would refuse to save them again)."""
    self._manager.reload()

  def steps(self) -> list[int]:
    """The finished steps, ascending."""
    return sorted(self._manager.all_steps())

  def path(self, step: int) -> str:
    return os.path.join(self.directory, f"step_{step}")

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> str:
    """Starts saving ``state`` and ``meta`` as ``step``; returns its path.
    The arrays are on the host when this returns (``state`` may then be
    donated); :meth:`wait` waits for the files.

    Raises:
      CheckpointError: this save, or the one before it, failed.
    """
    # A copy taken now: the save runs in the background, and the caller may
    # change what ``meta`` holds (the loop appends to its pending losses).
    meta = seal({**meta, "checksums": _every_process(checksums(state)),
                 **({"processes": processes.count()}
                    if processes.count() > 1 else {})})
    try:
      os.makedirs(self.directory, exist_ok=True)
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
          force=True)
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"saving a checkpoint in {self.directory} "
                            f"failed ({_reason(e)})") from None
    return self.path(step)

  def wait(self) -> None:
    """Waits until every started save is on disk.

    Raises:
      CheckpointError: a save failed.
    """
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"saving a checkpoint in {self.directory} "
                            f"failed ({_reason(e)})") from None

  def read_meta(self, step: int) -> dict[str, Any]:
    """A step's ``meta`` item alone (no arrays read), its seal and round
    checked (``DamagedCheckpointError``: unsealed, edited, or of another
    round)."""
    meta = self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))["meta"]
    if _check_sealed(step, meta) is not None:
      _check_round(step, meta)
    return meta

  def latest_meta(self, log: Callable[[str], None]
                 ) -> tuple[int, dict[str, Any]]:
    """``(step, meta)`` of the newest step whose ``meta`` reads back (the
    arrays are checked by :meth:`restore`); told to ``log``: each step
    skipped.

    Raises:
      CheckpointError: there is no step, or no ``meta`` reads back.
    """
    problems = []
    for step in reversed(self.steps()):
      try:
        meta = self.read_meta(step)
        if not isinstance(meta, dict) or "config" not in meta:
          raise ValueError("its metadata has no configuration")
        return step, meta
      except Exception as e:  # pylint: disable=broad-except
        reason = _reason(e, self.path(step))
        problems.append(f"step {step}: {reason}")
        self._report(step, reason, log)
    raise CheckpointError(
        f"no checkpoint in {self.directory} reads back ("
        f"{'; '.join(problems) or 'there is none'})",
        "pass --overwrite to start the run again")

  def restore(self, like: Any, log: Callable[[str], None]
             ) -> tuple[int, Any, dict[str, Any]]:
    """The newest step that reads back whole: ``(step, state, meta)``.

    Steps newer than it (damaged) are renamed ``step_<n>.damaged``.

    Args:
      like: the state's structure (arrays or ``jax.ShapeDtypeStruct``).
      log: told about each step skipped and why.

    Raises:
      CheckpointError: no step reads back whole.
    """
    abstract = restore_target(jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                       sharding=getattr(x, "sharding", None)),
        like))
    problems, damaged = [], []
    for step in reversed(self.steps()):
      try:
        item = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            meta=ocp.args.JsonRestore()))
        state, meta = item["state"], item["meta"]
        if _check_sealed(step, meta) == OLD_SEAL:
          log(f"checkpoint {self.path(step)} is sealed by an older version "
              "(a CRC-32 of its metadata, checked by that rule)")
        _check_round(step, meta)
        check_checksums(state, meta.get("checksums", {}), f"step {step}",
                        processes.index())
        error = None
      except Exception as e:  # pylint: disable=broad-except
        error = e
      # Across processes, a step damaged in any process's part is damaged.
      if processes.agree(error is not None):
        reason = (_reason(error, self.path(step)) if error is not None else
                  "another process's part of it is damaged")
        problems.append(f"step {step}: {reason}")
        damaged.append(step)
        self._report(step, reason, log)
        continue
      for bad_step in damaged:
        self._set_aside(bad_step, log)
      return step, state, meta
    raise CheckpointError(
        f"no checkpoint in {self.directory} reads back whole ("
        f"{'; '.join(problems) or 'there is none'})",
        "pass --overwrite to start the run again")

  def _report(self, step: int, reason: str,
              log: Callable[[str], None]) -> None:
    """Logs, once per step, that ``step`` is damaged and skipped."""
    if step not in self._reported:
      self._reported.add(step)
      log(f"checkpoint {self.path(step)} is damaged ({reason}); trying the "
          "one before it")

  def _set_aside(self, step: int, log: Callable[[str], None]) -> None:
    """Renames damaged ``step_<n>`` to ``step_<n>.damaged`` (replacing an
    older such copy): kept to look at, out of the way of a new save."""
    path, aside = self.path(step), self.path(step) + ".damaged"
    if processes.is_writer():
      if os.path.isdir(aside):
        shutil.rmtree(aside)
      os.rename(path, aside)
    processes.sync(f"set aside {path}")
    self._manager.reload()
    log(f"kept the damaged checkpoint as {aside}, out of the way: round "
        f"{step} is saved again when the run gets there")

  def close(self, quiet: bool = False) -> None:
    """Waits for the saves in flight and releases orbax's threads.

    Args:
      quiet: drop a failed save's error (the caller is already reporting
        another one).

    Raises:
      CheckpointError: a save failed (unless ``quiet``).
    """
    error = None
    try:
      self.wait()
    except CheckpointError as e:
      error = e
    try:
      self._manager.close()
    except Exception as e:  # pylint: disable=broad-except
      error = error or CheckpointError(
          f"closing the checkpoints in {self.directory} failed "
          f"({_reason(e)})")
    if error is not None and not quiet:
      raise error
