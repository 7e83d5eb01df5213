"""Time per step and time left for a loop of known length (rounds, epochs).

The first step of a jitted loop includes compilation, so the rate is taken
over the steps after it; until a second step is done there is no estimate::

  progress = Progress(total=300, done=start_round)
  ...after each round...
  progress.step()
  log(f"round {r}/300  {progress.describe('round')}")   # 3.61 s/round, 17m58s left
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
  """``42s``, ``12m05s``, ``3h07m``, ``2d04h`` (rounded down)."""
  s = int(max(seconds, 0.0))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  if s < 86400:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Progress:
  """Counts finished steps of a loop of ``total`` and times them.

  Args:
    total: the loop's length.
    done: steps finished before this process started (a resumed run).
    clock: seconds (tests pass a fake one).
  """

  def __init__(self, total: int, done: int = 0,
               clock: Callable[[], float] = time.perf_counter):
    self.total, self.done, self._clock = total, done, clock
    self._first_done_at: float | None = None
    self._timed_steps = 0
    self.started = clock()

  def step(self, count: int = 1) -> None:
    """Records ``count`` more finished steps."""
    self.done += count
    if self._first_done_at is None:
      self._first_done_at = self._clock()  # the first call compiles
    else:
      self._timed_steps += count

  @property
  def seconds_per_step(self) -> float | None:
    """Mean time of the steps after the first, ``None`` before there is
    one."""
    if not self._timed_steps:
      return None
    return (self._clock() - self._first_done_at) / self._timed_steps

  @property
  def seconds_left(self) -> float | None:
    """Estimated time to finish the loop (``None``: no estimate yet)."""
    rate = self.seconds_per_step
    return None if rate is None else rate * (self.total - self.done)

  def describe(self, unit: str) -> str:
    """``"3.61 s/round, 17m58s left"``; only the elapsed time before the
    second step (``"12.3 s so far"``)."""
    rate = self.seconds_per_step
    if rate is None:
      return f"{self._clock() - self.started:.1f} s so far"
    shown = f"{rate:.3g}" if rate < 100 else f"{rate:.0f}"
    return f"{shown} s/{unit}, {format_duration(self.seconds_left)} left"
