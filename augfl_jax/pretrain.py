"""Pretraining the server's private model (the PM) and its checkpoint.

The PM is trained on the server split only (never on client data) with the
reference recipe: SGD with momentum 0.9, weight decay 5e-4 (coupled, as
PyTorch's ``SGD(weight_decay=...)``: ``g <- g + wd * theta``), lr 0.05 decayed
x0.1 at epochs 150, 180, 210 of 240. For another number of epochs ``E`` the
decay epochs scale to ``round_half_up(E * {0.625, 0.75, 0.875})``; a decay at
epoch ``e`` applies from the ``(e + 1)``-th epoch on (the reference's
``epoch > e`` with 1-based epochs). The last ``holdout_fraction`` of the
server split is held out to report an accuracy and is not trained on.

A PM checkpoint (``augfl_jax.checkpoint``) records what it was trained for:
dataset, architecture (model name and module fields), server split size and
split seed; :func:`load_pm` refuses one that differs in any of these. Module
fields that only choose how the model runs (:data:`IMPLEMENTATION_FIELDS`:
``conv_impl``) are not part of the architecture: the parameters are the
same, so a PM trained with ``conv_impl="patches"`` restores and runs with
``"xla"`` and vice versa.

The only file I/O here is the checkpoint; progress goes to the optional
``log(str)`` callback.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import time
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from augfl_jax import checkpoint, local, models
from augfl_jax.training.progress import Progress
from augfl_jax.types import Batch, Params

__all__ = [
    "PretrainConfig", "PMCheckpointMismatch", "MATCH_FIELDS",
    "IMPLEMENTATION_FIELDS", "decay_epochs",
    "make_optimizer", "pretrain", "model_kwargs", "pm_metadata", "save_pm",
    "load_pm", "default_pm_dir", "pretrain_and_save", "get_or_pretrain_pm",
]

# Fractions of the epochs after which the lr is multiplied by 0.1: the
# reference's (150, 180, 210) of 240.
DECAY_FRACTIONS = (150 / 240, 180 / 240, 210 / 240)
# Metadata fields a PM checkpoint must match to be reused.
MATCH_FIELDS = ("dataset", "architecture", "server_size", "split_seed")
# Module fields that choose an implementation, not the parameters or the
# function (up to float rounding): left out of the architecture.
IMPLEMENTATION_FIELDS = ("conv_impl",)

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """Hyper-parameters of PM pretraining (the reference's).

  Attributes:
    model: the PM architecture's name (``models.create_model``); recorded in
      the checkpoint and checked against the model actually trained.
    epochs: epochs over the server training examples.
    batch_size: minibatch size; the last partial batch of an epoch is masked.
    lr: initial learning rate.
    momentum: SGD (heavy-ball) momentum.
    weight_decay: coupled L2 weight decay on every parameter.
    lr_decay: factor applied at each of the decay epochs.
    holdout_fraction: the last ``floor(holdout_fraction * n)`` server examples
      are held out for the reported accuracy, in ``[0, 1)``.
    eval_batch_size: held-out examples per forward pass (batch-norm models
      use the statistics of each such chunk, as everywhere in the library).
    log_every: epochs between progress lines (``None``: about 10 lines).
    seed: seed of the initialisation and of the minibatch shuffles.
  """

  model: str = "resnet32x4"
  epochs: int = 240
  batch_size: int = 64
  lr: float = 0.05
  momentum: float = 0.9
  weight_decay: float = 5e-4
  lr_decay: float = 0.1
  holdout_fraction: float = 0.1
  eval_batch_size: int = 256
  log_every: int | None = None
  seed: int = 0

  def validate(self) -> None:
    """Raises ``ValueError`` naming the first bad field."""
    checks = [
        (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
        (self.batch_size >= 1,
         f"batch_size must be >= 1, got {self.batch_size}"),
        (self.lr > 0, f"lr must be > 0, got {self.lr}"),
        (0 <= self.momentum < 1, f"momentum must be in [0, 1), got "
         f"{self.momentum}"),
        (self.weight_decay >= 0,
         f"weight_decay must be >= 0, got {self.weight_decay}"),
        (0 <= self.holdout_fraction < 1, "holdout_fraction must be in "
         f"[0, 1), got {self.holdout_fraction}"),
        (self.eval_batch_size >= 1,
         f"eval_batch_size must be >= 1, got {self.eval_batch_size}"),
        (self.log_every is None or self.log_every >= 1,
         f"log_every must be >= 1 or None, got {self.log_every}"),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)


class PMCheckpointMismatch(ValueError):
  """A PM checkpoint was trained for another dataset/architecture/split."""


def decay_epochs(epochs: int) -> tuple[int, ...]:
  """``round_half_up(epochs * f)`` for f in 150/240, 180/240, 210/240."""
  return tuple(int(math.floor(epochs * f + 0.5)) for f in DECAY_FRACTIONS)


def make_optimizer(config: PretrainConfig,
                   steps_per_epoch: int) -> optax.GradientTransformation:
  """``chain(add_decayed_weights(wd), sgd(piecewise lr, momentum))``.

  ``lr_t = lr * lr_decay^{#{e in decay_epochs : t >= e * steps_per_epoch}}``
  with ``t`` the 0-based optimizer step; ties multiply (a few-epoch schedule
  may put two decays on one epoch).
  """
  boundaries: dict[int, float] = {}
  for e in decay_epochs(config.epochs):
    step = e * steps_per_epoch
    boundaries[step] = boundaries.get(step, 1.0) * config.lr_decay
  schedule = optax.piecewise_constant_schedule(config.lr, boundaries)
  return optax.chain(optax.add_decayed_weights(config.weight_decay),
                     optax.sgd(schedule, momentum=config.momentum or None))


def _loss_and_correct(model: nn.Module):
  """``f(params, batch) -> (masked mean CE, [CE sum, #correct, #real])``."""

  def f(params: Params, batch: Batch):
    mask = batch["mask"]
    y = jnp.where(mask > 0, batch["y"].astype(jnp.int32), 0)
    _, logits = model.apply({"params": params}, batch["x"], mask=mask)
    logits = logits.astype(jnp.float32)
    loss = models.masked_mean(
        optax.softmax_cross_entropy_with_integer_labels(logits, y), mask)
    hit = jnp.where(mask > 0, jnp.argmax(logits, -1) == y, False)
    real = jnp.sum(mask)
    return loss, jnp.stack([loss * real, jnp.sum(hit.astype(real.dtype)),
                            real])

  return f


@functools.lru_cache(maxsize=8)
def _jitted(model: nn.Module, config: PretrainConfig, steps_per_epoch: int,
            input_shape: tuple[int, ...]):
  """``(init, shuffle, train_step, evaluate)``, jitted once per model and
  recipe.

  One optimizer step per call (``local.step``, the step of the clients'
  ``local.train``; not a scan over the epoch), so that a slow model reports
  progress within an epoch; a step also returns its loss
  sum, not donated, for the caller to wait on (one step in flight: the
  dispatch of the next step is microseconds against a step's work). Cached so that pretraining twice
  with the same model, hyper-parameters and shapes (tests, sweeps over
  seeds) compiles once; ``config`` comes with the fields that do not enter
  the computation reset.
  """
  optimizer = make_optimizer(config, steps_per_epoch)
  loss_fn = _loss_and_correct(model)

  @jax.jit
  def init(seed):
    init_key, shuffle_key = jax.random.split(jax.random.key(seed))
    params = models.init_params(model, init_key, input_shape)
    return params, optimizer.init(params), shuffle_key

  @jax.jit
  def shuffle(shuffle_key, epoch, data):
    """The epoch's minibatches, ``[steps_per_epoch, batch_size, ...]``."""
    return local.epoch_batches(jax.random.fold_in(shuffle_key, epoch), data,
                               config.batch_size)

  @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
  def train_step(params, opt_state, sums, batches, index):
    minibatch = jax.tree.map(lambda b: b[index], batches)
    params, opt_state, stats = local.step(loss_fn, optimizer, params,
                                          opt_state, minibatch)
    return params, opt_state, sums + stats, stats[0]

  @jax.jit
  def evaluate(params, chunks):
    return jnp.sum(jax.lax.map(lambda c: loss_fn(params, c)[1], chunks), 0)

  return init, shuffle, train_step, evaluate


def _split(server: Batch, holdout_fraction: float
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """(train, held-out) host arrays; held-out = the last floor(f * n) rows."""
  n = int(server["y"].shape[0])
  n_hold = int(math.floor(holdout_fraction * n))
  if n - n_hold < 1:
    raise ValueError(f"The server split has {n} examples; pretraining needs "
                     "at least one training example.")
  mask = server.get("mask")
  data = {"x": np.asarray(server["x"], np.float32),
          "y": np.asarray(server["y"], np.int32),
          "mask": (np.ones((n,), np.float32) if mask is None
                   else np.asarray(mask, np.float32))}
  return ({k: a[:n - n_hold] for k, a in data.items()},
          {k: a[n - n_hold:] for k, a in data.items()})


def _chunks(batch: Mapping[str, np.ndarray], size: int) -> Batch:
  """``[k, size, ...]`` leaves, padded (mask 0) up to a multiple of size."""
  n = batch["mask"].shape[0]
  k = -(-n // size)
  return {key: np.concatenate(
      [a, np.zeros((k * size - n,) + a.shape[1:], a.dtype)]).reshape(
          (k, size) + a.shape[1:]) for key, a in batch.items()}


def _rates(sums: jax.Array) -> tuple[float, float]:
  """``[CE sum, #correct, #real]`` -> ``(mean loss, accuracy)``."""
  loss, correct, real = (float(v) for v in np.asarray(sums))
  if real == 0:
    return math.nan, math.nan
  return loss / real, correct / real


def pretrain(model: nn.Module, server: Batch, config: PretrainConfig, *,
             log: Log | None = None, log_seconds: float = 30.0
            ) -> tuple[Params, dict[str, float]]:
  """Trains ``model`` from scratch on the server split.

  Args:
    model: a model from ``augfl_jax.models``.
    server: the server split ``{"x": [n, ...], "y": [n], "mask": [n]
      (optional)}`` (other keys are ignored). The first
      ``n - floor(holdout_fraction * n)`` examples are trained on, the rest
      only scored.
    config: the hyper-parameters.
    log: optional callback receiving progress lines: the epochs of
      ``config.log_every`` (default about 10 lines), and a line at least
      every ``log_seconds`` (within an epoch too), each with the time per
      step and the time left.
    log_seconds: the longest silence between two progress lines.

  Returns:
    ``(params, metrics)``; metrics holds ``train_loss`` and
    ``train_accuracy`` (running, over the last epoch's minibatches, as the
    reference reports them), ``heldout_loss`` and ``heldout_accuracy``
    (``nan`` without held-out examples), ``num_train``, ``num_heldout``,
    ``epochs`` and ``seconds``.

  Raises:
    FloatingPointError: the training loss became inf/NaN.
  """
  config.validate()
  start = time.perf_counter()
  train, held = _split(server, config.holdout_fraction)
  n_train, n_held = len(train["y"]), len(held["y"])
  steps_per_epoch = -(-n_train // config.batch_size)
  init, shuffle, train_step, evaluate = _jitted(
      model, dataclasses.replace(config, model="", seed=0, log_every=None,
                                 holdout_fraction=0.0, eval_batch_size=1),
      steps_per_epoch, tuple(train["x"].shape[1:]))
  chunks = (jax.device_put(_chunks(held, min(config.eval_batch_size, n_held)))
            if n_held else None)
  heldout = lambda p: _rates(evaluate(p, chunks)) if n_held else (
      math.nan, math.nan)

  params, opt_state, shuffle_key = init(config.seed)
  train = jax.device_put(train)
  every = config.log_every or max(1, config.epochs // 10)
  progress = Progress(config.epochs * steps_per_epoch)
  last_line = time.perf_counter()
  for epoch in range(1, config.epochs + 1):
    batches = shuffle(shuffle_key, epoch, train)
    sums = jnp.zeros((3,))
    for step in range(steps_per_epoch):
      params, opt_state, sums, loss = train_step(params, opt_state, sums,
                                                 batches, step)
      loss.block_until_ready()  # the clock follows the computation
      progress.step()
      if (log is not None and step + 1 < steps_per_epoch and
          time.perf_counter() - last_line >= log_seconds):
        log(f"pm epoch {epoch:4d}/{config.epochs}  step {step + 1}/"
            f"{steps_per_epoch}  {progress.describe('step')}")
        last_line = time.perf_counter()
    last = epoch == config.epochs
    if last or (log is not None and (
        epoch % every == 0 or epoch == 1 or
        time.perf_counter() - last_line >= log_seconds)):
      loss, acc = _rates(sums)
      if not math.isfinite(loss):
        raise FloatingPointError(
            f"PM pretraining diverged at epoch {epoch} (loss {loss}); lower "
            f"the learning rate (lr={config.lr}).")
      held_loss, held_acc = heldout(params)
      if log is not None:
        log(f"pm epoch {epoch:4d}/{config.epochs}  train loss {loss:.4f}  "
            f"train acc {100 * acc:.2f}  held-out acc {100 * held_acc:.2f}  "
            f"{progress.describe('step')}")
        last_line = time.perf_counter()
  return params, {
      "train_loss": loss, "train_accuracy": acc, "heldout_loss": held_loss,
      "heldout_accuracy": held_acc, "num_train": n_train,
      "num_heldout": n_held, "epochs": config.epochs,
      "seconds": time.perf_counter() - start,
  }


# ----------------------------------------------------------------------------
# The PM checkpoint.


def _jsonable(value: Any) -> Any:
  """The value as it reads back from JSON (tuples become lists, ...)."""
  return json.loads(json.dumps(value))


def model_kwargs(model: nn.Module) -> dict[str, Any]:
  """The module's dataclass fields (``num_classes``, widths, norm, ...)
  but :data:`IMPLEMENTATION_FIELDS`."""
  skip = ("parent", "name") + IMPLEMENTATION_FIELDS
  return _jsonable({f.name: getattr(model, f.name)
                    for f in dataclasses.fields(model) if f.name not in skip})


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
                **extra: Any) -> dict[str, Any]:
  """The metadata of a PM checkpoint (and what a run expects of one).

  Args:
    dataset: dataset name.
    model_name: the PM's registry name.
    server_size: size of the server split it is trained on.
    split_seed: seed of the partition that produced the server split.
    model_kwargs: the module's fields (:func:`model_kwargs`), part of the
      architecture.
    **extra: recorded, never compared (held-out accuracy, epochs, ...).

  Returns:
    A JSON-ready dict; :data:`MATCH_FIELDS` are the compared ones.
  """
  return _jsonable({
      "dataset": dataset,
      "architecture": {"model": model_name,
                       "kwargs": dict(model_kwargs or {})},
      "server_size": int(server_size),
      "split_seed": int(split_seed),
      **extra,
  })


def _describe(field: str, value: Any) -> str:
  if field == "architecture" and isinstance(value, dict):
    kwargs = ", ".join(f"{k}={v!r}" for k, v in value.get("kwargs", {}).items())
    return f"architecture={value.get('model')}({kwargs})"
  return f"{field}={value}"


def save_pm(directory: str | os.PathLike, params: Params,
            metadata: Mapping[str, Any], *, overwrite: bool = False) -> None:
  """Saves a PM atomically; adds ``num_params`` and ``created`` (UTC, ISO)."""
  metadata = {**metadata, "num_params": models.num_params(params)}
  metadata.setdefault(
      "created", datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"))
  checkpoint.save(directory, params, metadata, overwrite=overwrite)


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
    like: optional abstract params (shapes checked on restore).

  Returns:
    ``(params, metadata)``.

  Raises:
    FileNotFoundError: no readable checkpoint at ``directory``.
    PMCheckpointMismatch: a compared field differs; the message names every
      differing field, both values, and how to retrain.
  """
  saved = _architecture(checkpoint.restore_metadata(directory))
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
  params, metadata = checkpoint.restore(directory, like)
  return params, metadata


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
  n = int(server["y"].shape[0])
  shape = tuple(server["x"].shape[1:])
  checks = [
      (config.model == model_name, f"config.model={config.model!r} but "
       f"model_name={model_name!r}; they must name the same PM."),
      (n == server_size,
       f"server_size={server_size} but the server split has {n} examples."),
      (input_shape is None or tuple(input_shape) == shape,
       f"input_shape={input_shape} but the server examples have shape "
       f"{shape}."),
  ]
  for ok, message in checks:
    if not ok:
      raise ValueError(message)


def pretrain_and_save(
    directory: str | os.PathLike, *, model: nn.Module, model_name: str,
    dataset_name: str, server: Batch, server_size: int, split_seed: int,
    config: PretrainConfig, log: Log | None = None, overwrite: bool = False
) -> tuple[Params, dict[str, Any]]:
  """:func:`pretrain`, then :func:`save_pm` with the full metadata.

  The metadata is :func:`pm_metadata` plus the metrics of :func:`pretrain`
  (``nan`` stored as ``null``), ``input_shape`` and ``pretrain_config``.
  Arguments as :func:`get_or_pretrain_pm`; ``overwrite`` replaces an
  existing checkpoint (atomically).

  Returns:
    ``(params, metadata)`` as :func:`load_pm` would return them.
  """
  _check_args(model_name, server, server_size, config)
  log = log or (lambda _: None)
  params, metrics = pretrain(model, server, config, log=log)
  metrics = {k: None if isinstance(v, float) and math.isnan(v) else v
             for k, v in metrics.items()}  # JSON has no NaN.
  metadata = pm_metadata(
      dataset_name, model_name, server_size, split_seed,
      model_kwargs=model_kwargs(model), **metrics,
      input_shape=list(server["x"].shape[1:]),
      pretrain_config=dataclasses.asdict(config))
  save_pm(directory, params, metadata, overwrite=overwrite)
  log(f"saved the PM to {directory} (held-out accuracy "
      f"{_percent(metrics['heldout_accuracy'])})")
  return params, checkpoint.restore_metadata(directory)


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
    config: pretraining hyper-parameters (used only when pretraining).
    input_shape: shape of one example; must match ``server["x"]``.
    log: optional progress callback.

  Returns:
    ``(params, metadata)``.

  Raises:
    PMCheckpointMismatch: a checkpoint exists but was trained for another
      dataset, architecture, server split size or split seed.
    FileNotFoundError: ``directory`` exists but is not a readable checkpoint.
    ValueError: inconsistent arguments.
  """
  _check_args(model_name, server, server_size, config, input_shape)
  log = log or (lambda _: None)
  if not checkpoint.exists(directory):
    log(f"no PM at {directory}: pretraining {model_name} on the "
        f"{server_size} server examples of {dataset_name} for "
        f"{config.epochs} epochs")
    return pretrain_and_save(
        directory, model=model, model_name=model_name,
        dataset_name=dataset_name, server=server, server_size=server_size,
        split_seed=split_seed, config=config, log=log)
  expected = pm_metadata(dataset_name, model_name, server_size, split_seed,
                         model_kwargs=model_kwargs(model))
  like = jax.eval_shape(
      lambda: models.init_params(model, jax.random.key(0), input_shape))
  params, metadata = load_pm(directory, expected, like=like)
  log(f"reusing the PM at {directory} ({model_name}, held-out accuracy "
      f"{_percent(metadata.get('heldout_accuracy'))}, "
      f"{metadata.get('epochs')} epochs)")
  return params, metadata
