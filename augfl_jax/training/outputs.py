"""A run's output directory: one writer, only its own files, atomic writes.

* **One writer.** :meth:`OutputDir.lock` takes an exclusive ``flock`` on
  ``<dir>/.augfl_jax.lock`` for the whole run; a second run into the same
  directory fails at once naming the holder. The kernel drops the lock when
  its process dies (any signal, ``kill -9``), so a stale lock never blocks.
  A lock path that is a symbolic link or not a lock file is refused in one
  line, untouched (``storage.locks``).
* **Only its own files.** A run records what it writes in the manifest
  ``<dir>/.augfl_jax.json``; ``overwrite`` removes only the files named there
  and a directory holding any other file (or files of these names that no
  manifest claims) is refused, never cleared. A damaged manifest is named,
  with the command that restores it.
* **Atomic files.** JSON files are written to a temporary sibling, synced
  and renamed into place (:func:`replacing`, which the commands around a
  run use for their tables and figures too); ``metrics.jsonl`` and
  ``changes.jsonl`` are rewritten the same way when a run resumes, from its
  checkpoint, and read tolerantly (a torn last line is dropped, naming the
  file).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import tempfile
import uuid
from typing import Any, Callable, Iterator

from augfl_jax.storage import locks

__all__ = ["OWN_FILES", "OutputDir", "OutputDirError", "PeerOutputDir",
           "replacing", "write_json_atomic", "write_text_atomic"]

# What a run writes (``tb/``: TensorBoard events).
OWN_FILES = ("config.json", "partition.txt", "metrics.jsonl", "summary.json",
             "checkpoints", "tb", "changes.jsonl")
MANIFEST = ".augfl_jax.json"
LOCK = ".augfl_jax.lock"
# What the project's commands write beside a run (experiments.ood: FedOA's
# personal accuracy): neither the run's own files nor another's.
BESIDE_RUN = ("personal.json",)
# Prefixes of this module's temporary files (a crash may leave one).
TEMPORARY = (".tmp-", ".probe-")
# The remedy for a run's file that is torn or not the run's own: a resumed
# run writes config.json, metrics.jsonl, changes.jsonl and summary.json
# again from its newest checkpoint.
REWRITE = ("run the run's command again with --resume, which writes it "
           "again from the run's newest checkpoint")


class OutputDirError(ValueError):
  """The output directory cannot be used (in use, holds foreign files, not
  writable); the message is one line saying what to do."""


def _fsync_dir(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
  """Yields the name of a new temporary sibling of ``path`` to write
  (:data:`TEMPORARY`'s ``.tmp-`` prefix, ``path``'s suffix kept); when the
  block ends, the file is synced and renamed onto ``path``: readers see the
  old file or the new one, never a torn one. An error in the block or in
  the rename removes the temporary file and leaves ``path`` as it was; an
  ``OSError`` is raised again naming ``path`` (not the temporary)."""
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                     f"-{os.path.basename(path)}")
  try:
    yield tmp
    fd = os.open(tmp, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(directory)
  except BaseException as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    if isinstance(e, OSError) and e.errno is not None:
      raise OSError(e.errno, e.strerror or str(e), path) from None
    raise


def write_text_atomic(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` through a synced temporary sibling and a
  rename (:func:`replacing`): readers see the old file or the new one,
  never a torn one."""
  with replacing(path) as tmp:
    with open(tmp, "x") as f:
      f.write(text)


def write_json_atomic(path: str, obj: Any) -> None:
  """:func:`write_text_atomic` of ``obj`` as strict JSON (NaN refused)."""
  write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True,
                                     allow_nan=False) + "\n")


class OutputDir:
  """The directory a run writes to (see the module docstring)."""

  writes = True  # False: :class:`PeerOutputDir`

  def __init__(self, path: str):
    self.path = path

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def check_writable(self) -> None:
    """Creates the directory if needed and checks a file can be written
    there; ``OutputDirError`` in one line otherwise (a file in the way, a
    read-only or full file system)."""
    try:
      os.makedirs(self.path, exist_ok=True)
      with tempfile.NamedTemporaryFile(dir=self.path, prefix=".probe-") as f:
        f.write(b"\0")  # an empty file needs no room on the disk
        f.flush()
        os.fsync(f.fileno())
    except OSError as e:
      raise OutputDirError(
          f"--output_dir {self.path} cannot be written: "
          f"{e.strerror or e}") from None

  @contextlib.contextmanager
  def lock(self, remove_if_unused: bool = False) -> Iterator[None]:
    """Holds the directory's exclusive lock (module docstring).

    Args:
      remove_if_unused: on leaving, remove the directory when it holds
        nothing but the lock file (a run that created it and failed before
        writing anything); done while the lock is still held, so that it
        never removes a directory another run has locked.
    """
    path = self.file(LOCK)
    try:
      fd, holder = locks.try_lock(path)
    except locks.LockFileError as e:  # a link, or not a lock file
      raise OutputDirError(str(e)) from None
    except OSError as e:
      raise OutputDirError(f"--output_dir {self.path} cannot be written: "
                           f"{e.strerror or e}") from None
    if fd is None:
      raise OutputDirError(
          f"{self.path} is in use by another run (process {holder}); wait "
          "for it to finish or choose another --output_dir")
    try:
      yield
    finally:
      try:
        if remove_if_unused and os.listdir(self.path) == [LOCK]:
          os.remove(path)
          os.rmdir(self.path)
      except OSError:
        pass
      finally:
        os.close(fd)  # releases the lock

  def own_files(self) -> list[str]:
    """The names the manifest says a run of this tool wrote here.

    Raises:
      OutputDirError: the manifest is damaged (one line naming it and the
        command that restores it).
    """
    path = self.file(MANIFEST)
    if not os.path.exists(path):
      return []
    try:
      with open(path) as f:
        return [n for n in json.load(f)["files"] if n in OWN_FILES]
    except (ValueError, KeyError, TypeError):
      restore = json.dumps({"files": list(OWN_FILES)})
      raise OutputDirError(
          f"{path}, the list of the files augfl_jax wrote in {self.path}, "
          "is damaged (empty or cut short: a crash or a full disk while it "
          "was written); if the directory holds a run of augfl_jax and "
          f"nothing of yours, restore it with: echo {shlex.quote(restore)} "
          f"> {shlex.quote(path)}; else choose another --output_dir"
      ) from None

  def present(self) -> list[str]:
    """The names of :data:`OWN_FILES` that exist in the directory."""
    return [n for n in OWN_FILES if os.path.lexists(self.file(n))]

  def foreign(self) -> list[str]:
    """The files a run may not touch: those with the names a run writes
    that no manifest claims, and any other file but the manifest, the lock,
    :data:`BESIDE_RUN` and this module's temporary files."""
    own = set(self.own_files())
    known = set(OWN_FILES) | {MANIFEST, LOCK} | set(BESIDE_RUN)
    others = sorted(n for n in os.listdir(self.path) if n not in known
                    and not n.startswith(TEMPORARY))
    return [n for n in self.present() if n not in own] + others

  def claim(self) -> None:
    """Records in the manifest that this run writes :data:`OWN_FILES`."""
    write_json_atomic(self.file(MANIFEST), {"files": list(OWN_FILES)})

  def clear_own(self) -> None:
    """Removes the files the manifest claims (never any other file)."""
    for name in self.own_files():
      path = self.file(name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      elif os.path.lexists(path):
        os.remove(path)

  def write_json(self, name: str, obj: Any) -> None:
    write_json_atomic(self.file(name), obj)

  def write_text(self, name: str, text: str) -> None:
    write_text_atomic(self.file(name), text)

  @staticmethod
  def record_line(record: dict[str, Any]) -> str:
    """One ``.jsonl`` line (strict JSON: NaN refused)."""
    return json.dumps(record, allow_nan=False) + "\n"

  def read_json(self, name: str) -> Any:
    """A JSON file of the run; an empty or torn one raises
    ``OutputDirError`` naming it."""
    path = self.file(name)
    try:
      with open(path) as f:
        return json.load(f)
    except ValueError as e:
      raise OutputDirError(
          f"{path} is not readable JSON ({e}); it was cut short (a full "
          f"disk?): {REWRITE}") from None

  def read_records(self, name: str, log: Callable[[str], None], *,
                   tolerant: bool = False) -> list[dict[str, Any]]:
    """The lines of a ``.jsonl`` file; a torn LAST line (a crash mid-write)
    is dropped with a message naming the file; a torn line elsewhere raises
    ``OutputDirError`` (``tolerant``: is dropped with a message too, for a
    file that is about to be rewritten from another copy)."""
    path = self.file(name)
    if not os.path.exists(path):
      return []
    with open(path, errors="replace") as f:
      lines = [line for line in f.read().split("\n") if line.strip()]
    records = []
    for i, line in enumerate(lines):
      try:
        record = json.loads(line)
        if not isinstance(record, dict):
          raise ValueError("not a JSON object")
        records.append(record)
      except ValueError:
        if i == len(lines) - 1:
          log(f"{path}: dropped its last line, cut short by a crash "
              f"({line[:40]!r}...)")
        elif tolerant:
          log(f"{path}: dropped line {i + 1}, which is not JSON")
        else:
          raise OutputDirError(f"{path}: line {i + 1} is not JSON; the file "
                               f"is damaged: {REWRITE}") from None
    return records

  def write_records(self, name: str, records: list[dict[str, Any]]) -> None:
    """Rewrites a ``.jsonl`` file atomically."""
    write_text_atomic(self.file(name),
                      "".join(self.record_line(r) for r in records))


class PeerOutputDir(OutputDir):
  """The run directory as a process other than the writer of a run across
  processes sees it (``augfl_jax.processes``): it reads the directory as
  :class:`OutputDir` does, and takes no lock and writes nothing, since
  process 0 holds the lock and writes every file."""

  writes = False

  def check_writable(self) -> None:
    pass

  @contextlib.contextmanager
  def lock(self, remove_if_unused: bool = False) -> Iterator[None]:
    del remove_if_unused
    yield

  def claim(self) -> None:
    pass

  def clear_own(self) -> None:
    pass

  def write_json(self, name: str, obj: Any) -> None:
    pass

  def write_text(self, name: str, text: str) -> None:
    pass

  def write_records(self, name: str, records: list[dict[str, Any]]) -> None:
    pass
