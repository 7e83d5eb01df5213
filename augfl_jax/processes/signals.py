"""Stop signals: SIGINT and SIGTERM taken by the code that runs, between its
steps, instead of ending the process (:class:`StopSignals`). The count of
the signals taken is what the watchdog of a run across processes reads
(``group.Watchdog.watch_signals``) to end a process whose main thread
cannot take one.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["StopSignals"]


class StopSignals:
  """Context manager: SIGINT/SIGTERM set ``signum`` instead of stopping the
  process (a second one raises ``KeyboardInterrupt``); main thread only.

  Nothing is dropped: entered inside another ``StopSignals`` (a sweep around
  its runs), it takes over the outer one's pending signal; a signal still
  pending when the block ends without an exception (it came too late to
  stop anything early, e.g. in a run's last round) is raised again for the
  handler that was there before (the outer ``StopSignals``, or Python's
  ``KeyboardInterrupt``), unless the caller has taken it (:meth:`take`).
  """

  # How many signals the handlers of all StopSignals have taken (a run
  # across processes checks that its signals are: processes.group).
  taken = 0

  def __init__(self):
    self.signum, self._old = None, {}

  def _handle(self, signum, frame):
    del frame
    StopSignals.taken += 1
    if self.signum is not None:
      raise KeyboardInterrupt
    self.signum = signum

  def take(self) -> int | None:
    """The pending signal, if any, now the caller's to act on."""
    signum, self.signum = self.signum, None
    return signum

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in (signal.SIGINT, signal.SIGTERM):
        self._old[s] = signal.signal(s, self._handle)
      outer = getattr(self._old[signal.SIGINT], "__self__", None)
      if isinstance(outer, StopSignals):
        self.signum = outer.take()
    return self

  def __exit__(self, exc_type, *exc):
    for s, handler in self._old.items():
      signal.signal(s, handler)
    if self._old and exc_type is None and self.signum is not None:
      signal.raise_signal(self.signum)
