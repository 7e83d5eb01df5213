"""The client models of the AugFL authors' code (zerui981105/AugFL), layer
for layer.

* :func:`authors_fmnist_cnn` (``src/baseModel_fmnist.py``, Fashion-MNIST):
  3x3 conv 1->32 ('same', bias) -> ELU -> 3x3 / stride 2 max-pool (ceil
  mode) -> 3x3 conv 32->64 -> ELU -> the same max-pool -> flatten ->
  linear 3136->10. Weights truncated normal (std 0.1, clipped to
  [-0.2, 0.2]), biases 0.1, no normalisation: 50,186 parameters at 28x28x1.
* :func:`authors_cifar_cnn` (``src/baseModel.py``, CIFAR): convs 3->32,
  32->64, 64->128, each followed by a leaky ReLU ``max(x, 0.2 x)``; 3/2
  max-pools (ceil) after the first two, a 3/2 average pool (ceil) after the
  third, then linear 2048->10. Weights normal (std 0.1, not truncated),
  biases 0.1: 113,738 parameters at 32x32x3.

The pools are PyTorch's ``MaxPool2d`` / ``AvgPool2d(3, 2, ceil_mode=True)``
with no padding: a window that runs past the edge covers only what is
inside (the average divides by that count). The flatten is PyTorch's, in
``[C, H, W]`` order, so a PyTorch ``linear.weight`` ``[10, C H W]`` is this
model's kernel transposed (:func:`params_from_torch`). The features (what
CRD distils) are the flattened input of the linear layer, ``[n, 3136]`` or
``[n, 2048]``.
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.models.conv import AUTO, Conv, check_conv_impl
from augfl_jax.models.norm import zero_padding
from augfl_jax.core.types import Params

__all__ = ["AuthorsCNN", "authors_cifar_cnn", "authors_fmnist_cnn",
           "params_from_torch", "params_to_torch", "pool_ceil"]

ACTIVATIONS = {"elu": nn.elu,
               "leaky_relu": lambda x: jnp.maximum(x, 0.2 * x)}
INITS = {"truncated_normal": nn.initializers.truncated_normal(0.1),
         "normal": nn.initializers.normal(0.1)}


def pool_ceil(x: jax.Array, window: int, stride: int, kind: str
              ) -> jax.Array:
  """PyTorch's ``MaxPool2d`` / ``AvgPool2d(window, stride, padding=0,
  ceil_mode=True)`` on NHWC.

  Output size per axis ``o = ceil((s - window) / stride) + 1`` (less one if
  the last window would start outside the input). Window ``k`` covers
  positions ``[k stride, k stride + window)`` clipped to the input; ``"max"``
  takes their maximum, ``"avg"`` their mean (the sum over the positions
  inside, divided by their number).

  Args:
    x: ``[n, H, W, C]``.
    window: the window's side.
    stride: the stride.
    kind: ``"max"`` or ``"avg"``.

  Returns:
    ``[n, H', W', C]``.
  """
  sizes = x.shape[1:3]
  out = [-(-(s - window) // stride) + 1 for s in sizes]
  out = [o - ((o - 1) * stride >= s) for o, s in zip(out, sizes)]
  pads = [(0, (o - 1) * stride + window - s) for o, s in zip(out, sizes)]
  fill = -jnp.inf if kind == "max" else 0.0
  x = jnp.pad(x, ((0, 0), *pads, (0, 0)), constant_values=fill)
  slices = [x[:, i:i + stride * (out[0] - 1) + 1:stride,
              j:j + stride * (out[1] - 1) + 1:stride]
            for i in range(window) for j in range(window)]
  if kind == "max":
    return functools.reduce(jnp.maximum, slices)
  counts = [np.minimum(np.arange(o) * stride + window, s) - np.arange(o) *
            stride for o, s in zip(out, sizes)]
  inside = np.outer(counts[0], counts[1]).astype(np.float32)
  return sum(slices) / inside[None, :, :, None]


class AuthorsCNN(nn.Module):
  """Convs with bias, each followed by an activation and a 3/2 ceil pool,
  then one linear layer (the module docstring gives the two instances).

  Attributes:
    num_classes: number of classes (the authors' 10).
    widths: output channels of the 3x3 'same' convs.
    activation: ``"elu"`` or ``"leaky_relu"`` (slope 0.2).
    pools: ``"max"`` or ``"avg"``, one per conv.
    weight_init: the weights' initialiser, ``"truncated_normal"`` (std 0.1
      in [-0.2, 0.2]) or ``"normal"`` (std 0.1); every bias starts at 0.1.
    conv_impl: how the convolutions run (``models.conv``).
  """

  num_classes: int
  widths: Sequence[int] = (32, 64)
  activation: str = "elu"
  pools: Sequence[str] = ("max", "max")
  weight_init: str = "truncated_normal"
  conv_impl: str = AUTO

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None
               ) -> tuple[jax.Array, jax.Array]:
    """``x [n, H, W, C]`` (``[n, H, W]`` is C = 1), ``mask [n]`` or None
    (padded rows are zeroed) -> ``(features [n, C' H' W'], logits [n,
    num_classes])``."""
    check_conv_impl(self.conv_impl)
    if len(self.pools) != len(self.widths):
      raise ValueError(f"one pool per conv: widths {self.widths}, pools "
                       f"{self.pools}")
    if x.ndim == 3:
      x = x[..., None]
    if x.ndim != 4:
      raise ValueError(f"AuthorsCNN expects [n, H, W, C] inputs, got "
                       f"{x.shape}.")
    kernel_init = INITS[self.weight_init]
    bias_init = nn.initializers.constant(0.1)
    x = zero_padding(x, mask)
    for i, (width, pool) in enumerate(zip(self.widths, self.pools)):
      x = Conv(width, (3, 3), padding="SAME", kernel_init=kernel_init,
               bias_init=bias_init, impl=self.conv_impl,
               name=f"conv_{i + 1}")(x)
      x = pool_ceil(ACTIVATIONS[self.activation](x), 3, 2, pool)
    features = jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], -1)
    logits = nn.Dense(self.num_classes, kernel_init=kernel_init,
                      bias_init=bias_init, name="linear")(features)
    return features, logits


def authors_fmnist_cnn(num_classes: int = 10, conv_impl: str = AUTO
                       ) -> AuthorsCNN:
  """The Fashion-MNIST client of ``src/baseModel_fmnist.py``."""
  return AuthorsCNN(num_classes=num_classes, conv_impl=conv_impl)


def authors_cifar_cnn(num_classes: int = 10, conv_impl: str = AUTO
                      ) -> AuthorsCNN:
  """The CIFAR client of ``src/baseModel.py``."""
  return AuthorsCNN(num_classes=num_classes, widths=(32, 64, 128),
                    activation="leaky_relu", pools=("max", "max", "avg"),
                    weight_init="normal", conv_impl=conv_impl)


def params_from_torch(state: Mapping[str, np.ndarray]) -> Params:
  """An :class:`AuthorsCNN`'s params from the PyTorch module's
  ``state_dict`` (as numpy arrays, their dtype kept): conv weights ``[O, I,
  kh, kw]`` become kernels ``[kh, kw, I, O]``, ``linear.weight [K, D]`` the
  kernel ``[D, K]``; biases are copied."""
  params = {}
  for name in sorted({key.split(".")[0] for key in state}):
    weight = np.asarray(state[f"{name}.weight"])
    kernel = weight.T if weight.ndim == 2 else weight.transpose(2, 3, 1, 0)
    params[name] = {"kernel": jnp.asarray(kernel),
                    "bias": jnp.asarray(state[f"{name}.bias"])}
  return params


def params_to_torch(params: Params) -> dict[str, np.ndarray]:
  """The inverse of :func:`params_from_torch`: a ``state_dict`` of numpy
  arrays."""
  state = {}
  for name, layer in params.items():
    kernel = np.asarray(layer["kernel"])
    state[f"{name}.weight"] = (kernel.T if kernel.ndim == 2
                               else kernel.transpose(3, 2, 0, 1))
    state[f"{name}.bias"] = np.asarray(layer["bias"])
  return state
