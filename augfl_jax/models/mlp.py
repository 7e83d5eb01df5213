"""A multi-layer perceptron: the fast model for the embedded datasets."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax

from augfl_jax.models.norm import apply_norm, check_norm, zero_padding

__all__ = ["MLP"]


class MLP(nn.Module):
  """flatten -> [Dense -> norm -> relu] * len(hidden) -> features -> Dense.

  Attributes:
    num_classes: number of classes.
    hidden: widths of the hidden layers; the last one is the feature width
      (with ``hidden=()`` the features are the flattened input).
    norm: ``"none"`` (default), ``"batch"`` (masked per-batch statistics of
      the real examples of the batch at hand, as the reference does) or
      ``"group"``.
  """

  num_classes: int
  hidden: Sequence[int] = (128,)
  norm: str = "none"

  @nn.compact
  def __call__(
      self, x: jax.Array, mask: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """Applies the MLP.

    Args:
      x: ``[n, ...]`` inputs, flattened to ``[n, d]``.
      mask: ``[n]`` (1 = real, 0 = padding) or None; padded rows are zeroed
        and excluded from batch-norm statistics.

    Returns:
      ``(features [n, hidden[-1]], logits [n, num_classes])``.
    """
    check_norm(self.norm)
    x = zero_padding(x.reshape((x.shape[0], -1)), mask)
    for i, width in enumerate(self.hidden):
      x = nn.Dense(width, use_bias=self.norm == "none", name=f"fc{i + 1}")(x)
      x = apply_norm(self.norm, x, mask, name=f"norm{i + 1}")
      x = nn.relu(x)
    logits = nn.Dense(self.num_classes, name="head")(x)
    return x, logits
