"""The reference recipe for pretraining the PM: :class:`PretrainConfig`,
the decay epochs and the optimizer (:mod:`augfl_jax.pm.pretrain` trains with
them and re-exports these names).

The PM is trained on the server split only (never on client data) with the
reference recipe: SGD with momentum 0.9, weight decay 5e-4 (coupled, as
PyTorch's ``SGD(weight_decay=...)``: ``g <- g + wd * theta``), lr 0.05 decayed
x0.1 at epochs 150, 180, 210 of 240. For another number of epochs ``E`` the
decay epochs scale to ``round_half_up(E * {0.625, 0.75, 0.875})``; a decay at
epoch ``e`` applies from the ``(e + 1)``-th epoch on (the reference's
``epoch > e`` with 1-based epochs). The last ``holdout_fraction`` of the
server split is held out to report an accuracy and is not trained on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import optax

__all__ = ["DECAY_FRACTIONS", "PretrainConfig", "decay_epochs",
           "make_optimizer", "recipe"]

# Fractions of the epochs after which the lr is multiplied by 0.1: the
# reference's (150, 180, 210) of 240.
DECAY_FRACTIONS = (150 / 240, 180 / 240, 210 / 240)
# PretrainConfig fields that do not change the weights.
_NOT_RECIPE = ("model", "eval_batch_size", "log_every",
               "checkpoint_every_steps")


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
    checkpoint_every_steps: with checkpoints (:mod:`augfl_jax.pm.store`),
      the optimizer steps between two of them; 0: one at the end of every
      epoch.
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
  checkpoint_every_steps: int = 0

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
        (self.checkpoint_every_steps >= 0, "checkpoint_every_steps must be "
         f">= 0, got {self.checkpoint_every_steps}"),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)


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


def recipe(config: PretrainConfig) -> dict[str, Any]:
  """The fields of ``config`` that shape the weights (what a PM checkpoint
  records and is matched on, :mod:`augfl_jax.pm.store`)."""
  return {k: v for k, v in dataclasses.asdict(config).items()
          if k not in _NOT_RECIPE}
