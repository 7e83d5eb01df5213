"""Where a run's wall time goes: :class:`Phases`, which ``summary.json``
records as ``phase_seconds`` (and ``wall_seconds``, their sum).

A run (``training.run``) times its phases with ``time.perf_counter`` at the
boundaries it has anyway, and adds no device synchronisation: a jitted call
is timed until the host holds its output where the run pulls it anyway (a
round's metrics, which it checks and logs; an evaluation's scores), so the
device's work is counted in the phase that waits for it. Each second goes
to the innermost phase being timed (:meth:`Phases.timed` leaves out what
the phases inside it took) and ``setup`` gets the rest, so the phases sum
to the run's wall time, from its call to its summary (:data:`PHASES`):

* ``setup``: all that no other phase holds: the arguments checked, the
  directory locked and its files written, the data loaded and
  partitioned, the model initialised, the algorithm built;
* ``pm``: the PM taking its role (``pm_roles.wire``): loaded from
  ``pm.dir``, or pretrained on the server split, and wired in (the
  regulariser built, ...); absent without a PM;
* ``first_round``: the session's first round, compiling included (or the
  program read from the persistent compilation cache): JAX compiles the
  round at its first call, so the two are not told apart;
* ``rounds``: the other rounds, with their lines and TensorBoard events;
* ``first_<name>_eval``, ``<name>_eval``: the evaluation ``name``
  (``heldout``: the held-out clients; ``test_split``: the test-split
  clients' scoring): its first call of the session, compiling included,
  then the others, each with its record written;
* ``checkpoints``: restoring a resumed run's checkpoint, saving them (orbax
  copies the state to the host, then writes it in the background: what
  overlaps the rounds is counted in theirs) and waiting for the last save;
* ``unattributed``: the time before the checkpoint a run resumed from when
  that checkpoint records no phases (an older version): its ``seconds``.

A resumed run's phases are its checkpoint's (the sessions before it, up to
the save of that checkpoint) plus this session's, which has its own setup
and its own first round and first evaluations: what a stopped session did
after its last checkpoint, trained again now, is not counted, as the run's
``seconds`` do not count it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Mapping

__all__ = ["PHASES", "Phases", "eval_phase", "ordered"]

# The phases in the order a run goes through them; an evaluation of one's
# own adds its two (:func:`eval_phase`).
PHASES = ("setup", "pm", "first_round", "rounds", "first_heldout_eval",
          "heldout_eval", "first_test_split_eval", "test_split_eval",
          "checkpoints", "unattributed")


def eval_phase(name: str, first: bool) -> str:
  """The phase of evaluation ``name``'s call: its ``first`` of the session
  (compiling included), or another."""
  return f"first_{name}_eval" if first else f"{name}_eval"


def ordered(names) -> list[str]:
  """``names`` in :data:`PHASES`' order, any other (an evaluation of one's
  own) before ``checkpoints``, by name."""
  names = set(names)
  known = [n for n in PHASES if n in names]
  others = sorted(names - set(PHASES))
  at = known.index("checkpoints") if "checkpoints" in known else len(known)
  return known[:at] + others + known[at:]


class Phases:
  """The seconds of a run's phases (module docstring), from its creation,
  the run's start, on.

  Args:
    before: the phases of the sessions before this one (a resumed run's
      checkpoint's), added to this session's; :meth:`carry` sets them
      later.
    clock: the clock, in seconds (``time.perf_counter``).
  """

  def __init__(self, before: Mapping[str, float] | None = None,
               clock: Callable[[], float] = time.perf_counter):
    self.clock = clock
    self.start = clock()
    self.before = dict(before or {})
    self._seconds: dict[str, float] = {}
    self._recorded = 0.0  # the sum of _seconds
    self._open: list[tuple[str, float, float]] = []  # (name, start, recorded)

  def carry(self, before: Mapping[str, float]) -> None:
    """Adds ``before``, the phases of the sessions before this one, to what
    :meth:`seconds` reports."""
    self.before = dict(before)

  @contextlib.contextmanager
  def timed(self, name: str) -> Iterator[None]:
    """Counts the block's time as phase ``name``, less what the phases
    timed inside it took (also when it raises)."""
    self._open.append((name, self.clock(), self._recorded))
    try:
      yield
    finally:
      _, start, recorded = self._open.pop()
      self._add(name, self.clock() - start - (self._recorded - recorded))

  def _add(self, name: str, seconds: float) -> None:
    self._seconds[name] = self._seconds.get(name, 0.0) + seconds
    self._recorded += seconds

  def seconds(self) -> dict[str, float]:
    """Every phase's seconds until now (ms rounded), in :func:`ordered`
    order: the sessions' before this one (:meth:`carry`) plus this one's,
    the blocks still open counted as if they closed now, ``setup`` the rest
    of this session's wall time. They sum to the wall time."""
    now = self.clock()
    seconds, recorded = dict(self._seconds), self._recorded
    for name, start, before in reversed(self._open):
      spent = now - start - (recorded - before)
      seconds[name] = seconds.get(name, 0.0) + spent
      recorded += spent
    seconds["setup"] = seconds.get("setup", 0.0) + now - self.start - recorded
    total = {n: self.before.get(n, 0.0) + seconds.get(n, 0.0)
             for n in set(seconds) | set(self.before)}
    return {n: round(total[n], 3) for n in ordered(total)}
