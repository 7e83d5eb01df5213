"""benchmarks.seed_population: one round of several seeds as one vmapped
program gives each seed what its own round gives, and seeds whose clients
pad to other shapes are named, not timed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import training
from augfl_jax.core import fields
from benchmarks import seed_population


def _config(**changes):
  return fields.replace(training.RunConfig(), **changes)


def test_stack_puts_the_seeds_on_a_leading_axis():
  trees = [{"w": jnp.full((2, 3), float(i)), "n": jnp.int32(i)}
           for i in range(3)]
  stacked = seed_population.stack(trees)
  assert stacked["w"].shape == (3, 2, 3) and stacked["n"].shape == (3,)
  np.testing.assert_array_equal(stacked["w"][2], trees[2]["w"])
  assert seed_population.max_difference(
      trees[0], {"w": trees[0]["w"] + 0.5, "n": jnp.int32(7)}) == 0.5


@pytest.mark.parametrize("algorithm", ["fedavg", "per_fedavg"])
def test_the_population_round_is_each_seeds_own_round(algorithm):
  """Digits, 10 clients of M = 5 (seeds 0 and 1 pad to the same shapes):
  the vmapped round's state of each seed is its own round's, to float32
  rounding, and both ways are timed."""
  config = _config(algorithm=algorithm, **{"data.num_clients": 10,
                                           "data.M": 5})
  out = seed_population.measure_method(config, algorithm, [0, 1], repeats=1)
  assert "skipped" not in out, out
  assert out["max_state_difference"] < 1e-5
  for way in ("separate", "population"):
    assert len(out["seconds"][way]) == 1 and out["median_s"][way] > 0
  assert out["separate_over_population"] > 0


def test_seeds_that_pad_to_other_shapes_are_named_not_timed():
  """Synthetic data: its seeds' longest clients differ in length."""
  config = _config(dataset="synthetic", **{"data.num_clients": 30})
  out = seed_population.measure_method(config, "fedavg", [0, 1], repeats=1)
  assert out == {"skipped": "the seeds' clients pad to different shapes"}


def test_format_table_has_a_line_per_method():
  out = {"methods": {
      "fedavg": {"median_s": {"separate": 0.2, "population": 0.1},
                 "separate_over_population": 2.0,
                 "max_state_difference": 0.0},
      "augfl": {"skipped": "its round is not traceable"}},
         "seeds": [0, 1], "load_average": {"before": (1, 1, 1),
                                           "after": (2, 2, 2)}}
  lines = seed_population.format_table(out).splitlines()
  assert len(lines) == 4 and "2.00" in lines[1]
  assert "not timed: its round is not traceable" in lines[2]
  assert lines[3].startswith("2 seeds; load average")
