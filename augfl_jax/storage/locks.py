"""Exclusive locks on files (``flock``): one writer per output directory,
one process pretraining a PM.

The holder's process id is written into the lock file, for the message of
whoever finds the lock taken. The kernel drops a lock when its holder dies
(any signal, ``kill -9``), so a stale lock never blocks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from typing import Callable, Iterator

__all__ = ["hold", "try_lock"]


def try_lock(path: str) -> tuple[int | None, str]:
  """Takes the exclusive lock on the file ``path`` (created, with its
  directory, if needed) without waiting.

  Returns:
    ``(fd, "")`` when taken (this process's id written in the file; closing
    ``fd`` releases it), ``(None, holder)`` when another process holds it
    (``holder``: its id, or ``"?"``).

  Raises:
    OSError: the file cannot be created or written (a full disk names
      ``path``).
  """
  while True:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
      os.close(fd)
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      return None, holder or "?"
    # The holder we waited for may have removed the file (and its
    # directory) before releasing it: a lock on a removed file is no lock.
    try:
      same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
  except OSError as e:
    os.close(fd)
    raise OSError(e.errno, e.strerror, path) from None
  return fd, ""


@contextlib.contextmanager
def hold(path: str, on_busy: Callable[[str], None],
         poll_seconds: float = 0.5) -> Iterator[None]:
  """Holds the lock on ``path`` for the block, waiting while another
  process holds it: ``on_busy(holder)`` is called before each wait of
  ``poll_seconds`` (it may raise, to stop waiting)."""
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
