"""A small CNN for small images (28x28 EMNIST / Fashion-MNIST, 8x8 digits)."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax

from augfl_jax.models.conv import AUTO, Conv, check_conv_impl, max_pool
from augfl_jax.models.norm import apply_norm, check_norm, zero_padding

__all__ = ["CNN"]


class CNN(nn.Module):
  """Conv-norm-relu-pool stages, then a dense feature layer and a classifier.

  For each width: 3x3 conv (SAME) -> norm -> relu -> 2x2 max-pool (stride 2,
  VALID, i.e. floor as in PyTorch); then flatten -> Dense(dense) -> relu (the
  features) -> Dense(num_classes) (the logits). With 28x28x1 inputs, 26
  classes and the defaults it has 1,638,394 parameters (norm="batch").

  Attributes:
    num_classes: number of classes.
    widths: output channels of the conv stages.
    dense: width of the penultimate (feature) layer.
    norm: ``"batch"`` (masked per-batch statistics of the real examples of the
      batch at hand, as the reference does, also at evaluation), ``"group"``
      or ``"none"``. The convs carry a bias only with ``"none"`` (a bias
      before batch/group norm is redundant).
    conv_impl: ``"auto"`` (``"patches"`` on CPU, ``"xla"`` elsewhere),
      ``"xla"`` or ``"patches"``: how convolutions and max-pooling run (see
      ``models.conv``); the same parameters and outputs either way (up to
      float rounding), only the speed differs.
  """

  num_classes: int
  widths: Sequence[int] = (32, 64)
  dense: int = 512
  norm: str = "batch"
  conv_impl: str = AUTO

  @nn.compact
  def __call__(
      self, x: jax.Array, mask: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """Applies the CNN.

    Args:
      x: ``[n, H, W, C]`` images (NHWC); ``[n, H, W]`` is read as C = 1.
      mask: ``[n]`` (1 = real example, 0 = padding) or None (all real).
        Padded rows are zeroed and excluded from batch-norm statistics.

    Returns:
      ``(features [n, dense], logits [n, num_classes])``.
    """
    check_norm(self.norm)
    check_conv_impl(self.conv_impl)
    if x.ndim == 3:
      x = x[..., None]
    if x.ndim != 4:
      raise ValueError(f"CNN expects [n, H, W, C] inputs, got {x.shape}.")
    x = zero_padding(x, mask)
    for i, width in enumerate(self.widths):
      x = Conv(width, (3, 3), padding="SAME", use_bias=self.norm == "none",
               impl=self.conv_impl, name=f"conv{i + 1}")(x)
      x = apply_norm(self.norm, x, mask, name=f"norm{i + 1}")
      x = nn.relu(x)
      if min(x.shape[1:3]) < 2:
        raise ValueError(
            f"CNN input too small: stage {i + 1} has spatial shape "
            f"{x.shape[1:3]}, cannot 2x2 max-pool; use fewer widths.")
      x = max_pool(x, (2, 2), self.conv_impl)
    x = x.reshape((x.shape[0], -1))
    features = nn.relu(nn.Dense(self.dense, name="fc")(x))
    logits = nn.Dense(self.num_classes, name="head")(features)
    return features, logits
