"""Typed, documented configuration fields and dotted access to nested configs.

Every configuration of the library is a frozen dataclass whose fields carry
their help text and their rules (``field(0.03, "what it is", gt=0)``); a
run's configuration nests them (``RunConfig.augfl`` is an ``AugFLConfig``).
:class:`Config`, their base, checks the rules of every field when an
instance is made (:func:`check`: finite floats, choices, bounds), so a
config built in Python is refused as one given by flags is. The functions
here walk such a tree by dotted names (``"augfl.rho"``), so that
command-line flags, sweeps and ``config.json`` name a field the same way,
and a renamed field fails loudly instead of silently disconnecting its flag.

A field's metadata also says what a resumed run may do with it
(``resume``): ``"fixed"`` (the default: it must equal the checkpoint's),
``"free"`` (it lays out or locates the same computation, or asks for more
rounds) or ``"named"`` (a step size, or a weight such as AugFL's lambda,
that a resumed run may change when the user names it); :func:`select`
collects them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Iterator

__all__ = ["Config", "FieldError", "RESUME", "check", "field", "help_text",
           "walk", "select", "get", "replace", "to_dict", "from_dict", "diff",
           "leaf_type"]

_MISSING = object()
# What a resumed run may do with a field (``field(..., resume=...)``).
RESUME = ("fixed", "free", "named")
_BOUNDS = (("gt", ">", lambda v, b: v > b), ("ge", ">=", lambda v, b: v >= b),
           ("lt", "<", lambda v, b: v < b), ("le", "<=", lambda v, b: v <= b))


def field(default: Any = _MISSING, help: str = "", *,  # pylint: disable=redefined-builtin
          default_factory: Any = _MISSING, allow_inf: bool = False,
          choices: tuple[str, ...] | None = None, gt: float | None = None,
          ge: float | None = None, lt: float | None = None,
          le: float | None = None, resume: str = "fixed",
          absent: Any = _MISSING) -> Any:
  """A dataclass field with its help text and its rules next to it.

  Args:
    default: the default value (none given: the field has no default).
    help: one line for ``--help`` and the docs.
    default_factory: for mutable or nested defaults (a section's instance).
    allow_inf: a float field whose value may be ``inf`` (e.g. an upper
      clip); every other float must be finite.
    choices: the values a string field accepts.
    gt, ge, lt, le: bounds of a number (``None``, the value of a field not
      yet resolved, is not checked).
    resume: what a resumed run may do with the field (:data:`RESUME`,
      module docstring).
    absent: the value that a saved config without the field (written
      before it existed) stands for, where it differs from the default;
      :func:`from_dict` reads such a config with it.
  """
  if resume not in RESUME:
    raise ValueError(f"resume must be one of {RESUME}, got {resume!r}")
  metadata = {"help": help, "allow_inf": allow_inf, "choices": choices,
              "gt": gt, "ge": ge, "lt": lt, "le": le, "resume": resume}
  if absent is not _MISSING:
    metadata["absent"] = absent
  if default_factory is not _MISSING:
    return dataclasses.field(default_factory=default_factory,
                             metadata=metadata)
  if default is _MISSING:  # a field without a default
    return dataclasses.field(metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


class FieldError(ValueError):
  """A field's value breaks its rule. ``name`` is the field's name, dotted
  from the outermost config that was being changed (``"augfl.rho"``);
  ``str(e)`` reads ``"rho must be > 0, got 0.0"``.

  Attributes:
    name: the field's (dotted) name.
    rule: the message with ``{name}`` where the name goes.
  """

  def __init__(self, name: str, rule: str):
    self.name, self.rule = name, rule
    super().__init__(rule.format(name=name))

  def within(self, section: str) -> FieldError:
    """The same error, its name under ``section``."""
    return FieldError(f"{section}.{self.name}", self.rule)


def _rule(f: dataclasses.Field, value: Any) -> str | None:
  """What is wrong with ``value`` for field ``f`` (``{name}`` for its
  name), or None."""
  meta = f.metadata
  if isinstance(value, float) and not math.isfinite(value) and not (
      meta.get("allow_inf") and value == math.inf):
    return f"{{name}} must be a finite number, got {value}"
  choices = meta.get("choices")
  if choices and value not in choices:
    return f"unknown {{name}} {value!r}; choose one of {', '.join(choices)}"
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    bounds = [(key, op, test) for key, op, test in _BOUNDS
              if meta.get(key) is not None]
    if not all(test(value, meta[key]) for key, _, test in bounds):
      low = [(op, meta[key]) for key, op, _ in bounds if key in ("gt", "ge")]
      high = [(op, meta[key]) for key, op, _ in bounds if key in ("lt", "le")]
      if low and high:
        (lop, lo), (hop, hi) = low[0], high[0]
        return (f"{{name}} must be in {'(' if lop == '>' else '['}{lo}, "
                f"{hi}{')' if hop == '<' else ']'}, got {value}")
      op, bound = (low or high)[0]
      return f"{{name}} must be {op} {bound}, got {value}"
  return None


def check(config: Any) -> None:
  """Checks every field of the dataclass instance ``config`` (not the
  fields of its sections, which checked themselves when they were made)
  against its metadata: a float is finite (or ``inf`` where the field
  allows it), a string one of its choices, a number within its bounds;
  ``None`` passes. Raises :class:`FieldError` naming the first bad field."""
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    if value is None or dataclasses.is_dataclass(value):
      continue
    rule = _rule(f, value)
    if rule is not None:
      raise FieldError(f.name, rule)


class Config:
  """Base of the library's frozen config dataclasses: the rules of every
  field (:func:`field`'s metadata) are checked when an instance is made
  (:func:`check`), by ``dataclasses.replace`` too. A subclass adds rules
  that tie several fields by overriding ``__post_init__``, calling
  ``super().__post_init__()`` first."""

  def __post_init__(self):
    check(self)


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


def select(config: Any, **metadata: Any) -> tuple[str, ...]:
  """The dotted names of the leaf fields whose metadata holds every
  ``key=value`` given: ``select(RunConfig(), resume="named")``."""
  return tuple(name for name, f, _, _ in walk(config)
               if all(f.metadata.get(k) == v for k, v in metadata.items()))


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
    try:
      direct[head] = replace(direct.get(head, getattr(config, head)), **sub)
    except FieldError as e:
      raise e.within(head) from None
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
  default instance or a class); unknown keys raise ``ValueError``. A field
  missing from a section the dict holds takes its ``absent`` value where
  it has one (the dict was saved before the field existed)."""
  base = (cls_or_default() if isinstance(cls_or_default, type)
          else cls_or_default)
  flat, sections = {}, {""}
  def flatten(d, prefix=""):
    for k, v in d.items():
      if isinstance(v, dict) and dataclasses.is_dataclass(
          get(base, prefix + k)):
        sections.add(prefix + k + ".")
        flatten(v, prefix + k + ".")
      else:
        flat[prefix + k] = v
  flatten(values)
  for name, f, _, _ in walk(base):
    section = name[:name.rfind(".") + 1]
    if "absent" in f.metadata and name not in flat and section in sections:
      flat[name] = f.metadata["absent"]
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
