"""absl flags generated from :class:`augfl_jax.training.RunConfig`.

Every leaf field of the run configuration is a flag named by its dotted path
(``--rounds``, ``--augfl.rho``, ``--data.server_size``), typed by the field's
annotation, with the help text written next to the field. Presets ship as
flag files (``experiments/configs/<dataset>.flags``, ``--flagfile=...``).
A flag that cannot be parsed, or a configuration that cannot work, is one
line on stderr and exit code 2, before anything is loaded or compiled.
"""

from __future__ import annotations

import logging as std_logging
import os
import sys
from typing import Any, Callable

from absl import app
from absl import flags
from absl import logging
import jax

from augfl_jax import data, fields, training

FLAGS = flags.FLAGS
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "configs")


def define_config_flags(only: tuple[str, ...] | None = None,
                        flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines one flag per leaf field of ``RunConfig`` in ``flag_values``
  (each once); ``only``: just the fields of these dotted names
  (``experiments.pretrain_pm``)."""
  for name, f, owner, value in fields.walk(training.RunConfig()):
    if name in flag_values or (only is not None and name not in only):
      continue
    kind = fields.leaf_type(owner, f.name)
    text = fields.help_text(f) or f.name
    define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer,
              float: flags.DEFINE_float, tuple: flags.DEFINE_list}.get(
                  kind, flags.DEFINE_string)
    if kind is tuple and value is not None:
      value = list(value)
    define(name, value, text, flag_values=flag_values)


def define_run_control_flags() -> None:
  """``--output_dir``, ``--checkpoint_every``, ``--resume``,
  ``--overwrite``, ``--resume_changes`` and the compilation cache's
  flags."""
  flags.DEFINE_string("output_dir", None, "where the run writes its files "
                      "(default runs/<dataset>_<algorithm>_seed<seed>)")
  flags.DEFINE_integer("checkpoint_every", training.CHECKPOINT_EVERY,
                       "save the run state every this many rounds (the "
                       "newest two are kept) and at the end (0: only at the "
                       "end; SIGINT, SIGTERM and a non-finite round still "
                       "save)")
  flags.DEFINE_bool("resume", False, "continue the run in --output_dir from "
                    "its newest checkpoint (same flags; a larger --rounds "
                    "trains further)")
  flags.DEFINE_bool("overwrite", False, "replace the run --output_dir holds "
                    "(only the files a run writes; without it a run is "
                    "never overwritten)")
  flags.DEFINE_list("resume_changes", [], "with --resume: the step sizes "
                    "(e.g. fedavg.lr,eval.alpha) this resumed run may "
                    "change from the checkpoint's, after a non-finite "
                    "round; each change is logged and recorded in "
                    "changes.jsonl (any of: "
                    + ", ".join(training.STEP_SIZE_FIELDS) + ")")
  flags.DEFINE_bool("compilation_cache", True, "keep compiled programs in "
                    "JAX's persistent cache (--compilation_cache_dir) so "
                    "that later runs start faster")
  flags.DEFINE_string("compilation_cache_dir", None, "the persistent "
                      "compilation cache (default $XDG_CACHE_HOME/augfl_jax/"
                      "jax_cache, ~/.cache without XDG_CACHE_HOME)")


def config_from_flags(flag_values: flags.FlagValues = FLAGS
                     ) -> training.RunConfig:
  """The ``RunConfig`` the flags describe (not yet resolved); a field
  without a flag keeps its default."""
  config = training.RunConfig()
  changes = {}
  for name, _, owner, value in fields.walk(config):
    if name not in flag_values:
      continue
    flag = flag_values[name].value
    if fields.leaf_type(owner, name.rpartition(".")[2]) is tuple:
      flag = tuple(flag) if flag is not None else None
    if flag != value:
      changes[name] = flag
  sections = {}
  for name, value in changes.items():  # one section at a time, so that a
    head = name.partition(".")[0]      # section's own check names it
    sections.setdefault(head if "." in name else "", {})[name] = value
  for head, section_changes in sections.items():
    try:
      config = fields.replace(config, **section_changes)
    except (ValueError, TypeError) as e:
      names = ", ".join(f"--{n}" for n in section_changes)
      raise ValueError(f"{names}: {e}") from None
  return config


def default_output_dir(config: training.RunConfig) -> str:
  return (f"runs/{data.canonical_name(config.dataset).replace('/', '_')}_"
          f"{config.algorithm}_seed{config.seed}")


def default_cache_dir() -> str:
  """``$XDG_CACHE_HOME/augfl_jax/jax_cache`` (``~/.cache`` without it)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "augfl_jax", "jax_cache")


def enable_compilation_cache(directory: str | None = None) -> str:
  """Turns on JAX's persistent compilation cache in ``directory`` (default
  :func:`default_cache_dir`) for every program, however small or quick to
  compile; returns the directory. Process-wide: call it before compiling."""
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  directory = os.path.abspath(os.path.expanduser(
      directory or default_cache_dir()))
  os.makedirs(directory, exist_ok=True)
  compilation_cache.reset_cache()  # a directory set before takes effect now
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  return directory


def disable_compilation_cache() -> None:
  """Turns the persistent compilation cache off again (process-wide)."""
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", None)
  compilation_cache.reset_cache()


def start_command() -> None:
  """What every command does first: absl logs off unless --verbosity is
  given (orbax logs every file it touches, and logs each failure of a
  background save in dozens of lines before it raises the error the
  command reports in one), and the compilation cache."""
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.FATAL)
    # asyncio's "Task exception was never retrieved" for orbax's tasks.
    std_logging.getLogger("asyncio").setLevel(std_logging.CRITICAL)
  if FLAGS.compilation_cache:
    enable_compilation_cache(FLAGS.compilation_cache_dir)


# What a command's body may raise that is the user's to fix: one line.
USER_ERRORS = (ValueError, FloatingPointError, FileNotFoundError, OSError,
               data.DatasetUnavailableError)


def run_command(body: Callable[[], Any]) -> Any:
  """``body()``; a user error ends the process as one line on stderr with
  exit code 2 instead of a traceback."""
  try:
    return body()
  except USER_ERRORS as e:
    message = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a flag that cannot be parsed (``--rounds=1.5``,
  ``--augfl.rho=abc``, an unknown flag) or an argument that is not a flag
  (the commands take none) is one line on stderr and exit 2."""
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)
  if len(rest) > 1:
    print(f"error: unexpected arguments: {' '.join(rest[1:])} (every "
          "option is a --flag)", file=sys.stderr)
    sys.exit(2)
  return rest


def main_runner(main: Callable[[list[str]], None]) -> None:
  """``app.run(main)`` with :func:`parse_flags` (for a command that takes
  flags only)."""
  app.run(main, flags_parser=parse_flags)
