"""CIFAR-style ResNets of the CRD code base (RepDistiller ``models/resnet.py``).

``ResNet(depth, num_filters)``: a 3x3 conv to ``num_filters[0]`` -> norm ->
relu, three stages of ``(depth - 2) / 6`` BasicBlocks with
``num_filters[1:]`` channels and strides 1, 2, 2 (1x1 conv + norm shortcut
where the shape changes), global average pooling (the features) and a linear
classifier (the logits). Convolutions have no bias and the reference's
Kaiming-normal (fan_out, relu) initialisation; 3x3 convs pad by 1 on each
side as PyTorch does (so strided convs agree with the reference exactly).

The reference pools with ``AvgPool2d(8)``, i.e. global pooling for 32x32
inputs; here the pooling is over whatever spatial size the last stage has, so
any input size works (8x8 digits, 28x28 EMNIST, 64x64 Tiny-ImageNet).

Parameter counts (PyTorch convention: conv weights, norm scale/bias, fc
weight/bias; batch-norm running averages are not parameters and do not exist
here) with 3 input channels and 100 classes: resnet8x4 1,233,540,
resnet32x4 7,433,860, resnet8 83,892, resnet20 278,324, resnet32 472,756
(identical to the reference model's count).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from augfl_jax.models.conv import AUTO, Conv, check_conv_impl
from augfl_jax.models.norm import apply_norm, check_norm, zero_padding

__all__ = [
    "BasicBlock", "conv_init", "ResNet", "resnet20", "resnet32", "resnet32x4",
    "resnet8", "resnet8x4"
]

# nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu").
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def _conv3x3(features: int, strides: int, name: str, impl: str) -> Conv:
  return Conv(features, (3, 3), strides=(strides, strides),
              padding=((1, 1), (1, 1)), use_bias=False,
              kernel_init=conv_init, impl=impl, name=name)


class BasicBlock(nn.Module):
  """conv3x3 -> norm -> relu -> conv3x3 -> norm, + shortcut, -> relu.

  Attributes:
    features: output channels.
    strides: stride of the first conv (and of the shortcut conv).
    norm: ``"batch"`` | ``"group"`` | ``"none"`` (see ``models.norm``).
    conv_impl: ``"auto"`` | ``"xla"`` | ``"patches"`` (see ``models.conv``).
  """

  features: int
  strides: int = 1
  norm: str = "batch"
  conv_impl: str = AUTO

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
    """``[n, H, W, C] -> [n, ceil(H / s), ceil(W / s), features]``."""
    residual = x
    y = _conv3x3(self.features, self.strides, "conv1", self.conv_impl)(x)
    y = nn.relu(apply_norm(self.norm, y, mask, name="norm1"))
    y = _conv3x3(self.features, 1, "conv2", self.conv_impl)(y)
    y = apply_norm(self.norm, y, mask, name="norm2")
    if self.strides != 1 or x.shape[-1] != self.features:
      residual = Conv(self.features, (1, 1),
                      strides=(self.strides, self.strides), padding="VALID",
                      use_bias=False, kernel_init=conv_init,
                      impl=self.conv_impl, name="shortcut_conv")(x)
      residual = apply_norm(self.norm, residual, mask, name="shortcut_norm")
    return nn.relu(y + residual)


class ResNet(nn.Module):
  """CIFAR ResNet with BasicBlocks (depth = 6 k + 2).

  Attributes:
    depth: 8, 14, 20, 32, ... (``(depth - 2) % 6 == 0``).
    num_filters: 4 channel counts: stem, stage 1, stage 2, stage 3.
    num_classes: number of classes.
    norm: ``"batch"`` (default: masked per-batch statistics of the real
      examples of the batch at hand, also at evaluation, as the reference runs
      its ResNets in training mode), ``"group"`` or ``"none"``.
    conv_impl: ``"auto"`` (``"patches"`` on CPU, ``"xla"`` elsewhere),
      ``"xla"`` or ``"patches"`` (see ``models.conv``); the same parameters
      and outputs either way (up to float rounding), only the speed differs.
  """

  depth: int
  num_filters: Sequence[int]
  num_classes: int
  norm: str = "batch"
  conv_impl: str = AUTO

  @nn.compact
  def __call__(
      self, x: jax.Array, mask: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    """Applies the ResNet.

    Args:
      x: ``[n, H, W, C]`` images (NHWC, any H, W, C); ``[n, H, W]`` is read
        as C = 1.
      mask: ``[n]`` (1 = real example, 0 = padding) or None (all real).
        Padded rows are zeroed and excluded from batch-norm statistics.

    Returns:
      ``(features [n, num_filters[3]], logits [n, num_classes])``; the
      features are the globally average-pooled last stage.
    """
    check_norm(self.norm)
    check_conv_impl(self.conv_impl)
    if (self.depth - 2) % 6 != 0 or self.depth < 8:
      raise ValueError(
          f"ResNet depth must be 6 k + 2 (8, 14, 20, 32, ...), got "
          f"{self.depth}.")
    if len(self.num_filters) != 4:
      raise ValueError(
          f"num_filters must have 4 entries, got {self.num_filters}.")
    if x.ndim == 3:
      x = x[..., None]
    if x.ndim != 4:
      raise ValueError(f"ResNet expects [n, H, W, C] inputs, got {x.shape}.")
    blocks = (self.depth - 2) // 6
    x = zero_padding(x, mask)
    x = _conv3x3(self.num_filters[0], 1, "conv1", self.conv_impl)(x)
    x = nn.relu(apply_norm(self.norm, x, mask, name="norm1"))
    for stage, (width, strides) in enumerate(
        zip(self.num_filters[1:], (1, 2, 2))):
      for b in range(blocks):
        x = BasicBlock(width, strides if b == 0 else 1, self.norm,
                       self.conv_impl, name=f"layer{stage + 1}_{b}")(x, mask)
    features = jnp.mean(x, axis=(1, 2))
    logits = nn.Dense(self.num_classes, name="fc")(features)
    return features, logits


def resnet8(num_classes: int, **kwargs) -> ResNet:
  """ResNet-8, filters (16, 16, 32, 64)."""
  return ResNet(8, (16, 16, 32, 64), num_classes, **kwargs)


def resnet20(num_classes: int, **kwargs) -> ResNet:
  """ResNet-20, filters (16, 16, 32, 64)."""
  return ResNet(20, (16, 16, 32, 64), num_classes, **kwargs)


def resnet32(num_classes: int, **kwargs) -> ResNet:
  """ResNet-32, filters (16, 16, 32, 64)."""
  return ResNet(32, (16, 16, 32, 64), num_classes, **kwargs)


def resnet8x4(num_classes: int, **kwargs) -> ResNet:
  """ResNet-8x4 (AugFL's client model), filters (32, 64, 128, 256)."""
  return ResNet(8, (32, 64, 128, 256), num_classes, **kwargs)


def resnet32x4(num_classes: int, **kwargs) -> ResNet:
  """ResNet-32x4 (AugFL's PM), filters (32, 64, 128, 256)."""
  return ResNet(32, (32, 64, 128, 256), num_classes, **kwargs)
