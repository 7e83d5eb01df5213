"""The confidence intervals: known answers and coverage by simulation."""

import math

import numpy as np
import pytest
from scipy import stats

from augfl_jax.core import intervals


def test_mean_interval_is_the_student_t_interval():
  values = np.array([84.0, 86.5, 85.2])
  got = intervals.mean_interval(values)
  half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / math.sqrt(3)
  assert got.mean == pytest.approx(values.mean())
  assert (got.low, got.high) == pytest.approx((values.mean() - half,
                                               values.mean() + half))
  assert got.n == 3
  assert intervals.t_quantile(1) == pytest.approx(12.706, abs=1e-3)


def test_one_value_has_no_interval():
  got = intervals.mean_interval([0.9])
  assert got.mean == 0.9 and math.isnan(got.low) and math.isnan(got.high)
  assert got.to_json() == [None, None]
  assert got.format() == "90.00"
  one = intervals.ratio_interval([9.0], [10.0])
  assert one.mean == pytest.approx(0.9) and math.isnan(one.high)


def test_ratio_interval_with_equal_counts_is_the_t_interval_of_accuracies():
  rng = np.random.default_rng(0)
  counts = np.full(12, 15.0)
  correct = rng.integers(5, 16, size=12).astype(float)
  got = intervals.ratio_interval(correct, counts)
  plain = intervals.mean_interval(correct / counts)
  assert (got.mean, got.low, got.high) == pytest.approx(
      (plain.mean, plain.low, plain.high))


def test_ratio_interval_mean_is_the_sample_weighted_accuracy():
  correct, counts = np.array([9.0, 1.0, 30.0]), np.array([10.0, 10.0, 40.0])
  got = intervals.ratio_interval(correct, counts)
  assert got.mean == pytest.approx(40 / 60)
  assert got.low < got.mean < got.high


def test_paired_difference_of_identical_methods_is_zero_width():
  correct, counts = np.array([3.0, 5.0, 7.0]), np.array([8.0, 8.0, 9.0])
  got = intervals.ratio_interval(correct - correct, counts)
  assert (got.mean, got.low, got.high) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("clients,equal_counts", [(10, True), (300, False)])
def test_coverage_of_the_client_interval(clients, equal_counts):
  # 1,000 evaluations of `clients` clients whose accuracies come from a
  # known distribution: Beta(6, 2) (mean 0.75, skewed as real per-client
  # accuracies are), binomial correct counts; the interval must contain
  # the true mean 0.75 in 93-97% of them.
  rng = np.random.default_rng(1)
  hits = 0
  for _ in range(1000):
    p = rng.beta(6.0, 2.0, size=clients)
    counts = (np.full(clients, 15) if equal_counts
              else rng.integers(10, 41, size=clients))
    correct = rng.binomial(counts, p)
    got = intervals.ratio_interval(correct, counts)
    hits += got.low <= 0.75 <= got.high
  assert 930 <= hits <= 970, hits


def test_coverage_of_the_seed_interval():
  # 1,000 tables of 5 seeds each, the seeds' accuracies normal around 0.9.
  rng = np.random.default_rng(2)
  hits = sum(
      (got := intervals.mean_interval(rng.normal(0.9, 0.02, size=5))).low
      <= 0.9 <= got.high for _ in range(1000))
  assert 930 <= hits <= 970, hits


def test_a_normal_quantile_would_undercover_with_few_clients():
  # The test above can fail: with z = 1.96 instead of t_9 the coverage of
  # 10 clients drops below 93%.
  rng = np.random.default_rng(1)
  hits = 0
  for _ in range(1000):
    acc = rng.beta(6.0, 2.0, size=10)
    half = 1.96 * acc.std(ddof=1) / math.sqrt(10)
    hits += acc.mean() - half <= 0.75 <= acc.mean() + half
  assert hits < 930


def test_bad_input_is_refused():
  with pytest.raises(ValueError, match="same length"):
    intervals.ratio_interval([1.0, 2.0], [3.0])
  with pytest.raises(ValueError, match="positive sum"):
    intervals.ratio_interval([0.0, 0.0], [0.0, 0.0])
  with pytest.raises(ValueError, match="finite"):
    intervals.mean_interval([1.0, float("nan")])
  with pytest.raises(ValueError, match="at least one"):
    intervals.mean_interval([])


def test_format_and_clip():
  got = intervals.Interval(0.99, 0.97, 1.01, 20).clipped()
  assert got.high == 1.0
  assert got.format() == "99.00 [97.00, 100.00]"
  assert got.to_json() == [0.97, 1.0]
