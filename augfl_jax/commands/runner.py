"""An absl command's run: its flags parsed, its user errors one line.

A command (``experiments.run``, a benchmark, one's own) runs its ``main``
with :func:`main_runner`: a flag that cannot be parsed (``--rounds=1.5``,
an unknown flag: :func:`renamed_to` names the flag that took its place) or
an argument that is not a flag is one line on stderr and exit code 2,
before anything is loaded or compiled; ``--help`` prints the command's
flags (``flag_help``) and exits 0. Its body runs under :func:`run_command`:
an error that is the user's to fix (:data:`USER_ERRORS`: a dataset that is
not there, a file that cannot be written) is one line on stderr and exit
code 2, not a traceback. :func:`quiet_library_logs` turns absl's logs off
unless ``--verbosity`` is given.
"""

from __future__ import annotations

import logging as std_logging
import sys
from typing import Any, Callable, Iterable

from absl import app
from absl import flags
from absl import logging

from augfl_jax import data
from augfl_jax.commands import flag_help
from augfl_jax.core import fields

__all__ = ["RENAMED", "USER_ERRORS", "main_runner", "parse_flags",
           "parse_flags_and_paths", "quiet_library_logs", "renamed_to",
           "run_command"]

FLAGS = flags.FLAGS

# What a command's body may raise that is the user's to fix: one line.
USER_ERRORS = (ValueError, FloatingPointError, FileNotFoundError, OSError,
               data.DatasetUnavailableError)


def run_command(body: Callable[[], Any],
                on_error: Callable[[str], str] | None = None) -> Any:
  """``body()``; a user error ends the process as one line on stderr with
  exit code 2 instead of a traceback (``on_error`` takes the line first
  and returns the one printed)."""
  try:
    return body()
  except fields.FieldError as e:  # a field of the run's configuration
    message = str(fields.FieldError(f'--{e.name}', e.rule))
  except USER_ERRORS as e:
    message = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  if on_error is not None:
    message = on_error(message)
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def quiet_library_logs() -> None:
  """absl's logs off unless --verbosity is given: orbax logs every file it
  touches (reading a checkpoint too), JAX which backends it did not
  find."""
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.FATAL)
    # asyncio's "Task exception was never retrieved" for orbax's tasks.
    std_logging.getLogger("asyncio").setLevel(std_logging.CRITICAL)


# Flags of the names before the run's configuration had sections (the
# run's and pretrain_pm's; a benchmark's of the same names) whose new names
# do not end in the old one; the others (--lam -> --augfl.lam,
# --num_clients -> --data.num_clients) are found by their last part
# (renamed_to).
RENAMED = {
    "adapt_steps": ("eval.steps",), "kt_batch_size": ("crd.batch_size",),
    "kt_loop": ("crd.loop",), "per_fedavg_variant": ("per_fedavg.variant",),
    "pm_model": ("pm.model",), "pm_epochs": ("pm.epochs",),
    "pm_kwargs": ("pm.kwargs",), "pm_dir": ("pm.dir",), "pm_norm": ("norm",),
}


def renamed_to(old: str, flag_values: flags.FlagValues = FLAGS,
               names: Iterable[str] | None = None,
               first: Iterable[str] = ()) -> list[str]:
  """The flags of ``flag_values`` that took the place of the unknown flag
  ``old``: :data:`RENAMED`, else those of ``names`` (default: every flag)
  whose last dotted part is ``old``, those of the sections ``first``
  first (``alpha`` -> ``augfl.alpha``, ``per_fedavg.alpha``,
  ``fedbc.alpha``, ``eval.alpha``)."""
  if old in RENAMED:
    return [n for n in RENAMED[old] if n in flag_values]
  first = set(first)
  found = [name for name in (flag_values if names is None else names)
           if "." in name and name.rpartition(".")[2] == old
           and name in flag_values]
  return sorted(found, key=lambda n: n.partition(".")[0] not in first)


def _unknown_flag(error: flags.UnrecognizedFlagError,
                  renamed: Callable[[str], list[str]]) -> str:
  """``unknown flag --lam; it is now --augfl.lam, or ...``, or absl's
  message for a flag that never was one."""
  new = renamed(error.flagname)
  if not new:
    return str(error).splitlines()[0]
  others = (", or " + ", ".join(f"--{n}" for n in new[1:]) +
            " (each section has its own)") if len(new) > 1 else ""
  return f"unknown flag --{error.flagname}; it is now --{new[0]}{others}"


def parse_flags(argv: list[str],
                renamed: Callable[[str], list[str]] = renamed_to,
                paths: bool = False) -> list[str]:
  """absl's parser, but a flag that cannot be parsed (``--rounds=1.5``,
  ``--augfl.rho=abc``, an unknown flag: ``renamed(name)`` names the flags
  that took its place, :func:`renamed_to`) or an argument that is not a
  flag (unless ``paths``: then they are returned after ``argv[0]``) is one
  line on stderr and exit 2; ``--help`` prints ``flag_help``'s help and
  exits 0."""
  kind = flag_help.requested(argv)
  if kind is not None:
    flag_help.print_and_exit(FLAGS, kind)
  try:
    rest = FLAGS(argv)
  except flags.UnrecognizedFlagError as e:
    print(f"error: {_unknown_flag(e, renamed)}", file=sys.stderr)
    sys.exit(2)
  except flags.Error as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)
  if len(rest) > 1 and not paths:
    print(f"error: unexpected arguments: {' '.join(rest[1:])} (every "
          "option is a --flag)", file=sys.stderr)
    sys.exit(2)
  return rest


def parse_flags_and_paths(argv: list[str]) -> list[str]:
  """:func:`parse_flags` for a command whose arguments that are not flags
  are paths: they are returned (after ``argv[0]``), not refused."""
  return parse_flags(argv, paths=True)


def main_runner(main: Callable[[list[str]], Any],
                parser: Callable[[list[str]], list[str]] = parse_flags
               ) -> None:
  """``app.run(main)`` with ``parser`` (:func:`parse_flags`: for a command
  that takes flags only)."""
  app.run(main, flags_parser=parser)
