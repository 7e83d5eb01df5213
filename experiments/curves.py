"""Runs grouped into curves, for :mod:`experiments.plot` (no plotting here).

A curve is one configuration: runs whose ``config.json`` agree but for
``REPEAT_FIELDS`` (the seed, and choices that do not change the maths) are
repeats, drawn as their mean over their common rounds. Runs that differ in
anything else are never merged: a curve's label is its method's name (the
algorithm's label in ``augfl_jax.algorithms``, "AugFL w/ PM"; the
algorithm's name where its section of ``config.json`` cannot be read), then
the fields that differ between curves (one that changes only with the
method, as AugFL's ``lam`` between "w/ PM" and "w/o PM", or a path, is
printed by experiments.plot instead, unless needed to tell curves apart), and
a ``--label_by`` that would give two configurations one label is refused,
naming the fields that differ. Flat and nested configs (``{"augfl":
{"lam": 5}}``) are compared flattened (``augfl.lam``); an absent field
counts as ``null``. Runs of several datasets are refused rather
than drawn as several figures: their accuracies are on different test
clients, and ``--output`` names one file, so nothing unnamed is written.
Two runs of one configuration and seed are refused too (which one counts?).
A torn last line of a ``metrics.jsonl`` (a run killed while writing it, or
one still writing) is dropped with a warning naming the file, as the run
itself does; anything else unreadable is one error naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from augfl_jax.core import fields
from augfl_jax import algorithms, training

# Fields that may differ between repeats of one configuration (matched on a
# key's last dotted part): the seed, and run control or implementation
# choices that do not change the maths (``training.resumable_fields``: how
# long, how often evaluated, where the data is, how clients are laid out on
# the device); and every field of the sections in REPEAT_SECTIONS.
REPEAT_FIELDS = tuple(sorted(
    {name.split(".")[-1] for name in ("seed",) + training.resumable_fields(
        training.RunConfig())}
    | {"kt_loop"}))  # kt_loop: runs written before crd.loop
REPEAT_SECTIONS = ("output", "run")
ALGORITHM, DATASET, SEED = "algorithm", "dataset", "seed"  # top-level keys
# The method's name (method_name), beside a run's fields while curves are
# labelled: no config key has a space.
METHOD = "method name"


class PlotError(ValueError):
  """Runs that cannot be plotted as asked (one line saying why)."""


@dataclasses.dataclass
class Curve:
  """One configuration's runs.

  Attributes:
    metrics: ``accuracy``, ``accuracy_ci_low``, ``accuracy_ci_high`` (the
      held-out clients' 95% interval), ``test_loss``, ``train_loss`` (the
      mean over the rounds since the previous evaluation) and
      ``train.<name>`` (the evaluated round's own training metrics, a
      record's ``train``): those all its runs have, as arrays ``[runs,
      len(rounds)]``.
    test_split: ``test_split_accuracy``, ``test_split_ci_low``,
      ``test_split_ci_high`` ``[runs, len(test_split_rounds)]``, at the
      rounds where every run scored its test-split clients.
    folded: the fields that also differ between curves, not in their
      labels (``experiments.plot`` prints them).
    method: the method's name (:func:`method_name`), the label's start.
  """
  label: str
  algorithm: str
  runs: list[str]
  rounds: list[int]
  metrics: dict[str, np.ndarray]
  folded: tuple[str, ...] = ()
  test_split_rounds: list[int] = dataclasses.field(default_factory=list)
  test_split: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  method: str = ""


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
  """``{"augfl": {"lam": 5}}`` -> ``{"augfl.lam": 5}``; lists stay values."""
  flat = {}
  for key, value in config.items():
    flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict)
                else {prefix + key: value})
  return flat


def find_runs(paths: Iterable[str]) -> list[str]:
  """Every directory under ``paths`` that holds a ``metrics.jsonl``."""
  return [root for path in paths for root, _, files in sorted(os.walk(path))
          if "metrics.jsonl" in files]


def _warn(message: str) -> None:
  print(f"warning: {message}", file=sys.stderr)


def read_run(run_dir: str, log: Callable[[str], None] = _warn
            ) -> tuple[dict[str, Any], list[dict]]:
  """``(config.json, metric records)`` of one run, as written. A torn last
  line of ``metrics.jsonl`` is dropped, telling ``log`` (the run's own
  reader: ``OutputDir.read_records``).

  Raises:
    PlotError: a file that cannot be read, is not JSON, or holds a record
      without a round (one line naming the file).
  """
  run = training.outputs.OutputDir(run_dir)
  path = run.file("config.json")
  try:
    with open(path) as f:
      config = json.load(f)
  except OSError as e:
    raise PlotError(f"{path}: cannot be read ({e.strerror or e})") from None
  except ValueError as e:
    raise PlotError(f"{path}: not readable JSON ({e}); "
                    f"{training.outputs.REWRITE}") from None
  if not isinstance(config, dict):
    raise PlotError(f"{path}: not a JSON object")
  path = run.file("metrics.jsonl")
  try:
    records = run.read_records("metrics.jsonl", log)
  except OSError as e:
    raise PlotError(f"{path}: cannot be read ({e.strerror or e})") from None
  except ValueError as e:  # OutputDirError: a damaged line, named
    raise PlotError(str(e)) from None
  for i, record in enumerate(records):
    if not _is_number(record.get("round"), int):
      raise PlotError(f"{path}: record {i + 1} has no round (an integer)")
  return config, records


def load_run(run_dir: str, log: Callable[[str], None] = _warn
            ) -> tuple[dict[str, Any], list[dict]]:
  """``(flattened config, metric records)`` of one run: :func:`read_run`,
  the config without the sections its run never read."""
  config, records = read_run(run_dir, log)
  return flatten(_read_sections(config)), records


def _is_number(value: Any, kind: type | tuple = (int, float)) -> bool:
  return isinstance(value, kind) and not isinstance(value, bool)


def _optional_sections() -> frozenset[str]:
  """The sections a run may not read: the algorithms' own, the PM's and
  CRD's."""
  default = training.config.config_class()()
  return frozenset(training.config.section_name(default, algorithm)
                   for algorithm in algorithms.REGISTRY) | {"pm", "crd"}


def _own_section(config: dict[str, Any]):
  """``(default RunConfig, section name, the section's values this version
  knows)`` of ``config``'s algorithm; ``None`` for an algorithm that is not
  registered. An absent section is ``{}``."""
  algorithm = config.get("algorithm")
  if not isinstance(algorithm, str) or algorithm not in algorithms.REGISTRY:
    return None
  default = training.config.config_class()()
  section = training.config.section_name(default, algorithm)
  own = config.get(section) if isinstance(config.get(section), dict) else {}
  known = {f.name for f in dataclasses.fields(getattr(default, section))}
  return default, section, {k: v for k, v in own.items() if k in known}


def method_name(config: dict[str, Any]) -> str:
  """The name of ``config``'s method (a run's ``config.json``): its
  algorithm's label for its section ("AugFL w/ PM", "FedAvg"); the
  algorithm's name where the section is needed and cannot be read (absent,
  or values this version refuses)."""
  algorithm = str(config.get(ALGORITHM))
  own = _own_section(config)
  if own is None:
    return algorithm
  default, section, values = own
  spec = algorithms.spec(algorithm)
  if not callable(spec.label):
    return spec.label
  if not isinstance(config.get(section), dict):
    return algorithm
  try:
    return spec.label_of(getattr(fields.from_dict(
        default, {"algorithm": algorithm, section: values}), section))
  except (ValueError, TypeError):
    return algorithm


def _read_sections(config: dict[str, Any]) -> dict[str, Any]:
  """``config`` without the sections its run never read
  (``training.unread_sections``: other algorithms', and ``pm`` and
  ``crd`` without a PM), so that they neither label nor fold a curve. What
  decides it is the algorithm, its own section and the regulariser; a
  config whose section this version cannot read keeps every section.
  The run's own list of them (``read_sections``) is no field: it is left
  out."""
  config = {k: v for k, v in config.items()
            if k != training.config.READ_SECTIONS}
  own = _own_section(config)
  if own is None:
    return config
  default, section, values = own
  decides = {"algorithm": config["algorithm"], section: values}
  if "regularizer" in config:
    decides["regularizer"] = config["regularizer"]
  try:
    unread = training.unread_sections(
        fields.from_dict(default, decides))
  except (ValueError, TypeError):
    return config
  return {k: v for k, v in config.items() if k not in unread}


def _is_repeat_field(key: str) -> bool:
  return (key.split(".")[-1] in REPEAT_FIELDS
          or key.split(".")[0] in REPEAT_SECTIONS)


def _ident(value: Any) -> str:
  return json.dumps(value, sort_keys=True)


def _format(values: list[Any]) -> list[str]:
  """Readable text of one field's values: floats with the fewest digits
  (from 6) that keep distinct values distinct, bools as true/false."""
  floats = {v for v in values if isinstance(v, float)}
  digits = next((p for p in (6, 8, 10, 12, 17)
                 if len({f"{v:.{p}g}" for v in floats}) == len(floats)), 17)
  return [f"{v:.{digits}g}" if isinstance(v, float) else
          v if isinstance(v, str) else _ident(v) for v in values]


def _sort_key(v: Any) -> tuple:
  """None first, then numbers by value, then text."""
  return ((0,) if v is None else (1, float(v)) if isinstance(
      v, (bool, int, float)) else (2, v if isinstance(v, str) else _ident(v)))


def _short_names(keys: set[str]) -> dict[str, str]:
  """Each key without its leading sections where no other key ends alike
  (``augfl.lam`` -> ``lam``)."""
  short = {}
  for key in keys:
    parts = key.split(".")
    tails = [".".join(parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    short[key] = next((t for t in tails if sum(
        k == t or k.endswith("." + t) for k in keys) == 1), key)
  return short


def _differing(configs: list[dict], keys: Iterable[str]) -> list[str]:
  """The ``keys`` whose values differ between ``configs``, the shortest of
  keys with the same values (``lam`` for ``lam``, ``algorithm_config.lam``);
  the algorithm first. A field of a section that some runs never read
  (:func:`_read_sections`) differs only between the runs that have it."""
  columns, optional = {}, _optional_sections()
  for key in sorted(keys, key=lambda k: (k.count("."), len(k), k)):
    column = tuple(_ident(c.get(key)) for c in configs)
    values = set(column) - ({_ident(None)} if key.split(".")[0] in
                            optional else set())
    if len(values) > 1:
      columns.setdefault(column, key)
  return sorted(columns.values(), key=lambda k: (k != ALGORITHM, k))


def _collisions(configs: list[dict], fields: list[str]) -> list[tuple]:
  """Pairs ``(i, j)`` of ``configs`` with the same values of ``fields``."""
  keys = [tuple(_ident(c.get(f)) for f in fields) for c in configs]
  return [(keys.index(key), j) for j, key in enumerate(keys)
          if keys.index(key) != j]


def _auto_fields(configs: list[dict], keys: set[str]):
  """``(label fields, folded fields)``: the fields that differ, but for a
  path (``*dir``) and, when the method differs (:data:`METHOD`, which
  starts every label), a field constant among each method's configs
  (folded, unless needed to tell curves apart)."""
  fields = _differing(configs, keys - {METHOD})
  methods = [c.get(METHOD) for c in configs]
  def implied(key):
    return len(set(methods)) > 1 and key != ALGORITHM and all(
        len({_ident(c.get(key)) for c, m in zip(configs, methods) if m == me})
        == 1 for me in set(methods))
  spare = [f for f in fields if f.split(".")[-1].endswith("dir") or implied(f)]
  chosen = [f for f in fields if f not in spare]
  for f in spare:
    if any(_ident(configs[i].get(f)) != _ident(configs[j].get(f))
           for i, j in _collisions(configs, chosen + [METHOD])):
      chosen.append(f)
  return chosen, [f for f in spare if f not in chosen]


def _curve(label: str, algorithm: str, method: str, runs: list, folded
          ) -> Curve:
  """The curve of ``runs`` ([(run_dir, records)]) over their common rounds
  (a run may have stopped earlier or been evaluated more often)."""
  by_round = [{r["round"]: r for r in records} for _, records in runs]
  common = sorted(set.intersection(*(set(b) for b in by_round)))
  if not common:
    raise PlotError(f"runs {', '.join(d for d, _ in runs)} of one "
                    "configuration share no evaluated round")
  run_dirs = [d for d, _ in runs]
  metrics = _columns(run_dirs, by_round, common, {
      "accuracy": lambda r: r["accuracy"],
      "accuracy_ci_low": lambda r: r["accuracy_ci"][0],
      "accuracy_ci_high": lambda r: r["accuracy_ci"][1],
      "test_loss": lambda r: r["test_loss"],
      # written as train_loss before it was named for what it is
      "train_loss": lambda r: r.get("mean_train_loss", r.get("train_loss"))})
  train_keys = set.intersection(*(set(b[t].get("train") or ())
                                   for b in by_round for t in common))
  metrics.update(_columns(run_dirs, by_round, common, {
      f"train.{k}": (lambda r, k=k: r["train"][k])
      for k in sorted(train_keys)}))
  scored = [t for t in common if all("test_split" in b[t] for b in by_round)]
  test_split = _columns(run_dirs, by_round, scored, {
      "test_split_accuracy": lambda r: r["test_split"]["accuracy"],
      "test_split_ci_low": lambda r: r["test_split"]["accuracy_ci"][0],
      "test_split_ci_high": lambda r: r["test_split"]["accuracy_ci"][1]})
  return Curve(label, algorithm, run_dirs, common, metrics,
               tuple(folded), scored if test_split else [], test_split,
               method)


def _columns(run_dirs: list[str], by_round: list[dict[int, dict]],
             rounds: list[int], getters: dict[str, Any]
            ) -> dict[str, np.ndarray]:
  """``{name: [runs, len(rounds)]}`` of the ``getters`` every record at
  ``rounds`` has (a missing key or a ``None`` leaves that name out).

  Raises:
    PlotError: a value that is not a number (naming the run's file).
  """
  columns = {}
  for name, get in getters.items():
    try:
      values = [[get(b[t]) for t in rounds] for b in by_round]
    except (KeyError, TypeError, IndexError):
      continue
    if not rounds or any(v is None for row in values for v in row):
      continue
    for run_dir, row in zip(run_dirs, values):
      for t, v in zip(rounds, row):
        if not _is_number(v):
          raise PlotError(
              f"{os.path.join(run_dir, 'metrics.jsonl')}: round {t}: "
              f"{name.replace('_ci_', ' interval ')} is not a number "
              f"({_ident(v)[:40]})")
    columns[name] = np.array(values, dtype=np.float64)
  return columns


def group_curves(run_dirs: Sequence[str],
                 label_by: Sequence[str] | None = None) -> list[Curve]:
  """One curve per configuration (see the module docstring), sorted by the
  label fields' values (numbers numerically), then by label.

  Raises:
    PlotError: an unreadable run, runs of several datasets, a ``label_by``
      that would merge different configurations, or nothing to draw.
  """
  groups, seeds = {}, {}
  for run_dir in run_dirs:
    raw, records = read_run(run_dir)
    config = flatten(_read_sections(raw))
    seed = config.get(SEED)
    config = {k: v for k, v in config.items() if not _is_repeat_field(k)}
    if records:  # a run not evaluated yet has nothing to draw
      key = _ident({k: v for k, v in config.items() if v is not None})
      groups.setdefault(key, (config, [], method_name(raw)))[1].append(
          (run_dir, records))
      if seed is not None and (key, seed) in seeds:
        raise PlotError(f"{seeds[key, seed]} and {run_dir} are one "
                        f"configuration and seed ({seed}): pass only one")
      seeds[key, seed] = run_dir
  if not groups:
    raise PlotError("no run has an evaluated round yet")
  configs = [config for config, _, _ in groups.values()]
  tagged = [{**config, METHOD: method}  # the label's start
            for config, _, method in groups.values()]
  datasets = sorted({str(c.get(DATASET)) for c in configs})
  if len(datasets) > 1:
    raise PlotError(f"runs of {len(datasets)} datasets ({', '.join(datasets)})"
                    " are not comparable on one axis: plot each dataset's "
                    "runs separately")
  keys = set().union(*configs)
  short = _short_names(keys)
  fields, folded = _auto_fields(tagged, keys) if not label_by else ([], [])
  for name in label_by or ():  # a key, else every key ending in ".name"
    found = [name] if name in keys else sorted(
        k for k in keys if k.endswith("." + name))
    if not found:
      raise PlotError(f"--label_by: no field {name!r} in the runs' configs")
    fields += found
  for i, j in _collisions(tagged, fields + [METHOD]):
    differ = ", ".join(short[f] for f in _differing([configs[i], configs[j]],
                                                    keys))
    raise PlotError(f"--label_by={','.join(label_by)} would merge runs that "
                    f"differ in {differ}: add those fields to --label_by, or "
                    "leave it unset")
  texts = {f: _format([c.get(f) for c in configs]) for f in fields}
  named = {}  # method -> its algorithms: the method names the algorithm?
  for c in tagged:
    named.setdefault(c[METHOD], set()).add(_ident(c.get(ALGORITHM)))
  shown = [f for f in fields if f != ALGORITHM or any(
      len(algos) > 1 for algos in named.values())]
  curves = []
  for i, (config, runs, method) in enumerate(groups.values()):
    algorithm = str(config.get(ALGORITHM))
    label = ", ".join([method] + [
        f"{short[f]}={texts[f][i]}" for f in shown
        if config.get(f) is not None])
    order = tuple(_sort_key(config.get(f)) for f in fields)
    curves.append((order, label, _curve(label, algorithm, method, runs,
                                        [short[f] for f in folded])))
  if len({label for _, label, _ in curves}) < len(curves):
    raise PlotError("two configurations print as one label: pass --label_by")
  return [curve for _, _, curve in sorted(curves, key=lambda c: c[:2])]
