"""LoRA (Hu et al., 2021) on the parameter tree of any model of this package.

A functional formulation: the backbone's parameters are never changed and no
model code knows about LoRA. Adapters are a flat dict keyed by the MODULE path
of the adapted layer (the kernel's path without ``/kernel``, e.g. ``"conv1"``
or ``"BasicBlock_0/conv1"``)::

  adapters = {path: {"A": [r, fan_in], "B": [fan_out, r]}}

and ``merge`` returns the parameters of the adapted model,

  W' = W + scaling * reshape((B A)^T, W.shape),   scaling = alpha / r,

so ``model.apply({"params": merge(backbone, adapters, config)}, x)`` runs it.

Layers and shapes. A Dense kernel is ``W [in, out]`` (``y = x W``), so
``fan_in = in``, ``fan_out = out`` and ``x W' = x W + scaling * x A^T B^T``.
A convolution kernel ``[kh, kw, in, out]`` (Flax's HWIO; any number of
spatial dims) is read as the matrix ``[kh * kw * in, out]`` (row-major
flattening of the leading dims, i.e. the im2col patch order (kh, kw, in)) and
factored the same way; unmerged, this is a ``kh x kw`` convolution to ``r``
channels with kernel ``reshape(A^T, [kh, kw, in, r])`` followed by a 1x1
convolution with ``B^T`` (PEFT's ``lora_A`` / ``lora_B`` conv pair).

Targets. ``LoRAConfig.targets`` is a tuple of ``fnmatch`` patterns over module
paths; every ``kernel`` leaf with at least 2 dims whose module path matches one
of them gets an adapter. The default ``("*",)`` adapts every Dense and Conv
kernel, the classifier included: our models are CNN / MLP / ResNet, which have
no query/value projections (the FedOA paper's LoRA target in a transformer).
Biases and normalisation parameters stay frozen. Use e.g. ``("conv*",)`` or
``("*conv*", "fc")`` to restrict.

Initialisation as PEFT: ``A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (PyTorch's
``kaiming_uniform_(a=sqrt(5))``) and ``B = 0``, so a fresh adapter leaves the
backbone's function unchanged exactly.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from augfl_jax.core.types import Params, PRNGKey

Adapters = dict[str, dict[str, jax.Array]]

__all__ = [
    "Adapters", "LoRAConfig", "target_paths", "init_adapters", "delta",
    "merge", "apply_lora", "frozen_backbone", "num_adapter_params",
]


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Attributes: ``rank`` r, ``alpha`` (``scaling = alpha / r``) and
  ``targets`` (``fnmatch`` patterns over module paths, see module doc)."""

  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = ("*",)

  def __post_init__(self):
    if isinstance(self.targets, str):
      raise ValueError("targets must be a tuple of patterns, e.g. ('conv*',), "
                       f"got the string {self.targets!r}")
    object.__setattr__(self, "targets", tuple(self.targets))
    if self.rank < 1:
      raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
    if not self.alpha > 0:
      raise ValueError(f"LoRA alpha must be > 0, got {self.alpha}")
    if not self.targets or not all(isinstance(t, str) for t in self.targets):
      raise ValueError("targets must be a non-empty tuple of strings, got "
                       f"{self.targets!r}")

  @property
  def scaling(self) -> float:
    """``alpha / rank``."""
    return self.alpha / self.rank


def _path_str(path: Sequence[Any]) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _kernels(params: Params) -> dict[str, jax.Array]:
  """``{module path: kernel}`` for every ``kernel`` leaf with ndim >= 2."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = _path_str(path)
    if name.split("/")[-1] == "kernel" and len(jnp.shape(leaf)) >= 2:
      out[name.rsplit("/", 1)[0] if "/" in name else ""] = leaf
  return out


def target_paths(params: Params, config: LoRAConfig) -> tuple[str, ...]:
  """Sorted module paths of the kernels that ``config.targets`` selects.

  Only shapes are read: ``params`` may be ``jax.eval_shape``'s structs.

  Raises:
    ValueError: no kernel matches (listing the kernels there are).
  """
  kernels = _kernels(params)
  chosen = tuple(sorted(
      p for p in kernels
      if any(fnmatch.fnmatchcase(p, t) for t in config.targets)))
  if not chosen:
    raise ValueError(
        f"LoRA targets {config.targets} match no kernel; the model's kernels "
        f"are {sorted(kernels)}")
  return chosen


def _matrix_shape(kernel_shape: tuple[int, ...]) -> tuple[int, int]:
  """``(fan_in, fan_out)``: all leading dims flattened, the last one kept."""
  return math.prod(kernel_shape[:-1]), kernel_shape[-1]


def init_adapters(key: PRNGKey, params: Params, config: LoRAConfig
                 ) -> Adapters:
  """Fresh adapters for the targeted kernels of ``params``.

  Only the kernels' shapes and dtypes are read (``params`` may come from
  ``jax.eval_shape``).

  Returns:
    ``{path: {"A": [r, fan_in], "B": [fan_out, r]}}``; ``A`` uniform on
    ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` (key folded with the path's index in
    sorted order), ``B`` zeros; dtype of the kernel.
  """
  kernels = _kernels(params)
  shapes = tuple(
      (path, _matrix_shape(tuple(jnp.shape(kernels[path]))),
       jnp.dtype(kernels[path].dtype).name)
      for path in target_paths(params, config))
  return _initialiser(shapes, config.rank)(key)


@functools.lru_cache(maxsize=64)
def _initialiser(shapes: tuple[tuple[str, tuple[int, int], str], ...],
                 rank: int) -> Callable[[PRNGKey], Adapters]:
  """One jitted program per adapter layout (compiled once, not per call)."""

  def make(key):
    adapters = {}
    for i, (path, (fan_in, fan_out), dtype) in enumerate(shapes):
      bound = 1.0 / math.sqrt(fan_in)
      adapters[path] = {
          "A": jax.random.uniform(jax.random.fold_in(key, i), (rank, fan_in),
                                  dtype, -bound, bound),
          "B": jnp.zeros((fan_out, rank), dtype),
      }
    return adapters

  return jax.jit(make)


def delta(adapter: dict[str, jax.Array], kernel_shape: tuple[int, ...],
          scaling: float) -> jax.Array:
  """``scaling * reshape((B A)^T, kernel_shape)``: the adapter's kernel update.

  ``A [r, fan_in]``, ``B [fan_out, r]``; ``(B A)^T = A^T B^T`` is
  ``[fan_in, fan_out]`` and ``fan_in`` unflattens to the leading kernel dims.
  """
  update = adapter["A"].T @ adapter["B"].T
  return (scaling * update).reshape(kernel_shape)


def merge(params: Params, adapters: Adapters, config: LoRAConfig) -> Params:
  """The adapted model's parameters: ``W + scaling (B A)^T`` on adapted kernels.

  Every other leaf is returned as it is (the same array). The tree keeps the
  structure and container types of ``params``.

  Raises:
    ValueError: an adapter whose path names no kernel of ``params``.
  """
  kernels = _kernels(params)
  unknown = sorted(set(adapters) - set(kernels))
  if unknown:
    raise ValueError(f"adapters {unknown} name no kernel of the model; its "
                     f"kernels are {sorted(kernels)}")

  def add(path, leaf):
    name = _path_str(path)
    module = name.rsplit("/", 1)[0] if "/" in name else ""
    if name.split("/")[-1] == "kernel" and module in adapters:
      return leaf + delta(adapters[module], leaf.shape,
                          config.scaling).astype(leaf.dtype)
    return leaf

  return jax.tree_util.tree_map_with_path(add, params)


apply_lora = merge


def frozen_backbone(fn: Callable[..., Any], backbone: Params,
                    config: LoRAConfig) -> Callable[..., Any]:
  """``fn(params, *args)`` -> ``g(adapters, *args)`` on a frozen backbone.

  ``g(adapters, *args) = fn(merge(stop_gradient(backbone), adapters), *args)``:
  differentiating ``g`` reaches only the adapters, and even a gradient taken
  through a closure over ``backbone`` is zero for it.
  """
  frozen = jax.lax.stop_gradient(backbone)
  return lambda adapters, *args: fn(merge(frozen, adapters, config), *args)


def num_adapter_params(adapters: Adapters) -> int:
  """Number of trainable scalars in ``adapters``."""
  return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(adapters))
