"""Pretraining the server's private model (the PM) on the server split.

The PM is trained on the server split only (never on client data) with the
reference recipe (:mod:`augfl_jax.pm.recipe`: SGD with momentum and
coupled weight decay, lr decayed x0.1 at 5/8, 3/4 and 7/8 of the epochs;
re-exported here). The last ``holdout_fraction`` of the server split is
held out to report an accuracy and is not trained on.

A batch-norm PM also keeps running statistics while it trains (PyTorch's:
momentum 0.1, unbiased variance; ``models.norm``), so that it can run in eval
mode as the reference's teacher does (``norm="running"``). Its held-out
accuracy is reported both ways: with those running statistics and with the
statistics of each held-out chunk.

No file I/O here: the PM's checkpoint is :mod:`augfl_jax.pm.store`'s, and
the checkpoints an interrupted pretraining continues from are passed in
(``checkpoints``, :mod:`augfl_jax.pm.checkpoints`); progress goes to the
optional ``log(str)`` callback.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Mapping, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from augfl_jax.core import local, tree
from augfl_jax import models
from augfl_jax.core.progress import Progress
from augfl_jax.pm.recipe import (DECAY_FRACTIONS, PretrainConfig,
                                       decay_epochs, make_optimizer)
from augfl_jax.core.types import Batch, Params

__all__ = ["Checkpoints", "DECAY_FRACTIONS", "PretrainConfig", "Stopped",
           "data_digest", "decay_epochs", "make_optimizer", "position",
           "pretrain"]

Log = Callable[[str], None]


class Stopped(Exception):
  """Pretraining (or the wait for another process pretraining the same PM)
  ended early because ``should_stop()`` said so; no PM was returned or
  saved. The message says where it stopped and what was kept (a checkpoint
  that the same command continues from, with ``checkpoints``)."""


def position(done: int, steps_per_epoch: int, epochs: int) -> str:
  """Where pretraining is after ``done`` optimizer steps: ``epoch 3/10``
  when that epoch is complete, else ``epoch 4/10, step 57/141``."""
  epoch, step = divmod(done, steps_per_epoch)
  if step == 0 and done:
    return f"epoch {epoch}/{epochs}"
  return f"epoch {epoch + 1}/{epochs}, step {step}/{steps_per_epoch}"


def _loss_and_correct(model: nn.Module, with_stats: bool = False,
                      track: bool = False):
  """``f(params, batch, stats) -> (masked mean CE, ([CE sum, #correct,
  #real], stats'))``. ``with_stats``: the model reads the running
  statistics ``stats`` (``"batch_stats"``); ``track``: it also updates them
  (``stats'``; else ``stats' = stats``)."""

  def f(params: Params, batch: Batch, stats: Params):
    mask = batch["mask"]
    y = jnp.where(mask > 0, batch["y"].astype(jnp.int32), 0)
    variables = {"params": params}
    if with_stats:
      variables["batch_stats"] = stats
    if track:
      (_, logits), updated = model.apply(variables, batch["x"], mask=mask,
                                         mutable=["batch_stats"])
      stats = updated["batch_stats"]
    else:
      _, logits = model.apply(variables, batch["x"], mask=mask)
    logits = logits.astype(jnp.float32)
    loss = models.masked_mean(
        optax.softmax_cross_entropy_with_integer_labels(logits, y), mask)
    hit = jnp.where(mask > 0, jnp.argmax(logits, -1) == y, False)
    real = jnp.sum(mask)
    return loss, (jnp.stack([loss * real, jnp.sum(hit.astype(real.dtype)),
                             real]), stats)

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
  has_stats = bool(models.init_batch_stats(model, input_shape))
  loss_fn = _loss_and_correct(model, has_stats, track=has_stats)
  scores = [_loss_and_correct(model)]  # each chunk's own statistics
  if has_stats:  # and eval mode, the running statistics
    scores.append(_loss_and_correct(
        dataclasses.replace(model, norm="running"), with_stats=True))

  @jax.jit
  def init(seed):
    init_key, shuffle_key = jax.random.split(jax.random.key(seed))
    params = models.init_params(model, init_key, input_shape)
    stats = models.init_batch_stats(model, input_shape)
    return params, stats, optimizer.init(params), shuffle_key

  @jax.jit
  def shuffle(shuffle_key, epoch, data):
    """The epoch's minibatches, ``[steps_per_epoch, batch_size, ...]``."""
    return local.epoch_batches(jax.random.fold_in(shuffle_key, epoch), data,
                               config.batch_size)

  @functools.partial(jax.jit, donate_argnums=(0, 1, 2, 3))
  def train_step(params, stats, opt_state, sums, batches, index):
    minibatch = jax.tree.map(lambda b: b[index], batches)
    params, opt_state, (step_sums, stats) = local.step(
        loss_fn, optimizer, params, opt_state, minibatch, stats)
    return params, stats, opt_state, sums + step_sums, step_sums[0]

  @jax.jit
  def evaluate(params, stats, chunks):
    """``[CE sum, #correct, #real]`` of the held-out chunks per way of
    scoring (``scores``)."""
    return [jnp.sum(jax.lax.map(lambda c, f=f: f(params, c, stats)[1][0],
                                chunks), 0) for f in scores]

  return init, shuffle, train_step, evaluate


def _arrays(server: Batch) -> dict[str, np.ndarray]:
  """The server split as pretraining reads it: float32 ``x``, int32 ``y``
  and a float32 ``mask`` (ones where there is none)."""
  n = int(server["y"].shape[0])
  mask = server.get("mask")
  return {"x": np.asarray(server["x"], np.float32),
          "y": np.asarray(server["y"], np.int32),
          "mask": (np.ones((n,), np.float32) if mask is None
                   else np.asarray(mask, np.float32))}


def data_digest(server: Batch) -> str:
  """SHA-256 (hex) of the server split's examples, labels and mask as
  pretraining reads them (``server`` as :func:`pretrain`'s)."""
  return tree.digest(_arrays(server))


def _split(server: Batch, holdout_fraction: float
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """(train, held-out) host arrays; held-out = the last floor(f * n) rows."""
  n = int(server["y"].shape[0])
  n_hold = int(math.floor(holdout_fraction * n))
  if n - n_hold < 1:
    raise ValueError(f"The server split has {n} examples; pretraining needs "
                     "at least one training example.")
  data = _arrays(server)
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


class Checkpoints(Protocol):
  """Where :func:`pretrain` keeps its state to be continued
  (:class:`augfl_jax.pm.checkpoints.PretrainingCheckpoints`)."""

  directory: str

  def restore(self, like: Any) -> tuple[Any, dict[str, Any]] | None:
    """The newest saved ``(state, metadata)`` (a tree like ``like``;
    ``metadata["steps_done"]``, ``metadata["seconds"]``), or ``None``."""

  def save(self, state: Any, *, steps_done: int, seconds: float) -> None:
    """Saves ``state`` after ``steps_done`` optimizer steps, ``seconds``
    of pretraining in all."""


def pretrain(model: nn.Module, server: Batch, config: PretrainConfig, *,
             log: Log | None = None, log_seconds: float = 30.0,
             should_stop: Callable[[], bool] | None = None,
             checkpoints: Checkpoints | None = None
            ) -> tuple[Params, dict[str, float]]:
  """Trains ``model`` from scratch on the server split, or continues the
  pretraining ``checkpoints`` holds.

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
    should_stop: asked after every step but the last; True ends
      pretraining there (:class:`Stopped`), after saving a checkpoint.
    checkpoints: optional; its newest checkpoint is continued from (the
      parameters, running statistics, optimizer state, shuffling key and the
      epoch's running sums, at the step they were saved: the result is the
      uninterrupted pretraining's, bit for bit), and the state is saved
      every ``config.checkpoint_every_steps`` steps (0: at the end of every
      epoch) and when ``should_stop()`` says so, never after the last step.

  Returns:
    ``(variables, metrics)``: ``variables = {"params": ..., "batch_stats":
    ...}`` (``batch_stats`` the running statistics of a batch-norm model,
    ``{}`` for others); metrics holds ``train_loss`` and ``train_accuracy``
    (running, over the last epoch's minibatches, as the reference reports
    them), ``heldout_loss`` and ``heldout_accuracy`` (each held-out chunk of
    ``eval_batch_size`` with its own batch statistics; ``nan`` without
    held-out examples), ``heldout_accuracy_running`` (with the running
    statistics; ``None`` without batch norm), ``num_train``,
    ``num_heldout``, ``epochs`` and ``seconds`` (those of the checkpoint
    continued from included).

  Raises:
    FloatingPointError: the training loss became inf/NaN.
    Stopped: ``should_stop()`` returned True.
  """
  config.validate()
  start = time.perf_counter()
  train, held = _split(server, config.holdout_fraction)
  n_train, n_held = len(train["y"]), len(held["y"])
  steps_per_epoch = -(-n_train // config.batch_size)
  init, shuffle, train_step, evaluate = _jitted(
      model, dataclasses.replace(config, model="", seed=0, log_every=None,
                                 holdout_fraction=0.0, eval_batch_size=1,
                                 checkpoint_every_steps=0),
      steps_per_epoch, tuple(train["x"].shape[1:]))
  chunks = (jax.device_put(_chunks(held, min(config.eval_batch_size, n_held)))
            if n_held else None)

  def heldout(params, stats):
    """``[(loss, accuracy)]`` with each chunk's statistics, then (a
    batch-norm model) with the running ones."""
    if not n_held:
      return [(math.nan, math.nan)]
    return [_rates(sums) for sums in evaluate(params, stats, chunks)]

  params, stats, opt_state, shuffle_key = init(config.seed)
  sums = jnp.zeros((3,))
  total = config.epochs * steps_per_epoch
  done, seconds_before = 0, 0.0
  where = lambda: position(done, steps_per_epoch, config.epochs)
  if checkpoints is not None:
    like = {"params": params, "batch_stats": stats, "opt_state": opt_state,
            "shuffle_key": shuffle_key, "sums": sums}
    restored = checkpoints.restore(jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like))
    if restored is not None:
      state, meta = restored
      params, stats, opt_state, shuffle_key, sums = (
          state[k] for k in ("params", "batch_stats", "opt_state",
                             "shuffle_key", "sums"))
      done, seconds_before = int(meta["steps_done"]), float(meta["seconds"])
      if log is not None:
        log(f"continuing PM pretraining from {where()} "
            f"({checkpoints.directory})")
  train = jax.device_put(train)
  checkpoint_every = config.checkpoint_every_steps or steps_per_epoch
  lines_every = config.log_every or max(1, config.epochs // 10)
  progress = Progress(total, done=done)
  last_line = time.perf_counter()
  for epoch in range(done // steps_per_epoch + 1, config.epochs + 1):
    batches = shuffle(shuffle_key, epoch, train)
    first = done - (epoch - 1) * steps_per_epoch  # > 0: continued mid-epoch
    if not first:
      sums = jnp.zeros((3,))
    for step in range(first, steps_per_epoch):
      params, stats, opt_state, sums, loss = train_step(
          params, stats, opt_state, sums, batches, step)
      loss.block_until_ready()  # the clock follows the computation
      done += 1
      progress.step()
      stop = done < total and should_stop is not None and should_stop()
      if checkpoints is not None and done < total and (
          stop or done % checkpoint_every == 0):
        checkpoints.save(
            {"params": params, "batch_stats": stats, "opt_state": opt_state,
             "shuffle_key": shuffle_key, "sums": sums}, steps_done=done,
            seconds=seconds_before + time.perf_counter() - start)
      if stop:
        kept = f"epoch {epoch}" + (f", step {step + 1}" if step + 1 <
                                   steps_per_epoch else "")
        raise Stopped(f"PM pretraining stopped at {where()}; " + (
            "nothing was kept" if checkpoints is None else
            f"its checkpoint ({kept}) is kept in {checkpoints.directory}; "
            "the same command continues it"))
      if log is not None and (estimate := progress.long_estimate("step")):
        log(f"pm pretraining will take long: {estimate}; a smaller PM or "
            "fewer epochs shorten it, e.g. --pm.model=cnn --pm.epochs=10 "
            "(README, \"Real data\")")
      if (log is not None and step + 1 < steps_per_epoch and
          time.perf_counter() - last_line >= log_seconds):
        log(f"pm epoch {epoch:4d}/{config.epochs}  step {step + 1}/"
            f"{steps_per_epoch}  {progress.describe('step')}")
        last_line = time.perf_counter()
    if epoch == config.epochs or (log is not None and (
        epoch % lines_every == 0 or epoch == 1 or
        time.perf_counter() - last_line >= log_seconds)):
      loss, acc, scored = _score_epoch(epoch, sums, params, stats, heldout,
                                       config)
      if log is not None:
        held_acc = f"held-out acc {100 * scored[0][1]:.2f}" + (
            f" ({100 * scored[1][1]:.2f} with running statistics)"
            if len(scored) > 1 else "")
        log(f"pm epoch {epoch:4d}/{config.epochs}  train loss {loss:.4f}  "
            f"train acc {100 * acc:.2f}  {held_acc}  "
            f"{progress.describe('step')}")
        last_line = time.perf_counter()
  running = scored[1] if len(scored) > 1 else (None, None)
  return {"params": params, "batch_stats": stats}, {
      "train_loss": loss, "train_accuracy": acc,
      "heldout_loss": scored[0][0], "heldout_accuracy": scored[0][1],
      "heldout_accuracy_running": running[1], "num_train": n_train,
      "num_heldout": n_held, "epochs": config.epochs,
      "seconds": seconds_before + time.perf_counter() - start,
  }


def _score_epoch(epoch, sums, params, stats, heldout, config):
  """``(train loss, train accuracy, heldout(params, stats))`` at the end
  of ``epoch``; raises ``FloatingPointError`` when the loss is not
  finite."""
  loss, acc = _rates(sums)
  if not math.isfinite(loss):
    raise FloatingPointError(
        f"PM pretraining diverged at epoch {epoch} (loss {loss}); lower "
        f"the learning rate (lr={config.lr}).")
  return loss, acc, heldout(params, stats)
