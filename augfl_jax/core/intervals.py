"""95% confidence intervals for accuracies across clients and across seeds.

Two estimators, both Student-t intervals (host-side numpy; nothing here is
traced):

* :func:`mean_interval`: the plain mean of ``n`` values (e.g. one final
  accuracy per seed) with ``mean ± t_{n-1} s / sqrt(n)``, ``s`` the sample
  standard deviation (``n - 1`` in its denominator).
* :func:`ratio_interval`: the sample-weighted mean over clients, the
  accuracy every evaluator of the library reports,
  ``R = sum_i c_i / sum_i n_i`` (``c_i`` correct predictions, ``n_i`` query
  examples of client ``i``). Its standard error is the linearised (delta
  method) one of a ratio estimator under sampling of whole clients
  (Cochran, *Sampling Techniques*, §6.4)::

      e_i = (c_i - R n_i) / mean(n)
      SE^2 = sum_i e_i^2 / (C (C - 1))

  and the interval is ``R ± t_{C-1} SE``. With equal ``n_i`` it is exactly
  the t-interval of the per-client accuracies. Passing ``c_i = c_i^A -
  c_i^B`` (two methods scored on the same clients) gives the paired
  difference ``R_A - R_B`` and its interval.

Clients are the sampling unit: the interval says how far the mean over
*these* clients may lie from the mean over the population of clients the
protocol draws from, for one trained state. The interval across seeds says
how far the mean over seeds may lie from its expectation over seeds
(initialisation, partition and the run's randomness).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats

__all__ = ["CONFIDENCE", "Interval", "mean_interval", "ratio_interval",
           "t_quantile"]

CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
  """An estimate with its two-sided confidence interval.

  Attributes:
    mean: the estimate.
    low: lower end (``nan`` when ``n < 2``: no interval from one value).
    high: upper end (``nan`` when ``n < 2``).
    n: number of units (clients or seeds) it rests on.
  """

  mean: float
  low: float
  high: float
  n: int

  @property
  def half_width(self) -> float:
    """``(high - low) / 2``; ``nan`` without an interval."""
    return (self.high - self.low) / 2

  def scaled(self, factor: float) -> "Interval":
    """The same interval with every end multiplied (e.g. by 100 for %)."""
    return Interval(self.mean * factor, self.low * factor,
                    self.high * factor, self.n)

  def clipped(self, low: float = 0.0, high: float = 1.0) -> "Interval":
    """Ends clipped to ``[low, high]`` (an accuracy lies in [0, 1])."""
    clip = lambda v: v if math.isnan(v) else min(max(v, low), high)
    return Interval(self.mean, clip(self.low), clip(self.high), self.n)

  def to_json(self) -> list[float | None]:
    """``[low, high]`` with ``None`` for a missing end (JSON has no NaN)."""
    return [None if math.isnan(v) else float(v) for v in (self.low,
                                                          self.high)]

  def format(self, digits: int = 2, factor: float = 100.0) -> str:
    """``"89.10 [88.30, 89.90]"`` (times ``factor``), or the mean alone
    without an interval."""
    v = self.scaled(factor)
    if math.isnan(v.low):
      return f"{v.mean:.{digits}f}"
    return f"{v.mean:.{digits}f} [{v.low:.{digits}f}, {v.high:.{digits}f}]"


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
  """The two-sided Student-t critical value ``t_{df, (1 + confidence)/2}``."""
  if df < 1:
    raise ValueError(f"degrees of freedom must be >= 1, got {df}")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  return float(stats.t.ppf((1.0 + confidence) / 2.0, df))


def _vector(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
  a = np.asarray(values, dtype=np.float64).reshape(-1)
  if not np.all(np.isfinite(a)):
    raise ValueError(f"{name} must be finite, got {a[~np.isfinite(a)][:3]}")
  return a


def mean_interval(values: Sequence[float] | np.ndarray,
                  confidence: float = CONFIDENCE) -> Interval:
  """Mean of ``values`` ``[n]`` with its Student-t interval (``n - 1``
  degrees of freedom); no interval (``nan`` ends) when ``n < 2``.

  Raises:
    ValueError: no values, or a non-finite one.
  """
  a = _vector(values, "values")
  if a.size == 0:
    raise ValueError("mean_interval needs at least one value")
  mean = float(a.mean())
  if a.size < 2:
    return Interval(mean, math.nan, math.nan, 1)
  half = t_quantile(a.size - 1, confidence) * float(
      a.std(ddof=1)) / math.sqrt(a.size)
  return Interval(mean, mean - half, mean + half, int(a.size))


def ratio_interval(totals: Sequence[float] | np.ndarray,
                   counts: Sequence[float] | np.ndarray,
                   confidence: float = CONFIDENCE) -> Interval:
  """``R = sum(totals) / sum(counts)`` over ``C`` clients with its
  linearised Student-t interval (module docstring).

  Args:
    totals: ``[C]`` per-client totals: correct predictions, or the
      difference of two methods' correct predictions on the same examples.
    counts: ``[C]`` per-client examples scored (``> 0`` somewhere).
    confidence: the interval's coverage.

  Returns:
    The :class:`Interval` (``n = C``); no interval when ``C < 2``.

  Raises:
    ValueError: shapes that differ, a negative or all-zero ``counts``, or a
      non-finite value.
  """
  c = _vector(totals, "totals")
  n = _vector(counts, "counts")
  if c.shape != n.shape:
    raise ValueError(f"totals {c.shape} and counts {n.shape} must have the "
                     "same length (one entry per client)")
  if n.size == 0 or np.any(n < 0) or n.sum() <= 0:
    raise ValueError("counts must be >= 0 with a positive sum (examples "
                     f"scored per client), got {n[:5]}")
  ratio = float(c.sum() / n.sum())
  if c.size < 2:
    return Interval(ratio, math.nan, math.nan, int(c.size))
  residual = (c - ratio * n) / n.mean()
  se = math.sqrt(float(np.sum(residual ** 2)) / (c.size * (c.size - 1)))
  half = t_quantile(c.size - 1, confidence) * se
  return Interval(ratio, ratio - half, ratio + half, int(c.size))
