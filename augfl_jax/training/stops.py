"""The exceptions a run stops with before its last round: a signal
(:class:`RunInterrupted`; the signals themselves are taken by
``augfl_jax.processes.signals.StopSignals``) and a NaN or inf
(:class:`NonFiniteError`, after ``guard.keep_finite`` kept the last finite
state). Each is raised once the run's state is saved; its message is one
line saying where, and how the same command continues.
"""

from __future__ import annotations

__all__ = ["NonFiniteError", "RunInterrupted"]


class RunInterrupted(Exception):
  """SIGINT or SIGTERM stopped the run; its state, if any, was saved.

  Attributes: ``signum``, ``round`` (the last completed round) and
  ``checkpoint`` (the checkpoint the stop saved; ``None`` before round 1,
  and after a run the signal came too late to stop, which ended as usual).
  """

  def __init__(self, message: str, signum: int, round_: int,
               checkpoint_path: str | None):
    super().__init__(message)
    self.signum, self.round, self.checkpoint = signum, round_, checkpoint_path


class NonFiniteError(FloatingPointError):
  """A round or an evaluation produced a NaN or inf (the last good state
  was saved first)."""
