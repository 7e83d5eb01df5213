"""The PM's checkpoint: what it was trained for, reused only when it matches.

A PM checkpoint (``augfl_jax.checkpoint``, atomic) holds the variables of
:func:`augfl_jax.pretrain.pretrain` (``{"params", "batch_stats"}``) and
records what shaped them: the dataset, the architecture (model name and
module fields), the server split (size and seed), the training recipe (every
field of :class:`~augfl_jax.pretrain.PretrainConfig` that changes the
weights: epochs, lr, batch size, momentum, weight decay, decay, held-out
fraction, seed) and the checkpoint format. :func:`load_pm` refuses one that
differs in any of these, naming the fields, so a PM from a short test is
never reused by a longer configuration. Module fields that only choose how
the model runs (:data:`IMPLEMENTATION_FIELDS`: ``conv_impl``; the norm
``"running"`` against ``"batch"``) are not part of the architecture: the
parameters are the same.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax

from augfl_jax import checkpoint, models
from augfl_jax.pretrain import PretrainConfig, pretrain
from augfl_jax.progress import counted
from augfl_jax.pretrain_recipe import recipe
from augfl_jax.types import Batch, Params

__all__ = [
    "FORMAT", "IMPLEMENTATION_FIELDS", "MATCH_FIELDS", "PMCheckpointMismatch",
    "default_pm_dir", "get_or_pretrain_pm", "load_pm", "model_kwargs",
    "pm_metadata", "pretrain_and_save", "recipe", "save_pm",
]

# Metadata fields a PM checkpoint must match to be reused.
MATCH_FIELDS = ("dataset", "architecture", "server_size", "split_seed",
                "recipe", "format")
# 2: the variables {"params", "batch_stats"} (1: the params alone, before
# the running statistics were kept).
FORMAT = 2
# Module fields that choose an implementation, not the parameters or the
# function (up to float rounding): left out of the architecture.
IMPLEMENTATION_FIELDS = ("conv_impl",)

Log = Callable[[str], None]


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


def save_pm(directory: str | os.PathLike, variables: Params,
            metadata: Mapping[str, Any], *, overwrite: bool = False) -> None:
  """Saves a PM's ``{"params", "batch_stats"}`` atomically; adds
  ``num_params`` and ``created`` (UTC, ISO)."""
  metadata = {**metadata, "num_params": models.num_params(
      variables["params"])}
  metadata.setdefault(
      "created", datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"))
  checkpoint.save(directory, variables, metadata, overwrite=overwrite)


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


def load_pm(directory: str | os.PathLike, expected: Mapping[str, Any], *,
            like: Params | None = None) -> tuple[Params, dict[str, Any]]:
  """Loads a PM after checking it was trained for what ``expected`` says.

  Args:
    directory: the PM checkpoint.
    expected: e.g. :func:`pm_metadata` of the run; each of
      :data:`MATCH_FIELDS` it contains must equal the checkpoint's (the
      architecture compared without :data:`IMPLEMENTATION_FIELDS`).
    like: optional abstract ``{"params", "batch_stats"}`` (shapes checked on
      restore).

  Returns:
    ``(variables, metadata)``.

  Raises:
    FileNotFoundError: no readable checkpoint at ``directory``.
    PMCheckpointMismatch: a compared field differs; the message names every
      differing field, both values, and how to retrain.
  """
  saved = _architecture(checkpoint.restore_metadata(directory))
  saved.setdefault("format", 1)
  expected = _architecture(_jsonable(dict(expected)))
  differing = [f for f in MATCH_FIELDS
               if f in expected and saved.get(f) != expected[f]]
  if differing:
    path = os.path.abspath(os.path.expanduser(os.fspath(directory)))
    have = ", ".join(_describe(f, saved.get(f)) for f in differing)
    need = ", ".join(_describe(f, expected[f]) for f in differing)
    raise PMCheckpointMismatch(
        f"PM checkpoint at {path} was trained for {have}; this run needs "
        f"{need}: retrain it with {_retrain_hint(path, expected)} or pass "
        "another --pm.dir")
  return checkpoint.restore(directory, like)


def _percent(value: float | None) -> str:
  return "n/a" if value is None else f"{100 * value:.2f}%"


def default_pm_dir(root: str | os.PathLike, dataset: str, model_name: str,
                   server_size: int) -> str:
  """``<root>/pm/<dataset>_<model>_srv<server_size>`` ('/' in names -> '_')."""
  name = f"{dataset}_{model_name}_srv{server_size}".replace("/", "_")
  return os.path.join(os.fspath(root), "pm", name)


def _check_args(model_name: str, server: Batch, server_size: int,
                config: PretrainConfig,
                input_shape: tuple[int, ...] | None = None) -> None:
  n, shape = int(server["y"].shape[0]), tuple(server["x"].shape[1:])
  if config.model != model_name:
    raise ValueError(f"config.model={config.model!r} but model_name="
                     f"{model_name!r}; they must name the same PM.")
  if n != server_size:
    raise ValueError(f"server_size={server_size} but the server split has "
                     f"{n} examples.")
  if input_shape is not None and tuple(input_shape) != shape:
    raise ValueError(f"input_shape={input_shape} but the server examples "
                     f"have shape {shape}.")


def pretrain_and_save(
    directory: str | os.PathLike, *, model: nn.Module, model_name: str,
    dataset_name: str, server: Batch, server_size: int, split_seed: int,
    config: PretrainConfig, log: Log | None = None, overwrite: bool = False
) -> tuple[Params, dict[str, Any]]:
  """:func:`~augfl_jax.pretrain.pretrain`, then :func:`save_pm` with the full
  metadata.

  The metadata is :func:`pm_metadata` plus the metrics of :func:`pretrain`
  (``nan`` stored as ``null``), ``input_shape`` and ``pretrain_config``.
  Arguments as :func:`get_or_pretrain_pm`; ``overwrite`` replaces an
  existing checkpoint (atomically).

  Returns:
    ``(variables, metadata)`` as :func:`load_pm` would return them.
  """
  _check_args(model_name, server, server_size, config)
  log = log or (lambda _: None)
  variables, metrics = pretrain(model, server, config, log=log)
  metrics = {k: None if isinstance(v, float) and math.isnan(v) else v
             for k, v in metrics.items()}  # JSON has no NaN.
  metadata = pm_metadata(
      dataset_name, model_name, server_size, split_seed,
      model_kwargs=model_kwargs(model), config=config, **metrics,
      input_shape=list(server["x"].shape[1:]),
      pretrain_config=dataclasses.asdict(config))
  save_pm(directory, variables, metadata, overwrite=overwrite)
  log(f"saved the PM to {directory} (held-out accuracy "
      f"{_percent(metrics['heldout_accuracy'])})")
  return variables, checkpoint.restore_metadata(directory)


def get_or_pretrain_pm(
    directory: str | os.PathLike, *, model: nn.Module, model_name: str,
    dataset_name: str, server: Batch, server_size: int, split_seed: int,
    config: PretrainConfig, input_shape: tuple[int, ...],
    log: Log | None = None) -> tuple[Params, dict[str, Any]]:
  """Reuses the PM at ``directory`` if it matches, else pretrains and saves one.

  Args:
    directory: where the PM checkpoint is (or will be).
    model: the PM module; ``model_name`` is its registry name and must equal
      ``config.model``.
    dataset_name: the dataset the server split comes from.
    server: the server split (``pretrain``'s ``server``).
    server_size: ``|D_srv|``; must equal the number of examples in ``server``.
    split_seed: seed of the partition the server split belongs to.
    config: the pretraining recipe (a saved PM must have been trained with
      it; used to pretrain one when there is none).
    input_shape: shape of one example; must match ``server["x"]``.
    log: optional progress callback.

  Returns:
    ``(variables, metadata)``: ``{"params", "batch_stats"}``.

  Raises:
    PMCheckpointMismatch: a checkpoint exists but was trained for another
      dataset, architecture, server split, recipe or format.
    FileNotFoundError: ``directory`` exists but is not a readable checkpoint.
    ValueError: inconsistent arguments.
  """
  _check_args(model_name, server, server_size, config, input_shape)
  log = log or (lambda _: None)
  if not checkpoint.exists(directory):
    log(f"no PM at {directory}: pretraining {model_name} on the "
        f"{server_size} server examples of {dataset_name} for "
        f"{counted(config.epochs, 'epoch')}")
    return pretrain_and_save(
        directory, model=model, model_name=model_name,
        dataset_name=dataset_name, server=server, server_size=server_size,
        split_seed=split_seed, config=config, log=log)
  expected = pm_metadata(dataset_name, model_name, server_size, split_seed,
                         model_kwargs=model_kwargs(model), config=config)
  like = jax.eval_shape(lambda: {
      "params": models.init_params(model, jax.random.key(0), input_shape),
      "batch_stats": models.init_batch_stats(model, input_shape)})
  variables, metadata = load_pm(directory, expected, like=like)
  log(f"reusing the PM at {directory} ({model_name}, held-out accuracy "
      f"{_percent(metadata.get('heldout_accuracy'))}, "
      f"{counted(metadata.get('epochs'), 'epoch')})")
  return variables, metadata
