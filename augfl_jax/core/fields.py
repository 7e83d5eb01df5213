"""Typed, documented configuration fields and dotted access to nested configs.

Every configuration of the library is a frozen dataclass whose fields carry
their help text (``field(default, "what it is")``); a run's configuration
nests them (``RunConfig.augfl`` is an ``AugFLConfig``). The functions here
walk such a tree by dotted names (``"augfl.rho"``), so that command-line
flags, sweeps and ``config.json`` name a field the same way, and a renamed
field fails loudly instead of silently disconnecting its flag.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Iterator

__all__ = ["field", "help_text", "walk", "get", "replace", "to_dict",
           "from_dict", "diff", "leaf_type"]

_MISSING = object()


def field(default: Any = _MISSING, help: str = "", *,  # pylint: disable=redefined-builtin
          default_factory: Any = _MISSING, allow_inf: bool = False,
          choices: tuple[str, ...] | None = None) -> Any:
  """A dataclass field with its help text next to it.

  Args:
    default: the default value.
    help: one line for ``--help`` and the docs.
    default_factory: for mutable or nested defaults (a section's instance).
    allow_inf: a float field whose value may be ``inf`` (e.g. an upper
      clip); every other float must be finite.
    choices: the values a string field accepts.
  """
  metadata = {"help": help, "allow_inf": allow_inf, "choices": choices}
  if default_factory is not _MISSING:
    return dataclasses.field(default_factory=default_factory,
                             metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def help_text(f: dataclasses.Field) -> str:
  """A field's help text ("" when it has none)."""
  return f.metadata.get("help", "")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def leaf_type(cls: type, name: str) -> type:
  """The scalar type of field ``name`` of ``cls``: ``bool``, ``int``,
  ``float``, ``str`` or ``tuple`` (``X | None`` gives ``X``)."""
  hint = _hints(cls)[name]
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    hint = next(a for a in typing.get_args(hint) if a is not type(None))
  return tuple if typing.get_origin(hint) is tuple else hint


def walk(config: Any, prefix: str = ""
        ) -> Iterator[tuple[str, dataclasses.Field, type, Any]]:
  """``(dotted name, field, owner class, value)`` for every leaf field of a
  nested dataclass (sections are dataclass-valued fields)."""
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    name = prefix + f.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
      yield from walk(value, name + ".")
    else:
      yield name, f, type(config), value


def get(config: Any, name: str) -> Any:
  """The value of dotted field ``name``."""
  for part in name.split("."):
    config = getattr(config, part)
  return config


def replace(config: Any, **changes: Any) -> Any:
  """``config`` with dotted fields changed: ``replace(c, **{"augfl.rho":
  0.2}, rounds=10)``; a section may also be given as a dict of its
  fields. Raises ``ValueError`` naming an unknown field."""
  direct, nested = {}, {}
  for name, value in changes.items():
    head, _, rest = name.partition(".")
    names = {f.name for f in dataclasses.fields(config)}
    if head not in names:
      raise ValueError(f"{type(config).__name__} has no field {head!r} "
                       f"(in {name!r}); its fields: {', '.join(sorted(names))}")
    current = getattr(config, head)
    if rest:
      nested.setdefault(head, {})[rest] = value
    elif isinstance(value, dict) and dataclasses.is_dataclass(current):
      nested.setdefault(head, {}).update(value)
    else:
      direct[head] = value
  for head, sub in nested.items():
    direct[head] = replace(direct.get(head, getattr(config, head)), **sub)
  return dataclasses.replace(config, **direct)


def to_dict(config: Any) -> dict[str, Any]:
  """The nested dict of a config (tuples as lists), for ``config.json``;
  non-finite floats become the strings ``"inf"``, ``"-inf"``, ``"nan"``
  (strict JSON has no such numbers)."""
  def plain(value):
    if isinstance(value, float) and not math.isfinite(value):
      return str(value)
    if isinstance(value, tuple):
      return [plain(v) for v in value]
    return value
  return {f.name: (to_dict(getattr(config, f.name))
                   if dataclasses.is_dataclass(getattr(config, f.name))
                   else plain(getattr(config, f.name)))
          for f in dataclasses.fields(config)}


def from_dict(cls_or_default: Any, values: dict[str, Any]) -> Any:
  """A config from :func:`to_dict`'s dict, on top of ``cls_or_default`` (a
  default instance or a class); unknown keys raise ``ValueError``."""
  base = (cls_or_default() if isinstance(cls_or_default, type)
          else cls_or_default)
  flat = {}
  def flatten(d, prefix=""):
    for k, v in d.items():
      if isinstance(v, dict) and dataclasses.is_dataclass(
          get(base, prefix + k)):
        flatten(v, prefix + k + ".")
      else:
        flat[prefix + k] = v
  flatten(values)
  typed = {}
  for name, value in flat.items():
    owner = get(base, name.rpartition(".")[0]) if "." in name else base
    kind = leaf_type(type(owner), name.rpartition(".")[2])
    if kind is float and isinstance(value, (str, int)):
      value = float(value)
    if kind is tuple and isinstance(value, list):
      value = tuple(value)
    typed[name] = value
  return replace(base, **typed)


def diff(a: Any, b: Any, ignore: tuple[str, ...] = ()) -> list[str]:
  """``"name: a -> b"`` for every dotted leaf that differs (a field named
  in ``ignore``, or under a section named there, is skipped)."""
  left = {name: value for name, _, _, value in walk(a)}
  out = []
  for name, _, _, value in walk(b):
    if any(name == i or name.startswith(i + ".") for i in ignore):
      continue
    if left.get(name, _MISSING) != value and not (
        isinstance(value, float) and math.isnan(value)
        and isinstance(left.get(name), float) and math.isnan(left[name])):
      out.append(f"{name}: {left.get(name, '(absent)')!r} -> {value!r}")
  return out
