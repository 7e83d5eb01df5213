"""What every benchmark command shares: its flags checked before any work.

:func:`run` defines a command's flags and runs its ``main`` as the
experiment commands run theirs (``augfl_jax.commands.runner``): a value
that a flag refuses is one line on stderr naming the flag, the value and
what it accepts, with exit code 2, before anything is computed;
``--help`` prints the command's description and its own flags and exits
0; a user error that ``main`` raises (``runner.USER_ERRORS``: a dataset
that is not there, a file that cannot be written) is one line and exit
code 2.

A flag refuses a value by absl's own means where they fit
(``DEFINE_integer(..., lower_bound=1)``, ``DEFINE_enum``) and otherwise by
a validator registered here, after the flag is defined: :func:`each` for a
list flag (``--clients=10,100``), :func:`config_rule` for a flag that is a
field of the run's configuration (``--crd.nce_k``: the field's own rule),
:func:`output` for a file the command writes, :func:`check` for any other.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from typing import Any, Callable, Sequence

from absl import flags
import jax

from augfl_jax import training
from augfl_jax.commands import output_files, runner
from augfl_jax.core import fields
from augfl_jax.training import outputs


def run(define_flags: Callable[[], None],
        main: Callable[[list[str]], Any]) -> None:
  """``define_flags()``, then ``main(argv)`` as the experiment commands run
  theirs (module docstring), absl's logs off unless ``--verbosity`` is
  given (``runner.quiet_library_logs``: JAX logs, on stderr, which backends
  it did not find)."""
  define_flags()

  def body(argv: list[str]) -> Any:
    runner.quiet_library_logs()
    return runner.run_command(lambda: main(argv))

  runner.main_runner(body)


def check(name: str, test: Callable[[Any], None]) -> None:
  """Refuses a value of flag ``name`` for which ``test(value)`` raises
  ``ValueError``; its message says what the flag accepts."""

  def validate(value: Any) -> bool:
    try:
      test(value)
    except ValueError as e:
      raise flags.ValidationError(str(e).strip().splitlines()[0]) from None
    return True

  flags.register_validator(name, validate)


def each(name: str, accepts: str, ok: Callable[[str], Any],
         empty: bool = False) -> None:
  """Refuses a value of the list flag ``name`` that is empty (unless
  ``empty``) or holds an item for which ``ok(item)`` is false or raises
  ``ValueError``; ``accepts`` says what an item may be ("an integer >=
  1")."""

  def test(items: Sequence[str]) -> None:
    if not items and not empty:
      raise ValueError(f"give at least one item, each {accepts}")
    for item in items:
      try:
        good = ok(item)
      except ValueError:
        good = False
      if not good:
        raise ValueError(f"each item must be {accepts}, got {item!r}")

  check(name, test)


def integers(name: str, minimum: int) -> None:
  """:func:`each` item of list flag ``name`` an integer >= ``minimum``."""
  each(name, f"an integer >= {minimum}", lambda s: int(s) >= minimum)


def choices(name: str, allowed: Sequence[str], empty: bool = False) -> None:
  """:func:`each` item of list flag ``name`` one of ``allowed``."""
  each(name, "one of " + ", ".join(allowed), lambda s: s in allowed, empty)


def config_rule(name: str) -> None:
  """Refuses a value of flag ``name`` that breaks the rule of the run's
  configuration field of that dotted name (``training.RunConfig``: bounds,
  choices), in the field's own words."""
  check(name, lambda value: fields.replace(training.RunConfig(),
                                           **{name: value}))


def check_started(code: int, output_dir: str, error: Sequence[str],
                  args: Sequence[str]) -> None:
  """Raises ``ValueError`` (one line) when a run of ``experiments.run`` that
  a benchmark started with ``args`` refused them: exit code ``code`` 2 and
  no round recorded in ``output_dir``; ``error`` holds its last line. Each
  further run would refuse them too, and the benchmark would write a
  table without a time."""
  if code == 2 and not os.path.exists(os.path.join(output_dir,
                                                   "metrics.jsonl")):
    reason = error[-1].removeprefix("error: ") if error else "no message"
    raise ValueError(f"experiments.run {shlex.join(args)} stopped before its "
                     f"first round ({reason})")


def timed_call(fn: Callable[[], Any]) -> tuple[float, Any]:
  """``(seconds, result)`` of ``fn()``, timed until its result is ready
  (``jax.block_until_ready``)."""
  start = time.perf_counter()
  result = jax.block_until_ready(fn())
  return time.perf_counter() - start, result


def timed(fn: Callable[[], Any]) -> float:
  """Seconds ``fn()`` takes, its result ready (:func:`timed_call`)."""
  return timed_call(fn)[0]


def write_json(path: str, results: Any) -> None:
  """Writes a command's ``results`` to ``path`` as JSON (indent 1) through
  a temporary sibling and a rename (``outputs.write_text_atomic``): the
  file there before is replaced whole or kept, never torn."""
  outputs.write_text_atomic(path, json.dumps(results, indent=1))


def output(name: str = "output") -> None:
  """Refuses a file flag ``name`` that cannot be written (a directory, a
  missing directory, a read-only one: ``output_files.check_output_file``);
  an empty value (no file) passes."""

  def test(path: str | None) -> None:
    if path:
      try:
        output_files.check_output_file(path, f"--{name}")
      except ValueError as e:  # absl's line names the flag and value
        raise ValueError(str(e).removeprefix(f"--{name}={path}")
                         .lstrip(": ")) from None

  check(name, test)
