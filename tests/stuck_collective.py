"""A plug-in (``--imports=tests.stuck_collective``) that makes the
processes of a run go different ways: from its third decision on
(``processes.agree``, after each round), process 1 waits in a call that
never returns, while process 0 waits for it in the decision's collective.
Neither main thread can run a signal handler then. The path of
``$STUCK_MARKER`` is created when process 1 starts to wait, and
``$STUCK_MARKER.0`` when process 0 enters that collective (a test waits
for both: on a loaded machine process 0 may be rounds behind);
``processes.group.STUCK_SECONDS`` is 5 s."""

from __future__ import annotations

import os

from augfl_jax import processes
from augfl_jax.processes import group, jax_internals

group.STUCK_SECONDS = 5.0
_agree, _calls = processes.agree, [0]


def _agree_or_wait(value: int) -> int:
  _calls[0] += 1
  if _calls[0] >= 3:
    marker = os.environ["STUCK_MARKER"]
    with open(marker if processes.index() == 1 else marker + ".0", "w"):
      pass
    if processes.index() == 1:
      jax_internals.client().blocking_key_value_get(
          "stuck_collective/never", 3_600_000)
  return _agree(value)


processes.agree = _agree_or_wait
