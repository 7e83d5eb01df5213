"""FedBC's and Per-FedBC's hyper-parameters: one config for the round
(:mod:`.round`) and the local training (:mod:`.local`)."""

from __future__ import annotations

import dataclasses
import math

from augfl_jax.core.fields import field

START_FROM = ("z", "x")


@dataclasses.dataclass(frozen=True)
class FedBCConfig:
  """Hyper-parameters of FedBC / Per-FedBC (defaults: the public code's
  ``utils/options.py`` and the paper's App. D.2)."""

  lr: float = field(0.01, "client SGD step size beta of Algorithm 2 (FedBC "
      "only)")
  local_epochs: int = field(5, "local epochs E (the paper's 5)")
  batch_size: int = field(20, "local minibatch size B (the public code's 20)")
  momentum: float = field(0.0, "heavy-ball momentum of the client SGD, its "
      "buffer reset every round (FedBC only)")
  lr_lambda: float = field(1e-3, "dual step size of lambda_i, Eq. (11) (the "
      "public code's lamb_lr 1e-3)")
  lr_gamma: float = field(1e-3, "step size of the tolerance gamma_i (the "
      "paper: equal to lr_lambda)")
  lambda_max: float = field(math.inf, "upper end of the dual domain (inf: no "
      "upper clip, as the public code)", allow_inf=True)
  start_from: str = field("z", "local training starts from z (the public "
      "code) or x (Algorithm 2: from x_i)", choices=START_FROM)
  personalized: bool = field(False, "Per-FedBC (Algorithm 3): set by "
      "--algorithm=per_fedbc")
  alpha: float = field(0.01, "Per-FedBC's inner step (the held-out clients' "
      "adaptation step too)")
  beta: float = field(0.001, "Per-FedBC's outer step (0.001, as Per-FedAvg in "
      "the paper)")
  inner_steps: int = field(1, "Per-FedBC's inner steps J (the paper's 1)")

  def __post_init__(self):
    for name in ("lr", "alpha", "beta", "lambda_max"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
    for name in ("lr_lambda", "lr_gamma"):
      value = getattr(self, name)
      if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    if not 0 <= self.momentum < 1:
      raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
    if self.local_epochs < 1 or self.batch_size < 1 or self.inner_steps < 1:
      raise ValueError(
          "local_epochs, batch_size and inner_steps must be >= 1, got "
          f"{self.local_epochs}, {self.batch_size}, {self.inner_steps}")
    if self.start_from not in START_FROM:
      raise ValueError(
          f"start_from must be one of {START_FROM}, got {self.start_from!r}")
