"""Time per step and time left for a loop of known length (rounds, epochs),
and a live progress line on a terminal.

The first step of a jitted loop includes compilation, and a later one may
include a one-time cost (the first evaluation's compilation, a checkpoint,
an evaluation between two steps): the rate is the median time of the
:data:`RECENT` steps before, the first left out, so that the time left
counts neither; until a second step is done there is no estimate::

  progress = Progress(total=300, done=start_round)
  ...after each round...
  progress.step()
  log(f"round {r}/300  {progress.describe('round')}")   # 3.61 s/round, 17m58s left
  if (estimate := progress.long_estimate("round")):     # once, over an hour
    log(f"the rounds will take long: {estimate}")

Counts in messages read ``counted(1, "epoch")`` -> ``1 epoch``,
``counted(3, "round")`` -> ``3 rounds``; lists of ids ``some([3, 7, 12,
...])`` -> ``3, 7, 12 and 29 others``.

On a terminal, :class:`LiveLine` keeps a progress line at the bottom
(rich), redrawn at each step, while the lines printed meanwhile scroll
above it; a log file or a pipe gets the printed lines alone.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Any, Callable, Sequence

__all__ = ["LONG_SECONDS", "LiveLine", "Progress", "RECENT", "counted",
           "format_duration", "some"]

# An estimated time left above this is said once, as soon as it is known.
LONG_SECONDS = 3600.0
# The rate is the median time of this many recent steps.
RECENT = 20


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


def some(items: Sequence[Any], shown: int = 3) -> str:
  """``"3, 7, 12 and 29 others"``: the first ``shown`` items and how many
  more; ``"3, 7 and 12"`` when that is all of them."""
  items = [str(i) for i in items]
  if len(items) <= shown + 1:
    return (", ".join(items[:-1]) + " and " + items[-1]
            if len(items) > 1 else "".join(items))
  return f"{', '.join(items[:shown])} and {len(items) - shown} others"


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
    self._last_done_at: float | None = None
    self._recent: collections.deque[float] = collections.deque(
        maxlen=RECENT)
    self._long_said = False
    self.started = clock()

  def step(self, count: int = 1, timed: bool = True) -> None:
    """Records ``count`` more finished steps; ``timed=False``: their time
    (since the previous call) includes a one-time cost the caller knows
    of, such as an evaluation's compilation, and is not counted in the
    rate (nor is the first call's)."""
    self.done += count
    now = self._clock()
    if self._last_done_at is not None and timed:
      self._recent.append((now - self._last_done_at) / count)
    self._last_done_at = now

  @property
  def seconds_per_step(self) -> float | None:
    """The median time of the recent steps (:data:`RECENT`) after the
    first, ``None`` before there is one."""
    if not self._recent:
      return None
    return statistics.median(self._recent)

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


class LiveLine:
  """A progress line at the bottom of a terminal, redrawn in place by
  :meth:`update`, while the lines printed to stdout or stderr meanwhile
  scroll above it (rich's ``Live``); it is gone when the block ends.
  ``enabled=False`` (a log file, a pipe): nothing is shown and
  :meth:`update` does nothing.

  Args:
    enabled: whether to show it.
    console: the ``rich.console.Console`` it is drawn on (default: standard
      output's).
  """

  BAR = 20  # the bar's width in characters

  def __init__(self, enabled: bool, console: Any = None):
    self.enabled, self._console, self._live = enabled, console, None

  def __enter__(self) -> LiveLine:
    if self.enabled:
      from rich.console import Console  # pylint: disable=g-import-not-at-top
      from rich.live import Live  # pylint: disable=g-import-not-at-top
      self._live = Live(console=self._console or Console(), transient=True,
                        auto_refresh=False, redirect_stdout=True,
                        redirect_stderr=True)
      self._live.start()
    return self

  def update(self, fraction: float, text: str) -> None:
    """Shows a bar ``fraction`` (0 to 1) full, then ``text``."""
    if self._live is None:
      return
    from rich.text import Text  # pylint: disable=g-import-not-at-top
    fraction = min(max(fraction, 0.0), 1.0)
    full = round(fraction * self.BAR)
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("━" * full, style="green")
    line.append("━" * (self.BAR - full), style="grey37")
    line.append(f" {100 * fraction:3.0f}%  {text}")
    self._live.update(line, refresh=True)

  def __exit__(self, *exc) -> None:
    if self._live is not None:
      self._live.stop()
      self._live = None
