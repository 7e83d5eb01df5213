"""FedOA's hyper-parameters: FedIT's (the global adapter) and the personal
adapter's, read by the round (:mod:`~.fedoa.method`) and the personal training
(:mod:`.personal`)."""

from __future__ import annotations

import dataclasses

from augfl_jax.algorithms import fedit
from augfl_jax.core.fields import field

__all__ = ["ANCHORS", "DISTANCES", "FedOAConfig", "REDUCTIONS"]

DISTANCES = ("l2", "squared_l2")
REDUCTIONS = ("mean", "sum")
ANCHORS = ("received", "updated")


@dataclasses.dataclass(frozen=True)
class FedOAConfig(fedit.FedITConfig):
  """FedIT's hyper-parameters (the global adapter) plus the personal
  adapter's."""

  lam: float = field(0.5, "weight lambda of the feature-distance regulariser "
      "(the paper's 0.5)", ge=0)
  distance: str = field("l2", "D of the personal objective: l2 (the "
      "paper's L2-distance) or squared_l2 (||h_p - h_g||^2 per example: the "
      "gradient in its appendix; diverges at lam 0.5, lr 0.05 on digits)",
      choices=DISTANCES)
  reduction: str = field("mean", "mean or sum of the per-example distances "
      "over a minibatch's real examples", choices=REDUCTIONS)
  anchor: str = field("received", "the global features the personal adapter "
      "is pulled to: received (phi_g^{t-1}, Algorithm 1) or updated (this "
      "round's global copy)", choices=ANCHORS)
  personal_lr: float | None = field(None, "step size of the personal "
      "adapter's SGD (default: lr)", gt=0, resume="named")

  @property
  def personal_step(self) -> float:
    return self.lr if self.personal_lr is None else self.personal_lr
