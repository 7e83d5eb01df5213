"""2-D convolution and max-pooling with a choice of implementation.

``Conv(features, kernel_size, strides, padding, use_bias, kernel_init,
bias_init, impl)`` creates exactly the parameters ``flax.linen.Conv`` creates
(``kernel [kh, kw, C_in, C_out]``, ``bias [C_out]`` when ``use_bias``), so a
model's parameters do not depend on ``impl``. Two implementations of
``y[n, h, w, o] = sum_{i, j, c} x_pad[n, s h + i, s w + j, c] k[i, j, c, o]``:

* ``"xla"``: ``jax.lax.conv_general_dilated`` (what ``nn.Conv`` runs).
* ``"patches"``: im2col by ``kh * kw`` strided slices of the padded input,
  concatenated on the channel axis (``[n, H', W', kh kw C_in]``, ordered
  ``(i, j, c)`` as the kernel's reshape), then one matmul with the kernel
  reshaped to ``[kh kw C_in, C_out]``. Under ``jax.vmap`` over per-client
  weights this is a batched GEMM, where ``"xla"`` becomes a grouped
  convolution, which XLA's CPU backend runs slowly (see
  ``benchmarks/RESULTS.md``). Its gradients are slices, pads and GEMMs too.
  It costs ``kh kw`` times the input's memory for the patches.
* ``"auto"`` (the default of ``Conv``, ``max_pool`` and the models'
  ``conv_impl``): ``"patches"`` on CPU, ``"xla"`` on other backends,
  resolved by :func:`resolve_conv_impl` when the module is applied (at trace
  time, so a jitted function sees a concrete choice). Measured on a 2-core
  CPU (``benchmarks/RESULTS.md``), ``"patches"`` took 1.9x less op time per
  CNN client step, AugFL rounds of 40 CNN clients ran 3.1x faster and whole
  runs with a cnn client (with ``lax.map`` over clients) 4x faster per
  round; on GPUs and TPUs the vendor convolutions are the tuned ones.

The parameters do not depend on the implementation, so parameters (and
checkpoints) trained with one run unchanged with the other.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = [
    "AUTO", "check_conv_impl", "Conv", "CONV_IMPLS", "conv_patches",
    "default_conv_impl", "max_pool", "Padding", "resolve_conv_impl"
]

CONV_IMPLS = ("xla", "patches")
AUTO = "auto"

Padding = str | Sequence[tuple[int, int]]


def check_conv_impl(impl: str) -> str:
  """Returns ``impl`` if it is ``"auto"`` or one of ``CONV_IMPLS``; raises
  ``ValueError`` otherwise."""
  if impl != AUTO and impl not in CONV_IMPLS:
    raise ValueError(f"conv_impl must be {AUTO!r} or one of {CONV_IMPLS}, "
                     f"got {impl!r}.")
  return impl


def default_conv_impl(backend: str | None = None) -> str:
  """The measured choice for ``backend`` (``jax.default_backend()`` if None):
  ``"patches"`` on CPU, ``"xla"`` elsewhere (see the module docstring)."""
  backend = backend or jax.default_backend()
  return "patches" if backend == "cpu" else "xla"


def resolve_conv_impl(impl: str, backend: str | None = None) -> str:
  """``impl`` itself, or ``default_conv_impl(backend)`` for ``"auto"``.

  The one place where ``"auto"`` becomes an implementation; raises
  ``ValueError`` for an unknown name.
  """
  check_conv_impl(impl)
  return default_conv_impl(backend) if impl == AUTO else impl


def _pads(padding: Padding, in_hw: Sequence[int], kernel: Sequence[int],
          strides: Sequence[int]) -> list[tuple[int, int]]:
  """Explicit ``(low, high)`` pads per spatial axis, as ``nn.Conv``."""
  if isinstance(padding, str):
    return list(jax.lax.padtype_to_pads(in_hw, kernel, strides, padding))
  return [tuple(p) for p in padding]


def conv_patches(x: jax.Array, kernel: jax.Array, strides: Sequence[int],
                 pads: Sequence[tuple[int, int]]) -> jax.Array:
  """Convolution as im2col + matmul.

  Args:
    x: ``[n, H, W, C_in]`` (NHWC).
    kernel: ``[kh, kw, C_in, C_out]`` (HWIO).
    strides: ``(s_h, s_w)``.
    pads: ``((lo_h, hi_h), (lo_w, hi_w))``.

  Returns:
    ``[n, H', W', C_out]`` with ``H' = (H + lo_h + hi_h - kh) // s_h + 1``
    (likewise ``W'``), equal to ``lax.conv_general_dilated`` up to float
    rounding.
  """
  kh, kw, cin, cout = kernel.shape
  sh, sw = strides
  x = jnp.pad(x, ((0, 0), tuple(pads[0]), tuple(pads[1]), (0, 0)))
  ho = (x.shape[1] - kh) // sh + 1
  wo = (x.shape[2] - kw) // sw + 1
  cols = [
      jax.lax.slice(x, (0, i, j, 0),
                    (x.shape[0], i + sh * (ho - 1) + 1,
                     j + sw * (wo - 1) + 1, cin), (1, sh, sw, 1))
      for i in range(kh) for j in range(kw)
  ]
  patches = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
  return jnp.einsum("nhwk,ko->nhwo", patches,
                    kernel.reshape(kh * kw * cin, cout))


class Conv(nn.Module):
  """``nn.Conv``'s parameters and semantics (NHWC), with ``impl`` selectable.

  Attributes:
    features: output channels.
    kernel_size: ``(kh, kw)``.
    strides: ``(s_h, s_w)``.
    padding: ``"SAME"``, ``"VALID"`` or ``((lo_h, hi_h), (lo_w, hi_w))``.
    use_bias: add a learned bias.
    kernel_init: initialiser of the ``[kh, kw, C_in, C_out]`` kernel.
    bias_init: initialiser of the ``[C_out]`` bias (zeros).
    impl: ``"auto"`` (``"patches"`` on CPU, ``"xla"`` elsewhere), ``"xla"``
      (``lax.conv_general_dilated``) or ``"patches"`` (im2col + matmul; see
      the module docstring).
  """

  features: int
  kernel_size: Sequence[int]
  strides: Sequence[int] = (1, 1)
  padding: Padding = "SAME"
  use_bias: bool = True
  kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
  bias_init: Callable[..., Any] = nn.initializers.zeros
  impl: str = AUTO

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """``[n, H, W, C_in] -> [n, H', W', features]``."""
    impl = resolve_conv_impl(self.impl)
    kernel_size = tuple(self.kernel_size)
    strides = tuple(self.strides)
    kernel = self.param("kernel", self.kernel_init,
                        kernel_size + (x.shape[-1], self.features))
    pads = _pads(self.padding, x.shape[1:3], kernel_size, strides)
    if impl == "patches":
      y = conv_patches(x, kernel, strides, pads)
    else:
      y = jax.lax.conv_general_dilated(
          x, kernel, strides, pads,
          dimension_numbers=("NHWC", "HWIO", "NHWC"))
    if self.use_bias:
      y = y + self.param("bias", self.bias_init, (self.features,))
    return y


def max_pool(x: jax.Array, window: Sequence[int], impl: str = AUTO
             ) -> jax.Array:
  """2-D max pooling, window == strides, VALID (floor, as PyTorch).

  Args:
    x: ``[n, H, W, C]``.
    window: ``(p_h, p_w)``, also the strides.
    impl: ``"auto"`` (``"patches"`` on CPU, ``"xla"`` elsewhere), ``"xla"``
      (``nn.max_pool``) or ``"patches"`` (reshape + max; see the module
      docstring).

  Returns:
    ``[n, H // p_h, W // p_w, C]``.
  """
  impl = resolve_conv_impl(impl)
  ph, pw = window
  if impl == "xla":
    return nn.max_pool(x, (ph, pw), strides=(ph, pw), padding="VALID")
  n, h, w, c = x.shape
  ho, wo = h // ph, w // pw
  x = x[:, :ho * ph, :wo * pw, :].reshape(n, ho, ph, wo, pw, c)
  return jnp.max(x, axis=(2, 4))
