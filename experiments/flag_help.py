"""``--help`` of the experiment commands: the flags grouped by section.

absl's own ``--help`` lists every flag of the process alphabetically by
module (hundreds of lines) and exits 1. The commands print instead, and exit
0: the command's description (its module docstring), the command's own flags
(``experiments.table2``'s ``--datasets``, ...), the common run flags
(``--dataset``, ``--algorithm``, ``--rounds``, ``--seed``, ``--output_dir``),
the rest of the run's top-level fields, the run-control flags, then one group
per section of ``RunConfig`` (``--data.*``, ``--pm.*``, ..., one per
algorithm, naming the algorithms that read it). ``--helpfull`` adds the
flags of absl and the other libraries.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from typing import Any

from absl import flags

from augfl_jax.core import fields
from augfl_jax import algorithms, training

COMMON = ("dataset", "algorithm", "rounds", "seed", "output_dir")
RUN_CONTROL = ("output_dir", "checkpoint_every", "resume", "overwrite",
               "resume_changes", "compilation_cache", "compilation_cache_dir",
               "imports")
DISTRIBUTED = ("distributed.coordinator", "distributed.num_processes",
               "distributed.process_id", "distributed.startup_timeout",
               "distributed.service_port")
HELP_SHORT = ("-h", "-?", "--help", "-help", "--helpshort", "-helpshort")
HELP_FULL = ("--helpfull", "-helpfull")
WIDTH = 80


def requested(argv: list[str]) -> str | None:
  """``"short"`` or ``"full"`` when ``argv`` asks for help, else ``None``
  (arguments after ``--`` are not flags)."""
  for arg in argv[1:]:
    if arg == "--":
      return None
    name = arg.split("=")[0]
    if name in HELP_FULL:
      return "full"
    if name in HELP_SHORT:
      return "short"
  return None


def _default(value: Any) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (list, tuple)):
    return ",".join(str(v) for v in value) or "(none)"
  return str(value) if value != "" else '""'


def _describe(flag: flags.Flag) -> str:
  """``--name: help (default: value)``, wrapped; a flag whose default is
  ``None`` states its default in its help."""
  text = f"--{flag.name}: {flag.help}"
  if flag.default is not None:
    text += f" (default: {_default(flag.default)})"
  return textwrap.fill(text, WIDTH, initial_indent="  ",
                       subsequent_indent="      ", break_long_words=False,
                       break_on_hyphens=False)


def _own_modules(by_module: dict[str, list[flags.Flag]]) -> set[str]:
  """The modules of the commands: ``experiments.*`` and the main one (absl
  names it by its path)."""
  return {m for m in by_module
          if m.startswith("experiments.") or m.endswith(".py")}


def groups(flag_values: flags.FlagValues, command: str, full: bool = False
          ) -> list[tuple[str, list[str]]]:
  """``[(title, flag names)]`` in the order ``--help`` prints them; empty
  groups left out, every flag of the commands in one group."""
  config = training.config.config_class()()
  names = [name for name, *_ in fields.walk(config)]
  by_module = flag_values.flags_by_module_dict()
  own_modules = _own_modules(by_module)
  ours = {f.name for m in own_modules for f in by_module[m]}
  sections = {}
  for name in names:
    head = name.partition(".")[0] if "." in name else ""
    sections.setdefault(head, []).append(name)
  readers = {}
  for algorithm in algorithms.REGISTRY:
    readers.setdefault(training.config.section_name(config, algorithm),
                       []).append(algorithm)
  section_help = {f.name: fields.help_text(f)
                  for f in dataclasses.fields(config)}
  # The run's flags are those experiments.cli defines; the command's own
  # are the rest, a benchmark's --seed or --crd.nce_k among them.
  run_flags = {f.name for f in by_module.get("experiments.cli", [])}
  run = lambda members: [n for n in members if n in run_flags]
  out = [
      (f"the flags of {command}", sorted(ours - run_flags)),
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
  if full:
    for module in sorted(set(by_module) - own_modules):
      out.append((f"{module}'s flags", [f.name for f in by_module[module]]))
  return [(title, [n for n in members if n in flag_values])
          for title, members in out
          if any(n in flag_values for n in members)]


def text(flag_values: flags.FlagValues, command: str, doc: str | None,
         full: bool = False) -> str:
  """The whole help: ``doc``, then every group of :func:`groups`."""
  lines = [doc.strip(), ""] if doc else []
  for title, members in groups(flag_values, command, full):
    lines.append(textwrap.fill(title + ":", WIDTH, subsequent_indent="    "))
    lines.extend(_describe(flag_values[n]) for n in members)
    lines.append("")
  if not full:
    lines.append(textwrap.fill(
        "Also absl's flags, e.g. --flagfile=FILE (flags from a file, one a "
        "line) and --verbosity=0 (absl's logs); --helpfull lists them.",
        WIDTH))
  return "\n".join(lines).rstrip() + "\n"


def print_and_exit(flag_values: flags.FlagValues, kind: str) -> None:
  """Prints the help of the running command (its ``__main__`` module) to
  stdout and exits 0."""
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  command = (f"python -m {spec.name}" if spec is not None and spec.name
             else sys.argv[0])
  sys.stdout.write(text(flag_values, command, getattr(main, "__doc__", None),
                        full=kind == "full"))
  sys.stdout.flush()
  sys.exit(0)
