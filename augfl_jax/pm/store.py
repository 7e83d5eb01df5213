"""The PM's checkpoint: what it was trained for, reused only when it matches.

A PM checkpoint (``augfl_jax.storage.checkpoint``, atomic) holds the variables of
:func:`augfl_jax.pm.pretrain.pretrain` (``{"params", "batch_stats"}``) and
records what shaped them (:mod:`augfl_jax.pm.metadata`: the dataset, the
architecture, the server split, the recipe, the format); :func:`load_pm`
refuses one that differs in any of these, naming the fields. Its arrays and
metadata are verified when it is loaded (``augfl_jax.storage.checkpoint``'s
checksums), and one process at a time pretrains a missing PM (a lock beside
the directory): another waits, then reuses it. Pretraining keeps checkpoints
beside the directory (:mod:`augfl_jax.pm.checkpoints`), from which the same
call continues an interrupted pretraining to the same PM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
from typing import Any, Callable, Iterator, Mapping

import flax.linen as nn
import jax

from augfl_jax.storage import checkpoint, locks
from augfl_jax import models
from augfl_jax.pm.metadata import (FORMAT, IMPLEMENTATION_FIELDS,
                                   MATCH_FIELDS, PMCheckpointMismatch,
                                   check_match, model_kwargs, pm_metadata)
from augfl_jax.pm.checkpoints import PretrainingCheckpoints
from augfl_jax.pm.pretrain import (PretrainConfig, Stopped, data_digest,
                                   pretrain)
from augfl_jax.core.progress import counted
from augfl_jax.pm.recipe import recipe
from augfl_jax.core.types import Batch, Params

__all__ = [
    "FORMAT", "IMPLEMENTATION_FIELDS", "MATCH_FIELDS", "PMCheckpointMismatch",
    "default_pm_dir", "get_or_pretrain_pm", "load_pm", "model_kwargs",
    "pm_metadata", "pretrain_and_save", "recipe", "save_pm",
]

Log = Callable[[str], None]


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
    checkpoint.DamagedCheckpointError: an array or the metadata differs
      from what was saved, or a file of it cannot be read; the message
      says how to replace it.
  """
  try:
    check_match(directory, checkpoint.restore_metadata(directory), expected)
    return checkpoint.restore(directory, like)
  except checkpoint.DamagedCheckpointError as e:
    raise checkpoint.DamagedCheckpointError(
        f"the PM is damaged ({e}): remove {directory} to pretrain it again, "
        "or pass another --pm.dir") from None


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


@contextlib.contextmanager
def _lock(directory: str | os.PathLike, log: Log, then: str,
          should_stop: Callable[[], bool] | None) -> Iterator[None]:
  """Holds the lock ``.<name>.lock`` beside the PM's ``directory`` for the
  block: one process at a time pretrains a PM. While another holds it, this
  one waits, saying so once (``then``: what it does next), and stops
  (:class:`~augfl_jax.pm.pretrain.Stopped`) when ``should_stop()`` says
  so."""
  path = os.path.abspath(os.path.expanduser(os.fspath(directory)))
  lock = os.path.join(os.path.dirname(path),
                      f".{os.path.basename(path)}.lock")
  waiting = []

  def busy(holder: str) -> None:
    if not waiting:
      log(f"waiting for process {holder}, which is pretraining the PM at "
          f"{directory}, {then}")
      waiting.append(holder)
    if should_stop is not None and should_stop():
      raise Stopped(f"stopped while waiting for process {holder} to "
                    "pretrain the PM; nothing was saved")

  with locks.hold(lock, busy):
    yield


def pretrain_and_save(
    directory: str | os.PathLike, *, model: nn.Module, model_name: str,
    dataset_name: str, server: Batch, server_size: int, split_seed: int,
    config: PretrainConfig, log: Log | None = None, overwrite: bool = False,
    should_stop: Callable[[], bool] | None = None
) -> tuple[Params, dict[str, Any]]:
  """:func:`~augfl_jax.pm.pretrain.pretrain`, then :func:`save_pm` with the full
  metadata, holding the PM's lock (one process at a time pretrains it:
  another one waits).

  Pretraining keeps checkpoints in ``<directory>.pretraining``
  (:mod:`augfl_jax.pm.checkpoints`): it continues from the newest one, so
  that an interrupted pretraining (a stop, a signal, ``kill -9``) called
  again gives the PM an uninterrupted one gives, bit for bit, and they are
  removed once the PM is saved.

  The metadata is :func:`pm_metadata` plus the metrics of :func:`pretrain`
  (``nan`` stored as ``null``), ``input_shape`` and ``pretrain_config``.
  Arguments as :func:`get_or_pretrain_pm`; ``overwrite`` replaces an
  existing checkpoint (atomically); ``should_stop`` as ``pretrain``'s
  (:class:`~augfl_jax.pm.pretrain.Stopped`: no PM saved, the pretraining's
  checkpoint kept).

  Returns:
    ``(variables, metadata)`` as :func:`load_pm` would return them.

  Raises:
    PMCheckpointMismatch: ``<directory>.pretraining`` holds the checkpoint
      of another pretraining.
  """
  _check_args(model_name, server, server_size, config)
  log = log or (lambda _: None)
  with _lock(directory, log, "before pretraining it again", should_stop):
    return _pretrain_and_save(
        directory, model=model, model_name=model_name,
        dataset_name=dataset_name, server=server, server_size=server_size,
        split_seed=split_seed, config=config, log=log, overwrite=overwrite,
        should_stop=should_stop)


def _pretrain_and_save(directory, *, model, model_name, dataset_name, server,
                       server_size, split_seed, config, log, overwrite,
                       should_stop):
  """:func:`pretrain_and_save` for the holder of the PM's lock."""
  expected = pm_metadata(dataset_name, model_name, server_size, split_seed,
                         model_kwargs=model_kwargs(model), config=config)
  checkpoints = PretrainingCheckpoints(directory, expected,
                                       data_digest(server), log)
  variables, metrics = pretrain(model, server, config, log=log,
                                should_stop=should_stop,
                                checkpoints=checkpoints)
  metrics = {k: None if isinstance(v, float) and math.isnan(v) else v
             for k, v in metrics.items()}  # JSON has no NaN.
  metadata = pm_metadata(
      dataset_name, model_name, server_size, split_seed,
      model_kwargs=model_kwargs(model), config=config, **metrics,
      input_shape=list(server["x"].shape[1:]),
      pretrain_config=dataclasses.asdict(config))
  save_pm(directory, variables, metadata, overwrite=overwrite)
  checkpoints.remove()
  log(f"saved the PM to {directory} (held-out accuracy "
      f"{_percent(metrics['heldout_accuracy'])})")
  return variables, checkpoint.restore_metadata(directory)


def get_or_pretrain_pm(
    directory: str | os.PathLike, *, model: nn.Module, model_name: str,
    dataset_name: str, server: Batch, server_size: int, split_seed: int,
    config: PretrainConfig, input_shape: tuple[int, ...],
    log: Log | None = None, should_stop: Callable[[], bool] | None = None
) -> tuple[Params, dict[str, Any]]:
  """Reuses the PM at ``directory`` if it matches, else pretrains and saves one.

  One process at a time pretrains a missing PM: while another does (it
  holds the lock ``.<name>.lock`` beside ``directory``), this one waits,
  saying so once, then reuses it. A saved PM is read without the lock (it
  may sit where nothing can be written). An interrupted pretraining is
  continued from its checkpoint (:func:`pretrain_and_save`).

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
    should_stop: asked at every pretraining step and while waiting; True
      stops (:class:`~augfl_jax.pm.pretrain.Stopped`: no PM saved, the
      pretraining's checkpoint kept).

  Returns:
    ``(variables, metadata)``: ``{"params", "batch_stats"}``.

  Raises:
    PMCheckpointMismatch: a checkpoint exists but was trained for another
      dataset, architecture, server split, recipe or format (the PM's, or
      that of an interrupted pretraining).
    checkpoint.DamagedCheckpointError: it differs from what was saved.
    FileNotFoundError: ``directory`` exists but is not a readable checkpoint.
    ValueError: inconsistent arguments.
  """
  _check_args(model_name, server, server_size, config, input_shape)
  log = log or (lambda _: None)
  if not checkpoint.exists(directory):  # a saved PM is read without a lock
    with _lock(directory, log, "to reuse it", should_stop):
      if not checkpoint.exists(directory):
        log(f"no PM at {directory}: pretraining {model_name} on the "
            f"{server_size} server examples of {dataset_name} for "
            f"{counted(config.epochs, 'epoch')}")
        return _pretrain_and_save(
            directory, model=model, model_name=model_name,
            dataset_name=dataset_name, server=server,
            server_size=server_size, split_seed=split_seed, config=config,
            log=log, overwrite=False, should_stop=should_stop)
  expected = pm_metadata(dataset_name, model_name, server_size, split_seed,
                         model_kwargs=model_kwargs(model), config=config)
  like = jax.eval_shape(lambda: {
      "params": models.init_params(model, jax.random.key(0), input_shape),
      "batch_stats": models.init_batch_stats(model, input_shape)})
  variables, metadata = load_pm(directory, expected, like=like)
  note = checkpoint.seal_note(directory)
  unverified = f"; {note}" if note else ""
  log(f"reusing the PM at {directory} ({model_name}, held-out accuracy "
      f"{_percent(metadata.get('heldout_accuracy'))}, "
      f"{counted(metadata.get('epochs'), 'epoch')}{unverified})")
  return variables, metadata
