"""core.jit: a function's closed-over arrays become the compiled program's
arguments, with the function's results."""

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.core import jit


def test_hoist_hands_the_closed_over_arrays_back_as_arguments():
  weights = jnp.arange(1000.0)
  fn = lambda x, scale: {"y": x * weights * scale}
  x = jnp.linspace(0.0, 1.0, 1000)
  pure, consts = jit.hoist(fn, x, 2.0)
  assert len(consts) == 1
  np.testing.assert_array_equal(consts[0], weights)
  np.testing.assert_array_equal(pure(consts, x, 2.0)["y"], fn(x, 2.0)["y"])
  # Another array as the constant: the same program, other numbers.
  np.testing.assert_array_equal(pure([weights + 1], x, 2.0)["y"],
                                x * (weights + 1) * 2.0)
  baked = 'stablehlo.constant dense<"0x'  # an array in the program's text
  assert baked not in jax.jit(pure).lower(consts, x, 2.0).as_text()
  assert baked in jax.jit(fn).lower(x, 2.0).as_text()  # jit alone


def test_hoisted_jit_traces_once_per_structure_of_its_arguments():
  weights = jnp.arange(4.0)
  traces = []

  def fn(state, ids):
    traces.append(ids is None)
    return state + (weights if ids is None else weights[ids].sum())

  run = jit.hoisted_jit(fn, donate_first=True)
  state = jnp.zeros(4)
  np.testing.assert_array_equal(run(state, None), weights)
  np.testing.assert_array_equal(run(jnp.ones(4), None), weights + 1)
  np.testing.assert_array_equal(run(jnp.zeros(4), np.array([1, 2])),
                                jnp.full(4, 3.0))
  np.testing.assert_array_equal(run(jnp.zeros(4), np.array([0, 3])),
                                jnp.full(4, 3.0))
  assert traces == [True, False]  # None, then [2] ids: one trace each
