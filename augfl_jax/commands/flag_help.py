"""``--help`` of a command: its flags grouped by section.

absl's own ``--help`` lists every flag of the process alphabetically by
module (hundreds of lines) and exits 1. The commands print instead, and exit
0: the command's description (its module docstring), the command's own flags
(``experiments.table2``'s ``--datasets``, a benchmark's ``--clients``, ...),
then the sections the command gives (``experiments.cli.help_sections``: the
common run flags, the run-control flags, one group per section of the run's
configuration, ...). ``--helpfull`` adds the flags of absl and the other
libraries.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any, Sequence

from absl import flags

__all__ = ["HELP_FULL", "HELP_SHORT", "WIDTH", "groups", "print_and_exit",
           "requested", "text"]

HELP_SHORT = ("-h", "-?", "--help", "-help", "--helpshort", "-helpshort")
HELP_FULL = ("--helpfull", "-helpfull")
WIDTH = 80

# A section of the help: its title and the names of its flags, in order.
Section = tuple[str, Sequence[str]]


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


def _own_modules(by_module: dict[str, list[flags.Flag]],
                 packages: tuple[str, ...]) -> set[str]:
  """The modules of the command: the main one (absl names it by its path)
  and those whose names start with one of ``packages``
  (``("experiments.",)``)."""
  return {m for m in by_module if m.startswith(packages) or m.endswith(".py")}


def groups(flag_values: flags.FlagValues, command: str, full: bool = False,
           sections: Sequence[Section] = (), packages: tuple[str, ...] = ()
          ) -> list[tuple[str, list[str]]]:
  """``[(title, flag names)]`` in the order ``--help`` prints them: the
  flags of the command's own modules (the main one and those of
  ``packages``) that no section names, then ``sections``; ``full``: then
  every other module's flags. Flags not defined, and groups left empty,
  are left out."""
  by_module = flag_values.flags_by_module_dict()
  own_modules = _own_modules(by_module, packages)
  ours = {f.name for m in own_modules for f in by_module[m]}
  in_sections = {n for _, members in sections for n in members}
  out = [(f"the flags of {command}", sorted(ours - in_sections)),
         *sections]
  if full:
    for module in sorted(set(by_module) - own_modules):
      out.append((f"{module}'s flags", [f.name for f in by_module[module]]))
  return [(title, [n for n in members if n in flag_values])
          for title, members in out
          if any(n in flag_values for n in members)]


def text(flag_values: flags.FlagValues, command: str, doc: str | None,
         full: bool = False, sections: Sequence[Section] = (),
         packages: tuple[str, ...] = ()) -> str:
  """The whole help: ``doc``, then every group of :func:`groups`."""
  lines = [doc.strip(), ""] if doc else []
  for title, members in groups(flag_values, command, full, sections,
                               packages):
    lines.append(textwrap.fill(title + ":", WIDTH, subsequent_indent="    "))
    lines.extend(_describe(flag_values[n]) for n in members)
    lines.append("")
  if not full:
    lines.append(textwrap.fill(
        "Also absl's flags, e.g. --flagfile=FILE (flags from a file, one a "
        "line) and --verbosity=0 (absl's logs); --helpfull lists them.",
        WIDTH))
  return "\n".join(lines).rstrip() + "\n"


def print_and_exit(flag_values: flags.FlagValues, kind: str,
                   sections: Sequence[Section] = (),
                   packages: tuple[str, ...] = ()) -> None:
  """Prints the help of the running command (its ``__main__`` module) to
  stdout (:func:`text`; ``kind``: ``"short"`` or ``"full"``) and exits
  0."""
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  command = (f"python -m {spec.name}" if spec is not None and spec.name
             else sys.argv[0])
  sys.stdout.write(text(flag_values, command, getattr(main, "__doc__", None),
                        full=kind == "full", sections=sections,
                        packages=packages))
  sys.stdout.flush()
  sys.exit(0)
