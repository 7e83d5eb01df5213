"""absl flags generated from :class:`augfl_jax.training.RunConfig`.

Every leaf field of the run configuration is a flag named by its dotted path
(``--rounds``, ``--augfl.rho``, ``--data.server_size``), typed by the field's
annotation, with the help text written next to the field. Presets ship as
flag files (``experiments/configs/<dataset>.flags``, ``--flagfile=...``).
A flag that cannot be parsed, or a configuration that cannot work, is one
line on stderr and exit code 2, before anything is loaded or compiled; a
flag of the names before the configuration had sections (``--lam``,
``--num_clients``, ...) gets its new name in that line. ``--help`` prints
the flags grouped by section and exits 0 (:func:`help_sections`). The
parsing, the one-line errors and ``--help`` itself are
``augfl_jax.commands.runner`` and ``augfl_jax.commands.flag_help``, which
every command shares.

``--imports=my_module,path/to/other.py`` (on the command line or in a flag
file) imports those modules, by name or from their file, before any flag
is defined: a user's own method, dataset or model that registers itself on
import (``algorithms.register``, ``data.register_dataset``,
``models.register_model``) is then one the command runs, with a flag for
every field of its config. An unknown ``--algorithm``, ``--dataset`` or
``--model`` names the near miss (``FedAvg``: fedavg) and ``--imports``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import os
import re
import sys
import tempfile
from typing import Callable
import warnings

from absl import flags
import jax

from augfl_jax import algorithms, data, models, training
from augfl_jax.commands import flag_help, runner
from augfl_jax.processes import group
from augfl_jax.core import fields

FLAGS = flags.FLAGS


def requested_imports(argv: list[str]) -> list[str]:
  """The modules that ``--imports`` names in ``argv``, the flag files it
  names (``--flagfile``, read as absl reads them) included, in order."""
  try:
    argv = flags.FlagValues().read_flags_from_files(list(argv))
  except flags.Error:
    pass  # the parse of the flags reports the flag file that cannot be read
  names = []
  for i, arg in enumerate(argv):
    if arg.startswith("--imports="):
      names += arg.partition("=")[2].split(",")
    elif arg == "--imports" and i + 1 < len(argv):
      names += argv[i + 1].split(",")
  return [n.strip() for n in names if n.strip()]


def _import_file(path: str) -> None:
  """Imports the module in the file ``path`` under its file's name (once;
  the file's directory is searched for the modules it imports)."""
  name = os.path.splitext(os.path.basename(path))[0]
  path = os.path.abspath(path)
  before = sys.modules.get(name)
  if before is not None:
    if os.path.abspath(getattr(before, "__file__", "") or "") == path:
      return
    raise ImportError(f"a module named {name} is imported already "
                      f"({getattr(before, '__file__', None) or 'built in'});"
                      " rename the file")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no such file {path}")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  if os.path.dirname(path) not in sys.path:
    sys.path.append(os.path.dirname(path))
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise


def _import(name: str) -> None:
  """Imports ``name``: a file (``path/to/my_module.py``), or a module by
  name, found on ``sys.path`` or as ``my_module.py`` in the current
  directory."""
  if name.endswith(".py") or os.sep in name or "/" in name:
    _import_file(name)
    return
  try:
    importlib.import_module(name)
  except ModuleNotFoundError as e:
    local = name.replace(".", os.sep) + ".py"
    if e.name != name.partition(".")[0] or not os.path.isfile(local):
      raise
    _import_file(local)


def import_requested(argv: list[str] | None = None) -> list[str]:
  """Imports the modules that ``--imports`` names in ``argv`` (default
  ``sys.argv``; :func:`requested_imports`), each by name or from its file,
  once; returns them.

  Raises:
    SystemExit: a module that does not import (one line, exit 2).
  """
  names = requested_imports(sys.argv if argv is None else argv)
  for name in names:
    try:
      _import(name)
    except Exception as e:  # pylint: disable=broad-except
      reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
      way_out = ("; give its file (--imports=path/to/my_module.py) or put "
                 "its directory on PYTHONPATH"
                 if isinstance(e, ModuleNotFoundError) else "")
      print(f"error: --imports: {name} does not import "
            f"({type(e).__name__}: {reason}){way_out}", file=sys.stderr)
      sys.exit(2)
  return names


def define_config_flags(only: tuple[str, ...] | None = None,
                        flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines one flag per leaf field of ``RunConfig`` in ``flag_values``
  (each once), after importing the modules of ``--imports`` (so that a
  user's registered method has its section's flags); ``only``: just the
  fields of these dotted names (``experiments.pretrain_pm``)."""
  import_requested()
  if "imports" not in flag_values:
    flags.DEFINE_list("imports", [], "modules (my_module) or their files "
                      "(path/to/my_module.py) to import before the flags "
                      "are read, on the command line or in a --flagfile: a "
                      "user's own method, dataset or model, registered on "
                      "import", flag_values=flag_values)
  for name, f, owner, value in fields.walk(training.config.config_class()()):
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


# experiments.run's default --output_dir (default_output_dir).
RUN_OUTPUT_DIR = ("runs/<dataset>_<algorithm>_seed<seed>, a / in the "
                  "dataset's name as _")


def define_run_control_flags(output_dir_default: str = RUN_OUTPUT_DIR
                            ) -> None:
  """``--output_dir`` (its help states ``output_dir_default``, the
  command's), ``--checkpoint_every``, ``--resume``, ``--overwrite``,
  ``--resume_changes`` and the compilation cache's flags."""
  flags.DEFINE_string("output_dir", None, "where the command writes its "
                      f"files (default {output_dir_default})")
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
                    + ", ".join(training.resume_changes(
                        training.config.config_class()())) + "; augfl.lam "
                    "not to or from 0)")
  flags.DEFINE_bool("compilation_cache", True, "keep compiled programs in "
                    "JAX's persistent cache (--compilation_cache_dir) so "
                    "that later runs start faster")
  flags.DEFINE_string("compilation_cache_dir", None, "the persistent "
                      "compilation cache (default $XDG_CACHE_HOME/augfl_jax/"
                      "jax_cache, ~/.cache without XDG_CACHE_HOME)")


def define_distributed_flags(flag_values: flags.FlagValues = FLAGS
                            ) -> None:
  """``--distributed.coordinator``, ``--distributed.num_processes``,
  ``--distributed.process_id``, ``--distributed.startup_timeout`` and
  ``--distributed.service_port``: the
  command as one of the processes of a run across processes or hosts
  (``augfl_jax.processes.group``)."""
  flags.DEFINE_string(
      "distributed.coordinator", None, "host:port of process 0, which every "
      "process of a run across processes reaches (with "
      "--distributed.num_processes and --distributed.process_id; none of "
      "the three on a Slurm, Open MPI or Cloud TPU cluster, which "
      "jax.distributed detects)", flag_values=flag_values)
  flags.DEFINE_integer("distributed.num_processes", None, "how many "
                       "processes run the command together, one per host "
                       "or several on one", lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer("distributed.process_id", None, "this process's "
                       "index, 0 .. num_processes - 1; process 0 writes "
                       "the run's files and console", lower_bound=0,
                       flag_values=flag_values)
  flags.DEFINE_float("distributed.startup_timeout",
                     group.STARTUP_TIMEOUT, "seconds a "
                     "process waits for the others to start (naming those "
                     "it waits for) before it gives up", lower_bound=1,
                     flag_values=flag_values)
  flags.DEFINE_integer("distributed.service_port", 0, "the port of JAX's "
                       "coordination service on process 0's host, behind "
                       "the coordinator's port, which every process "
                       "reaches too; 0: one the system picks (open one "
                       "where a firewall stands between the hosts)",
                       lower_bound=0, upper_bound=65535,
                       flag_values=flag_values)


def start_processes() -> bool:
  """``processes.group.initialize`` from the ``--distributed.*`` flags,
  before any JAX computation; whether the run spans several processes."""
  return group.initialize(
      FLAGS["distributed.coordinator"].value,
      FLAGS["distributed.num_processes"].value,
      FLAGS["distributed.process_id"].value,
      FLAGS["distributed.startup_timeout"].value,
      FLAGS["distributed.service_port"].value)


def config_from_flags(flag_values: flags.FlagValues = FLAGS
                     ) -> training.RunConfig:
  """The ``RunConfig`` the flags describe (not yet resolved); a field
  without a flag keeps its default."""
  config = training.config.config_class()()
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
    except fields.FieldError:
      raise  # it names its field (runner.run_command prints it as a flag)
    except (ValueError, TypeError) as e:
      names = ", ".join(f"--{n}" for n in section_changes)
      raise ValueError(f"{names}: {e}") from None
  check_names(config)
  return config


def near_miss(name: str, choices: list[str]) -> str | None:
  """The choice ``name`` most likely meant: the same but for case and
  ``-`` for ``_`` (``FedAvg``, ``fashion-mnist``), else the closest by
  ``difflib``; ``None`` when none is close."""
  key = lambda s: s.lower().replace("-", "_")
  keys = {key(c): c for c in reversed(choices)}
  close = difflib.get_close_matches(key(name), list(keys), n=1)
  return keys.get(key(name)) or (keys[close[0]] if close else None)


def check_names(config: training.RunConfig) -> None:
  """Raises ``ValueError`` (one line) for a ``--algorithm``, ``--dataset``,
  ``--model`` or ``--pm.model`` that is not registered: the near miss
  (:func:`near_miss`), the choices, and ``--imports`` for one's own."""
  kinds = [("algorithm", config.algorithm, list(algorithms.REGISTRY)),
           ("dataset", config.dataset,
            list(data.DATASETS) + list(data.ALIASES)),
           ("model", config.model, list(models.available_models())),
           ("pm.model", config.pm.model, list(models.available_models()))]
  for flag, name, choices in kinds:
    if name is None or name in choices:
      continue
    guess = near_miss(name, choices)
    raise ValueError(
        f"unknown --{flag} {name!r}"
        + (f"; did you mean {guess}? Choose" if guess else "; choose")
        + f" one of {', '.join(choices)}, or register your own in a "
        "module and pass it with --imports=my_module (or "
        "--imports=path/to/my_module.py)")


def default_output_dir(config: training.RunConfig) -> str:
  """:data:`RUN_OUTPUT_DIR` for ``config``."""
  return (f"runs/{data.canonical_name(config.dataset).replace('/', '_')}_"
          f"{config.algorithm}_seed{config.seed}")


def default_cache_dir() -> str:
  """``$XDG_CACHE_HOME/augfl_jax/jax_cache`` (``~/.cache`` without it)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "augfl_jax", "jax_cache")


def cache_unwritable(directory: str) -> str | None:
  """Why the compilation cache cannot be kept in ``directory`` (``"it is a
  file, not a directory"``, ``"permission denied"``, ...), or ``None`` when
  a file can be created there (the directory is made if missing; the
  probe's file is removed)."""
  if os.path.exists(directory) and not os.path.isdir(directory):
    return "it is a file, not a directory"
  try:
    os.makedirs(directory, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write_probe_", dir=directory)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    reason = e.strerror or type(e).__name__
    return reason[:1].lower() + reason[1:]
  return None


def enable_compilation_cache(directory: str | None = None) -> str:
  """Turns on JAX's persistent compilation cache in ``directory`` (default
  :func:`default_cache_dir`) for every program, however small or quick to
  compile; returns the directory. Process-wide: call it before compiling.

  Raises:
    OSError: the directory cannot be written (:func:`cache_unwritable`
      says why); the cache is then left as it was.
  """
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  directory = os.path.abspath(os.path.expanduser(
      directory or default_cache_dir()))
  reason = cache_unwritable(directory)
  if reason is not None:
    raise OSError(f"{directory}: {reason}")
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


# JAX's warning, once per program, that a cache entry could not be read (a
# damaged entry) or written.
_CACHE_WARNING = re.compile(r"Error (reading|writing) persistent compilation "
                            r"cache entry for '[^']*': (.*)", re.DOTALL)


class _CacheWarnings:
  """What :func:`quiet_cache_warnings` installed: the cache's directory and
  whether its one line was printed."""
  directory: str | None = None
  shown = False


def cache_warning_line(directory: str, message: str) -> str | None:
  """The one line that stands for JAX's ``message`` about the cache in
  ``directory``, or ``None`` when ``message`` is not about the cache."""
  match = _CACHE_WARNING.match(message)
  if match is None:
    return None
  verb, reason = match.groups()
  reason = reason.strip().splitlines()[0] if reason.strip() else "?"
  if verb == "reading":
    return (f"warning: the compilation cache {directory} holds entries "
            f"that cannot be read ({reason}); their programs are compiled "
            "again, each run: delete the directory to rebuild it (further "
            "warnings about the cache are not shown)")
  return (f"warning: the compilation cache {directory} cannot be written "
          f"({reason}); programs are compiled again, each run (further "
          "warnings about the cache are not shown)")


def quiet_cache_warnings(directory: str) -> None:
  """JAX warns once per program that a cache entry cannot be read or
  written (a damaged cache: a warning and its source line for each of a
  run's dozens of programs). From now on the first such warning is one
  line on stderr naming ``directory`` (:func:`cache_warning_line`) and the
  rest are dropped; other warnings are shown as before. Process-wide."""
  _CacheWarnings.directory = directory
  _CacheWarnings.shown = False
  if getattr(warnings.showwarning, "_quiets_cache", False):
    return
  shown_before = warnings.showwarning

  def show(message, category, filename, lineno, file=None, line=None):
    text = cache_warning_line(_CacheWarnings.directory or "?", str(message))
    if text is None:
      return shown_before(message, category, filename, lineno, file, line)
    if not _CacheWarnings.shown:
      _CacheWarnings.shown = True
      print(text, file=sys.stderr, flush=True)
    return None

  show._quiets_cache = True  # pylint: disable=protected-access
  warnings.showwarning = show


def start_command() -> None:
  """What every command does first: absl logs off unless --verbosity is
  given (orbax logs every file it touches, and logs each failure of a
  background save in dozens of lines before it raises the error the
  command reports in one), and the compilation cache: one that cannot be
  written is a warning, one line, and the command runs without it; one
  whose entries cannot be read warns in one line
  (:func:`quiet_cache_warnings`)."""
  runner.quiet_library_logs()
  if FLAGS.compilation_cache:
    try:
      directory = enable_compilation_cache(FLAGS.compilation_cache_dir)
    except OSError as e:
      print(f"warning: the compilation cache cannot be kept in {e}; "
            "running without it (give --compilation_cache_dir a directory "
            "you can write, or --nocompilation_cache)", file=sys.stderr,
            flush=True)
    else:
      quiet_cache_warnings(directory)


def renamed_to(old: str, flag_values: flags.FlagValues = FLAGS
              ) -> list[str]:
  """The flags of ``flag_values`` that took the place of the unknown flag
  ``old`` (``runner.renamed_to``): the run's configuration's fields, the
  algorithms' sections first (``alpha`` -> ``augfl.alpha``,
  ``per_fedavg.alpha``, ``fedbc.alpha``, ``eval.alpha``)."""
  config = training.config.config_class()()
  return runner.renamed_to(
      old, flag_values, names=[name for name, *_ in fields.walk(config)],
      first={training.config.section_name(config, algorithm)
             for algorithm in algorithms.REGISTRY})


# --help's groups of the run's flags (help_sections): the common ones first.
COMMON = ("dataset", "algorithm", "rounds", "seed", "output_dir")
RUN_CONTROL = ("output_dir", "checkpoint_every", "resume", "overwrite",
               "resume_changes", "compilation_cache", "compilation_cache_dir",
               "imports")
DISTRIBUTED = ("distributed.coordinator", "distributed.num_processes",
               "distributed.process_id", "distributed.startup_timeout",
               "distributed.service_port")
# The modules whose flags --help lists as the command's own (the experiment
# commands'), but for the run's flags, which this module defines.
COMMANDS = (__name__.rpartition(".")[0] + ".",)


def help_sections(flag_values: flags.FlagValues = FLAGS
                 ) -> list[tuple[str, list[str]]]:
  """``--help``'s groups of the run's flags (those this module defines),
  after the command's own: the common flags, the rest of the run's
  top-level fields, the run-control flags, those of a run across
  processes, then one group per section of ``RunConfig`` (``--data.*``,
  ``--pm.*``, ..., one per algorithm, naming the algorithms that read
  it)."""
  config = training.config.config_class()()
  sections = {}
  for name, *_ in fields.walk(config):
    head = name.partition(".")[0] if "." in name else ""
    sections.setdefault(head, []).append(name)
  readers = {}
  for algorithm in algorithms.REGISTRY:
    readers.setdefault(training.config.section_name(config, algorithm),
                       []).append(algorithm)
  section_help = {f.name: fields.help_text(f)
                  for f in dataclasses.fields(config)}
  # A command's own flags of a run's name (a benchmark's --seed) are not
  # the run's.
  run_flags = {f.name for f in
               flag_values.flags_by_module_dict().get(__name__, [])}
  run = lambda members: [n for n in members if n in run_flags]
  out = [
      ("common flags", run(COMMON)),
      ("other run flags", run(n for n in sections[""] if n not in COMMON)),
      ("run control", run(n for n in RUN_CONTROL if n not in COMMON)),
      ("across processes or hosts (README)", run(DISTRIBUTED)),
  ]
  for head, members in sections.items():
    if not head:
      continue
    title = f"--{head}.*: {section_help[head]}"
    if head in readers:
      title += f" (read by --algorithm={', '.join(readers[head])})"
    out.append((title, run(members)))
  return out


def parse_flags(argv: list[str]) -> list[str]:
  """``runner.parse_flags`` with the run's flags: ``--help`` groups them by
  section (:func:`help_sections`), and an unknown flag of a name before
  the configuration had sections names the one that took its place
  (:func:`renamed_to`)."""
  kind = flag_help.requested(argv)
  if kind is not None:
    flag_help.print_and_exit(FLAGS, kind, help_sections(), COMMANDS)
  return runner.parse_flags(argv, renamed_to)


def unread_flags_warning(plan: training.Plan,
                         flag_values: flags.FlagValues = FLAGS
                        ) -> str | None:
  """``"warning: ignored, ..."`` naming the flags given (on the command
  line or in a flag file) of the sections that the run of ``plan`` never
  reads (``plan.unread``: ``--augfl.lam`` for FedAvg, ``--pm.*`` without a
  PM), each with the reason; ``None`` when there are none."""
  reasons = {"pm": "the run has no PM",
             "crd": "the run has no CRD regulariser"}
  own = f"--algorithm={plan.config.algorithm} reads --{plan.section}.*"
  given = {}  # reason -> flags
  for name, *_ in fields.walk(plan.config):
    section = name.partition(".")[0]
    if (section in plan.unread and name in flag_values
        and flag_values[name].present):
      given.setdefault(reasons.get(section, own), []).append(f"--{name}")
  if not given:
    return None
  return "warning: ignored, as the run does not read them: " + "; ".join(
      f"{', '.join(names)} ({reason})" for reason, names in given.items())


def main_runner(main: Callable[[list[str]], None]) -> None:
  """``runner.main_runner`` with :func:`parse_flags` (for a command that
  takes flags only)."""
  runner.main_runner(main, parse_flags)
