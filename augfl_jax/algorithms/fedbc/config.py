"""FedBC's and Per-FedBC's hyper-parameters: one config for the round
(:mod:`~.fedbc.method`) and the local training (:mod:`~.fedbc.local`)."""

from __future__ import annotations

import dataclasses
import math

from augfl_jax.core import fields
from augfl_jax.core.fields import field

__all__ = ["FedBCConfig", "START_FROM"]

START_FROM = ("z", "x")


@dataclasses.dataclass(frozen=True)
class FedBCConfig(fields.Config):
  """Hyper-parameters of FedBC / Per-FedBC (defaults: the public code's
  ``utils/options.py`` and the paper's App. D.2)."""

  lr: float = field(0.01, "client SGD step size beta of Algorithm 2 (FedBC "
      "only)", gt=0, resume="named")
  local_epochs: int = field(5, "local epochs E (the paper's 5)", ge=1)
  batch_size: int = field(20, "local minibatch size B (the public code's "
      "20)", ge=1)
  momentum: float = field(0.0, "heavy-ball momentum of the client SGD, its "
      "buffer reset every round (FedBC only)", ge=0, lt=1)
  lr_lambda: float = field(1e-3, "dual step size of lambda_i, Eq. (11) (the "
      "public code's lamb_lr 1e-3)", ge=0, resume="named")
  lr_gamma: float = field(1e-3, "step size of the tolerance gamma_i (the "
      "paper: equal to lr_lambda)", ge=0, resume="named")
  lambda_max: float = field(math.inf, "upper end of the dual domain (inf: no "
      "upper clip, as the public code)", allow_inf=True, gt=0)
  start_from: str = field("z", "local training starts from z (the public "
      "code) or x (Algorithm 2: from x_i)", choices=START_FROM)
  personalized: bool = field(False, "Per-FedBC (Algorithm 3): set by "
      "--algorithm=per_fedbc")
  alpha: float = field(0.01, "Per-FedBC's inner step (the held-out clients' "
      "adaptation step too)", gt=0, resume="named")
  beta: float = field(0.001, "Per-FedBC's outer step (0.001, as Per-FedAvg in "
      "the paper)", gt=0, resume="named")
  inner_steps: int = field(1, "Per-FedBC's inner steps J (the paper's 1)", ge=1)

