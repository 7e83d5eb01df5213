"""The checkpoints of an unfinished PM pretraining, which the same command
continues from.

While a PM is pretrained into ``<pm_dir>`` (:mod:`augfl_jax.pm.store`),
:func:`~augfl_jax.pm.pretrain.pretrain` saves its whole state (parameters,
running statistics, optimizer state, shuffling key, the epoch's running
sums) at the end of every epoch, or every ``checkpoint_every_steps`` steps,
and when a stop is asked for, into ``<pm_dir>.pretraining/step_<n>`` (``n``:
the optimizer steps done): each an atomic, verified checkpoint
(:mod:`augfl_jax.storage.checkpoint`: a CRC-32 of every array and of the
metadata). The newest two are kept, and the directory is removed once the
PM is saved.

Each records what is pretrained: :func:`~augfl_jax.pm.metadata.pm_metadata`
(dataset, architecture, server split, recipe, the number of epochs and the
seed included, format) and a SHA-256 of the server split's arrays
(:func:`~augfl_jax.pm.pretrain.data_digest`). A checkpoint of anything else
is refused in one line (:class:`~augfl_jax.pm.metadata.PMCheckpointMismatch`),
never continued. A damaged one (a truncated or altered array, unreadable
metadata, a directory renamed from another step) is set aside as
``step_<n>.damaged``, saying so in one line, and the one before it is
continued from, or pretraining starts from the beginning.

Only the holder of the PM's lock (:func:`augfl_jax.pm.store.pretrain_and_save`)
uses the directory.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Callable, Mapping

from augfl_jax.pm.metadata import PMCheckpointMismatch, check_match
from augfl_jax.storage import checkpoint

__all__ = ["PretrainingCheckpoints", "pretraining_dir"]

_STEP = re.compile(r"step_(\d+)")
# The metadata key of what is pretrained; the server split's digest in it.
_IDENTITY = "pretraining"
_DIGEST = "server_digest"


def pretraining_dir(pm_dir: str | os.PathLike) -> str:
  """``<pm_dir>.pretraining`` (absolute): where the pretraining of the PM
  at ``pm_dir`` keeps its checkpoints."""
  return os.path.abspath(os.path.expanduser(os.fspath(pm_dir))) + (
      ".pretraining")


def _reason(e: BaseException) -> str:
  """The first line of an exception's message, at most 200 characters."""
  text = str(e).strip()
  return text.splitlines()[0][:200] if text else type(e).__name__


class PretrainingCheckpoints:
  """The checkpoints of the pretraining of the PM at ``pm_dir`` (module
  docstring); the ``checkpoints`` of
  :func:`~augfl_jax.pm.pretrain.pretrain`.

  Args:
    pm_dir: where the PM will be saved.
    expected: :func:`~augfl_jax.pm.metadata.pm_metadata` of the PM being
      pretrained (its compared fields).
    server_digest: :func:`~augfl_jax.pm.pretrain.data_digest` of its server
      split.
    log: told about each damaged checkpoint set aside.
    keep: how many of the newest are kept (>= 2, so that a damaged newest
      one has a predecessor).
  """

  def __init__(self, pm_dir: str | os.PathLike, expected: Mapping[str, Any],
               server_digest: str, log: Callable[[str], None], keep: int = 2):
    if keep < 2:
      raise ValueError(f"keep must be >= 2, got {keep}")
    self.directory = pretraining_dir(pm_dir)
    self._expected, self._digest = dict(expected), server_digest
    self._log, self._keep = log, keep
    checkpoint.quiet_closed_loop_callbacks()  # a damaged one: one line

  def _path(self, step: int) -> str:
    return os.path.join(self.directory, f"step_{step}")

  def steps(self) -> list[int]:
    """The saved steps (optimizer steps done), ascending."""
    if not os.path.isdir(self.directory):
      return []
    return sorted(int(m.group(1)) for name in os.listdir(self.directory)
                  if (m := _STEP.fullmatch(name)))

  def _check_identity(self, path: str, meta: Mapping[str, Any]) -> None:
    """Refuses (``PMCheckpointMismatch``) the checkpoint at ``path`` when
    its metadata ``meta`` is of another pretraining."""
    remedy = (f"remove {self.directory} to pretrain from the beginning, or "
              "pass another --pm.dir")
    saved = meta.get(_IDENTITY)
    if not isinstance(saved, dict):
      raise PMCheckpointMismatch(
          f"{path} is not a PM pretraining checkpoint: {remedy}")
    check_match(path, saved, self._expected,
                what="the PM pretraining checkpoint", remedy=remedy)
    if saved.get(_DIGEST) != self._digest:
      raise PMCheckpointMismatch(
          f"the PM pretraining checkpoint at {path} was saved while "
          "pretraining on other server data (the SHA-256 of its examples, "
          f"labels and masks differs): {remedy}")

  def restore(self, like: Any) -> tuple[Any, dict[str, Any]] | None:
    """The newest checkpoint that reads back whole: ``(state, metadata)``
    (``metadata``: ``steps_done``, ``seconds``), ``None`` where there is
    none. Damaged ones are set aside on the way (module docstring); what
    unfinished saves left is removed first.

    Args:
      like: the state's structure (arrays or ``jax.ShapeDtypeStruct``).

    Raises:
      PMCheckpointMismatch: a readable checkpoint is of another
        pretraining.
    """
    if os.path.isdir(self.directory):
      for name in os.listdir(self.directory):
        if ".orbax-checkpoint-tmp" in name:
          shutil.rmtree(os.path.join(self.directory, name),
                        ignore_errors=True)
    steps = self.steps()
    for i in range(len(steps) - 1, -1, -1):
      path = self._path(steps[i])
      try:
        meta = checkpoint.restore_metadata(path)
        self._check_identity(path, meta)
        if meta.get("steps_done") != steps[i]:
          raise checkpoint.DamagedCheckpointError(
              f"it records {meta.get('steps_done')} steps done, not "
              f"{steps[i]}: renamed or copied from another step")
        state, meta = checkpoint.restore(path, like)
        return state, meta
      except PMCheckpointMismatch:
        raise
      except (OSError, ValueError) as e:  # damaged: unreadable, altered
        aside = f"{path}.damaged"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(path, aside)
        self._log(f"the PM pretraining checkpoint {path} is damaged "
                  f"({_reason(e)}); set aside as {aside}, "
                  + ("trying the one before it" if i else
                     "pretraining from the beginning"))
    return None

  def save(self, state: Any, *, steps_done: int, seconds: float) -> None:
    """Saves ``state`` as step ``steps_done`` (``seconds``: of pretraining
    in all) and removes all but the newest ``keep`` steps.

    Raises:
      OSError: the checkpoint cannot be written (a full disk): one line
        naming the directory.
    """
    metadata = {_IDENTITY: {**self._expected, _DIGEST: self._digest},
                "steps_done": steps_done, "seconds": seconds}
    try:
      checkpoint.save(self._path(steps_done), state, metadata,
                      overwrite=True)
    except Exception as e:  # pylint: disable=broad-except
      raise OSError(f"saving a PM pretraining checkpoint in "
                    f"{self.directory} failed ({_reason(e)})") from None
    for step in self.steps()[:-self._keep]:
      shutil.rmtree(self._path(step), ignore_errors=True)

  def remove(self) -> None:
    """Removes the directory (the PM is saved)."""
    shutil.rmtree(self.directory, ignore_errors=True)
