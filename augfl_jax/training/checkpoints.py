"""A run's numbered checkpoints: orbax's ``CheckpointManager``, verified.

``<dir>/step_<round>/`` holds two items: ``state`` (the whole run state: the
algorithm's server and stacked client state, the regulariser's state, PRNG
keys) and ``meta`` (JSON: the round, the configuration, the training losses
not yet reported, the seconds spent, and a CRC-32 of every array of
``state``). orbax writes each step to a temporary directory and renames it
into place, saves in the background (the arrays are copied to the host
before :meth:`RunCheckpoints.save` returns) and keeps the newest ``keep``
steps. :meth:`RunCheckpoints.restore` checks the CRCs and falls back to the
previous step, saying so, when the newest is truncated or corrupt.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

__all__ = ["CheckpointError", "RunCheckpoints", "checksums"]


class CheckpointError(ValueError):
  """No checkpoint of the run can be restored (one line: which, and why)."""


def checksums(tree: Any) -> dict[str, int]:
  """``{leaf path: CRC-32 of its bytes}`` (typed PRNG keys by their data)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
        leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    out[jax.tree_util.keystr(path)] = zlib.crc32(
        np.ascontiguousarray(jax.device_get(leaf)).tobytes())
  return out


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
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=("state", "meta"),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, step_prefix="step", create=False,
            enable_async_checkpointing=True,
            cleanup_tmp_directories=True))

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
    donated); :meth:`wait` waits for the files."""
    os.makedirs(self.directory, exist_ok=True)
    # A copy taken now: the save runs in the background, and the caller may
    # change what ``meta`` holds (the loop appends to its pending losses).
    meta = json.loads(json.dumps({**meta, "checksums": checksums(state)}))
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        force=True)
    return self.path(step)

  def wait(self) -> None:
    """Waits until every started save is on disk."""
    self._manager.wait_until_finished()

  def read_meta(self, step: int) -> dict[str, Any]:
    """A step's ``meta`` item alone (no arrays read)."""
    return self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))["meta"]

  def restore(self, like: Any, log: Callable[[str], None]
             ) -> tuple[int, Any, dict[str, Any]]:
    """The newest step that reads back whole: ``(step, state, meta)``.

    Args:
      like: the state's structure (arrays or ``jax.ShapeDtypeStruct``).
      log: told about each step skipped and why.

    Raises:
      CheckpointError: no step reads back whole.
    """
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                       sharding=getattr(x, "sharding", None)),
        like)
    problems = []
    for step in reversed(self.steps()):
      try:
        item = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            meta=ocp.args.JsonRestore()))
        state, meta = item["state"], item["meta"]
        bad = [k for k, v in checksums(state).items()
               if meta.get("checksums", {}).get(k) != v]
        if bad:
          raise ValueError(f"checksum mismatch in {', '.join(bad[:3])}")
      except Exception as e:  # pylint: disable=broad-except
        reason = str(e).strip().splitlines()[0][:200] if str(e) else (
            type(e).__name__)
        problems.append(f"step {step}: {reason}")
        log(f"checkpoint {self.path(step)} is damaged ({reason}); trying "
            "the one before it")
        continue
      return step, state, meta
    raise CheckpointError(
        f"no checkpoint in {self.directory} reads back whole ("
        f"{'; '.join(problems) or 'there is none'}); pass --overwrite to "
        "start the run again")

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
