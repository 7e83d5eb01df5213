"""Exclusive locks on files (``flock``): one writer per output directory,
one process pretraining a PM.

The holder's process id is written into the lock file, for the message of
whoever finds the lock taken. The kernel drops a lock when its holder dies
(any signal, ``kill -9``), so a stale lock never blocks.

A lock never follows a symbolic link and never cuts a file short: a lock
file is created new (``O_EXCL``), or, when a run before left it, taken only
if it is a regular file of one link that reads as a lock file (a process id
or nothing, at most :data:`MAX_BYTES` bytes), and the id is written over it
padded to its length. Any other file at the lock's path is refused
(:class:`LockFileError`), untouched, so that a directory received from
someone else cannot make a run overwrite a file its lock points to.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import time
from typing import Callable, Iterator

__all__ = ["hold", "LockFileError", "MAX_BYTES", "try_lock"]

MAX_BYTES = 64  # the most a lock file holds: a process id and spaces

_LOCK_TEXT = re.compile(rb"\s*\d*\s*")
# Opened without following a link, and without blocking on a FIFO or a
# device (refused once ``fstat`` shows what it is).
_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK


class LockFileError(OSError):
  """The lock's path holds something other than a lock file (a symbolic
  link, a directory, a file with other names or other content): one line
  naming it, which ``str`` gives alone."""

  def __str__(self) -> str:
    return str(self.strerror)


def _refuse(path: str, what: str, code: int = errno.EEXIST) -> LockFileError:
  """The one-line refusal of the lock path ``path``, which ``what``."""
  return LockFileError(code, f"the lock file {path} {what}; it was left "
                       "untouched: remove it or choose another directory",
                       path)


def _check(fd: int, path: str) -> None:
  """Refuses (``LockFileError``) the opened ``fd`` unless it is a regular
  file of one link that reads as a lock file."""
  info = os.fstat(fd)
  if not stat.S_ISREG(info.st_mode):
    raise _refuse(path, "is not a regular file")
  if info.st_nlink != 1:
    raise _refuse(path, f"has {info.st_nlink} hard links (writing it would "
                  "change the file under its other names)", errno.EMLINK)
  if info.st_size > MAX_BYTES:
    raise _refuse(path, f"holds {info.st_size} bytes, not a process id")
  if not _LOCK_TEXT.fullmatch(os.pread(fd, MAX_BYTES + 1, 0)):
    raise _refuse(path, "holds something other than a process id")


def _open(path: str) -> int | None:
  """``path`` opened read-write: created new, or the lock file a run before
  left (checked, :func:`_check`); ``None`` when it vanished meanwhile."""
  try:
    return os.open(path, _FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
  except FileExistsError:
    pass
  try:
    if stat.S_ISLNK(os.lstat(path).st_mode):
      raise _refuse(path, "is a symbolic link, which a lock never "
                    "follows", errno.ELOOP)
    fd = os.open(path, _FLAGS)
  except FileNotFoundError:
    return None
  except OSError as e:
    if isinstance(e, LockFileError):
      raise
    if e.errno == errno.ELOOP:  # it became a link after lstat
      raise _refuse(path, "is a symbolic link, which a lock never "
                    "follows", errno.ELOOP) from None
    if e.errno == errno.EISDIR:
      raise _refuse(path, "is not a regular file") from None
    raise
  try:
    _check(fd, path)
  except BaseException:
    os.close(fd)
    raise
  return fd


def try_lock(path: str) -> tuple[int | None, str]:
  """Takes the exclusive lock on the file ``path`` (created, with its
  directory, if needed) without waiting.

  Returns:
    ``(fd, "")`` when taken (this process's id written in the file; closing
    ``fd`` releases it), ``(None, holder)`` when another process holds it
    (``holder``: its id, or ``"?"``).

  Raises:
    LockFileError: ``path`` is a symbolic link, not a regular file, a file
      with other hard links or one that is not a lock file (module
      docstring); it is left as it is.
    OSError: the file cannot be created or written (a full disk names
      ``path``).
  """
  while True:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = _open(path)
    if fd is None:  # removed between the two opens: try again
      continue
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.pread(fd, MAX_BYTES, 0).decode(errors="replace").strip()
      os.close(fd)
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      return None, holder or "?"
    # The holder we waited for may have removed the file (and its
    # directory) before releasing it, or something else may now stand at
    # ``path``: a lock on a file that is not there is no lock.
    try:
      same = os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)
  try:
    # Written over the old id, padded to its length: never cut short.
    text = str(os.getpid())
    text = text.ljust(os.fstat(fd).st_size - 1) + "\n"
    os.pwrite(fd, text.encode(), 0)
  except OSError as e:
    os.close(fd)
    raise OSError(e.errno, e.strerror, path) from None
  return fd, ""


@contextlib.contextmanager
def hold(path: str, on_busy: Callable[[str], None],
         poll_seconds: float = 0.5) -> Iterator[None]:
  """Holds the lock on ``path`` for the block, waiting while another
  process holds it: ``on_busy(holder)`` is called before each wait of
  ``poll_seconds`` (it may raise, to stop waiting).

  Raises:
    LockFileError: ``path`` is not a lock file (:func:`try_lock`).
  """
  while True:
    fd, holder = try_lock(path)
    if fd is not None:
      break
    on_busy(holder)
    time.sleep(poll_seconds)
  try:
    yield
  finally:
    os.close(fd)
