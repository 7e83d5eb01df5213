"""Multinomial logistic regression (FedBC's Synthetic(alpha, beta) model)."""

from __future__ import annotations

import flax.linen as nn
import jax

from augfl_jax.models.norm import zero_padding

__all__ = ["LogisticRegression"]


class LogisticRegression(nn.Module):
  """``logits = W flatten(x) + b``; the features are the flattened input.

  Attributes:
    num_classes: number of classes.
  """

  num_classes: int

  @nn.compact
  def __call__(
      self, x: jax.Array, mask: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """Applies the model.

    Args:
      x: ``[n, ...]`` inputs, flattened to ``[n, d]``.
      mask: ``[n]`` (1 = real, 0 = padding) or None; padded rows are zeroed.

    Returns:
      ``(features [n, d], logits [n, num_classes])``.
    """
    features = zero_padding(x.reshape((x.shape[0], -1)), mask)
    logits = nn.Dense(self.num_classes, name="head")(features)
    return features, logits
