"""A whole dataset split in host memory, and its per-channel standardisation."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Dataset", "standardise"]


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A whole dataset split held in host memory.

  Attributes:
    name: the dataset's canonical name.
    x: ``[n, H, W, C]`` float32 images standardised per channel, or ``[n, d]``
      float32 features (``synthetic``).
    y: ``[n]`` int32 labels in ``0 .. num_classes - 1``.
    num_classes: number of classes.
    client_ids: ``[n]`` int32 natural client of each example (``synthetic``
      only), else ``None``.
    source: where the examples were read (e.g. the IDX files), for logs.
    standardisation: ``(mean [C], std [C])`` per channel that ``x`` was
      standardised with (the train split's own; a test split reuses its
      train split's), ``None`` for features that were not.
  """

  name: str
  x: np.ndarray
  y: np.ndarray
  num_classes: int
  client_ids: np.ndarray | None = None
  source: str = "embedded"
  standardisation: tuple[np.ndarray, np.ndarray] | None = None

  @property
  def num_examples(self) -> int:
    """Number of examples ``n``."""
    return int(self.y.shape[0])


def standardise(x: np.ndarray,
                statistics: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
  """Standardises ``[n, ..., C]`` float32 in place per channel (last axis).

  Args:
    x: the examples, changed in place.
    statistics: ``(mean [C], std [C])`` to apply (e.g. a train split's, to
      a test split); ``None`` computes ``x``'s own, accumulated in float64
      over chunks so a large split needs no float64 copy. A constant
      channel (std 0) is only centred.

  Returns:
    The ``(mean, std)`` applied, float32 ``[C]`` each.
  """
  c = x.shape[-1]
  if statistics is None:
    flat = x.reshape(-1, c)
    total = np.zeros(c, np.float64)
    total_sq = np.zeros(c, np.float64)
    chunk = 1 << 20
    for start in range(0, flat.shape[0], chunk):
      part = flat[start:start + chunk].astype(np.float64)
      total += part.sum(0)
      total_sq += np.square(part).sum(0)
    count = max(flat.shape[0], 1)
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 0.0))
    std = np.where(std > 1e-12, std, 1.0)
    statistics = (mean.astype(np.float32), std.astype(np.float32))
  mean, std = (np.asarray(v, np.float32) for v in statistics)
  x -= mean
  x /= std
  return mean, std
