"""Time per step and time left for a loop of known length (rounds, epochs).

The first step of a jitted loop includes compilation, so the rate is taken
over the steps after it; until a second step is done there is no estimate::

  progress = Progress(total=300, done=start_round)
  ...after each round...
  progress.step()
  log(f"round {r}/300  {progress.describe('round')}")   # 3.61 s/round, 17m58s left
  if (estimate := progress.long_estimate("round")):     # once, over an hour
    log(f"the rounds will take long: {estimate}")

Counts in messages read ``counted(1, "epoch")`` -> ``1 epoch``,
``counted(3, "round")`` -> ``3 rounds``.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["LONG_SECONDS", "Progress", "counted", "format_duration"]

# An estimated time left above this is said once, as soon as it is known.
LONG_SECONDS = 3600.0


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


def counted(n: int, noun: str) -> str:
  """``1 epoch``, ``0 epochs``, ``2 epochs`` (a regular plural)."""
  return f"{n} {noun}{'' if n == 1 else 's'}"


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
    self._long_said = False
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
    if self.seconds_per_step is None:
      return f"{self._clock() - self.started:.1f} s so far"
    return f"{self._rate(unit)}, {format_duration(self.seconds_left)} left"

  def _rate(self, unit: str) -> str:
    """``"3.61 s/round"`` (once there is a rate)."""
    rate = self.seconds_per_step
    return f"{rate:.3g} s/{unit}" if rate < 100 else f"{rate:.0f} s/{unit}"

  def long_estimate(self, unit: str, threshold: float | None = None
                   ) -> str | None:
    """Once: the first time the estimated time left is known (after the
    second step) and exceeds ``threshold`` seconds (default
    :data:`LONG_SECONDS`), ``"an estimated 2d04h for the 33838 steps left
    (5.61 s/step, timed after the first)"``; ``None`` at every other call,
    so a loop may ask after every step."""
    left = self.seconds_left
    if self._long_said or left is None:
      return None
    self._long_said = True  # the first estimate decides
    if left <= (LONG_SECONDS if threshold is None else threshold):
      return None
    return (f"an estimated {format_duration(left)} for the "
            f"{counted(self.total - self.done, unit)} left "
            f"({self._rate(unit)}, timed after the first)")
