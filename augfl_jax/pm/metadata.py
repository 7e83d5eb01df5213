"""What a PM checkpoint records, and whether it fits a run.

A PM checkpoint (:mod:`augfl_jax.pm.store`) records what shaped its weights: the
dataset, the architecture (model name and module fields), the server split
(size and seed), the training recipe (every field of
:class:`~augfl_jax.pm.pretrain.PretrainConfig` that changes the weights) and
the checkpoint format (:func:`pm_metadata`). :func:`check_match` refuses
one that differs in any of :data:`MATCH_FIELDS`, naming the fields and how
to retrain, so a PM from a short test is never reused by a longer
configuration. Module fields that only choose how the model runs
(:data:`IMPLEMENTATION_FIELDS`: ``conv_impl``; the norm ``"running"``
against ``"batch"``) are not part of the architecture: the parameters are
the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import flax.linen as nn

from augfl_jax.pm.pretrain import PretrainConfig
from augfl_jax.pm.recipe import recipe

__all__ = ["FORMAT", "IMPLEMENTATION_FIELDS", "MATCH_FIELDS",
           "PMCheckpointMismatch", "check_match", "model_kwargs",
           "pm_metadata"]

# Metadata fields a PM checkpoint must match to be reused.
MATCH_FIELDS = ("dataset", "architecture", "server_size", "split_seed",
                "recipe", "format")
# 2: the variables {"params", "batch_stats"} (1: the params alone, before
# the running statistics were kept).
FORMAT = 2
# Module fields that choose an implementation, not the parameters or the
# function (up to float rounding): left out of the architecture.
IMPLEMENTATION_FIELDS = ("conv_impl",)


class PMCheckpointMismatch(ValueError):
  """A PM checkpoint was trained for another dataset, architecture, split or
  recipe."""


def _jsonable(value: Any) -> Any:
  """The value as it reads back from JSON (tuples become lists, ...)."""
  return json.loads(json.dumps(value))


def model_kwargs(model: nn.Module) -> dict[str, Any]:
  """The module's dataclass fields (``num_classes``, widths, norm, ...)
  but :data:`IMPLEMENTATION_FIELDS`; the norm ``"running"`` is recorded as
  ``"batch"`` (the same layers, in eval mode)."""
  skip = ("parent", "name") + IMPLEMENTATION_FIELDS
  kwargs = {f.name: getattr(model, f.name)
            for f in dataclasses.fields(model) if f.name not in skip}
  if kwargs.get("norm") == "running":
    kwargs["norm"] = "batch"
  return _jsonable(kwargs)


def _architecture(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
  """``metadata`` with :data:`IMPLEMENTATION_FIELDS` dropped from its
  architecture's kwargs (checkpoints written before they were left out
  record ``conv_impl``)."""
  arch = metadata.get("architecture")
  if not isinstance(arch, dict) or not isinstance(arch.get("kwargs"), dict):
    return metadata
  kwargs = {k: v for k, v in arch["kwargs"].items()
            if k not in IMPLEMENTATION_FIELDS}
  return {**metadata, "architecture": {**arch, "kwargs": kwargs}}


def pm_metadata(dataset: str, model_name: str, server_size: int,
                split_seed: int, *, model_kwargs: Mapping[str, Any] | None = None,
                config: PretrainConfig | None = None,
                **extra: Any) -> dict[str, Any]:
  """The metadata of a PM checkpoint (and what a run expects of one).

  Args:
    dataset: dataset name.
    model_name: the PM's registry name.
    server_size: size of the server split it is trained on.
    split_seed: seed of the partition that produced the server split.
    model_kwargs: the module's fields (:func:`model_kwargs`), part of the
      architecture.
    config: the pretraining recipe (:func:`recipe` is compared).
    **extra: recorded, never compared (held-out accuracy, seconds, ...).

  Returns:
    A JSON-ready dict; :data:`MATCH_FIELDS` are the compared ones.
  """
  return _jsonable({
      "dataset": dataset,
      "architecture": {"model": model_name,
                       "kwargs": dict(model_kwargs or {})},
      "server_size": int(server_size),
      "split_seed": int(split_seed),
      "recipe": recipe(config or PretrainConfig(model=model_name)),
      "format": FORMAT,
      **extra,
  })


def _describe(field: str, value: Any) -> str:
  if field == "recipe" and isinstance(value, dict):
    return "recipe " + ", ".join(f"{k}={v}" for k, v in value.items())
  if field == "format":
    return f"format {value} (1: written before running statistics were kept)"
  if field == "architecture" and isinstance(value, dict):
    kwargs = ", ".join(f"{k}={v!r}" for k, v in value.get("kwargs", {}).items())
    return f"architecture={value.get('model')}({kwargs})"
  return f"{field}={value}"


def _retrain_hint(directory: str, expected: Mapping[str, Any]) -> str:
  args = [f"--dataset={expected['dataset']}"] if "dataset" in expected else []
  arch = expected.get("architecture")
  if isinstance(arch, dict):
    args.append(f"--pm.model={arch.get('model')}")
    kwargs = {k: v for k, v in arch.get("kwargs", {}).items()
              if k != "num_classes"}
    if kwargs:
      args.append(f"--pm.kwargs='{json.dumps(kwargs)}'")
  for field in ("server_size", "split_seed"):
    if field in expected:
      flag = "seed" if field == "split_seed" else "data." + field
      args.append(f"--{flag}={expected[field]}")
  if isinstance(expected.get("recipe"), dict):
    args.append(f"--pm.epochs={expected['recipe'].get('epochs')}")
  args.append(f"--pm.dir={directory}")
  return "python -m experiments.pretrain_pm " + " ".join(args)


def check_match(directory: str | os.PathLike, saved: Mapping[str, Any],
                expected: Mapping[str, Any], *, what: str = "PM checkpoint",
                remedy: str | None = None) -> None:
  """Raises :class:`PMCheckpointMismatch` when the metadata ``saved`` of the
  PM at ``directory`` differs from ``expected`` in one of
  :data:`MATCH_FIELDS` that ``expected`` holds (the architecture compared
  without :data:`IMPLEMENTATION_FIELDS`), naming every differing field,
  both values, and how to retrain (or ``remedy``); ``what`` names the
  checkpoint."""
  saved = _architecture(dict(saved))
  saved.setdefault("format", 1)
  expected = _architecture(_jsonable(dict(expected)))
  differing = [f for f in MATCH_FIELDS
               if f in expected and saved.get(f) != expected[f]]
  if differing:
    path = os.path.abspath(os.path.expanduser(os.fspath(directory)))
    have = ", ".join(_describe(f, saved.get(f)) for f in differing)
    need = ", ".join(_describe(f, expected[f]) for f in differing)
    if remedy is None:
      remedy = (f"retrain it with {_retrain_hint(path, expected)} or pass "
                "another --pm.dir")
    raise PMCheckpointMismatch(
        f"{what} at {path} was trained for {have}; this run needs "
        f"{need}: {remedy}")
