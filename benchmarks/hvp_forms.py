r"""One AugFL client round with the HVP of Eq. (10) written four ways.

  python -m benchmarks.hvp_forms --clients=8 --examples=15

Every form runs the whole client step of Algorithm 1 (Eqs. 7, 10-12) for
``--clients`` clients under ``lax.map`` (the CPU's default strategy), on the
benchmark's cnn (``benchmarks.cells``), and differs only in how the
Hessian-vector product ``g = H(theta, D^s) r`` is computed:

* ``two_gradients``: the library's ``hvp.finite_difference_hvp``,
  ``[grad(theta + delta r) - grad(theta - delta r)] / (2 delta)``;
* ``gradient_of_difference``: the same numbers as one backward pass,
  ``grad_u [L(theta + delta r + u) - L(theta - delta r + u)] / (2 delta)`` at
  ``u = 0``;
* ``vmap_over_signs``: the two evaluations as one ``vmap`` over the signs
  (a batch of two parameter sets);
* ``exact``: ``hvp.exact_hvp`` (forward-over-reverse): another answer, the
  exact product.

A fifth row, ``batched_support_gradient``, keeps ``two_gradients`` but
computes every client's support gradient at theta^t (the same parameters
for all) before the map, as one ``vmap`` whose forward pass is one batch of
all clients' examples.

Each form's theta_i is compared with ``two_gradients``' (max abs
difference), and the forms are timed round-robin in one process; the table
gives each one's median and its ratio to ``two_gradients``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

from absl import flags
import jax
import jax.numpy as jnp
import optax

from augfl_jax.core import hvp as hvp_lib
from benchmarks import cells
from benchmarks import command

FLAGS = flags.FLAGS
ALPHA, RHO = 0.03, 0.7


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_integer("clients", 8, "Clients of the round.", lower_bound=1)
  flags.DEFINE_integer("examples", 15, "Examples per support / query set.",
                       lower_bound=1)
  flags.DEFINE_integer("repeats", 5, "Timed rounds of each form.",
                       lower_bound=1)
  flags.DEFINE_string("output", "", "JSON results path (none if empty).")
  command.output()


def forms(loss_fn: Callable) -> dict[str, Callable]:
  """``name -> hvp(theta, r, support, delta)``."""

  def two_gradients(theta, r, support, delta):
    return hvp_lib.finite_difference_hvp(
        lambda p: jax.grad(loss_fn)(p, support), theta, r, delta)

  def gradient_of_difference(theta, r, support, delta):
    def difference(u):
      plus = optax.tree.add(optax.tree.add_scale(theta, delta, r), u)
      minus = optax.tree.add(optax.tree.add_scale(theta, -delta, r), u)
      return loss_fn(plus, support) - loss_fn(minus, support)
    grad = jax.grad(difference)(optax.tree.zeros_like(theta))
    return optax.tree.scale(0.5 / delta, grad)

  def vmap_over_signs(theta, r, support, delta):
    def signed_sum(u):
      def one(sign):
        p = jax.tree.map(lambda t, v, w: t + sign * delta * v + w, theta, r,
                         u)
        return sign * loss_fn(p, support)
      return jnp.sum(jax.vmap(one)(jnp.array([1.0, -1.0])))
    grad = jax.grad(signed_sum)(optax.tree.zeros_like(theta))
    return optax.tree.scale(0.5 / delta, grad)

  def exact(theta, r, support, delta):
    del delta
    return hvp_lib.exact_hvp(lambda p: jax.grad(loss_fn)(p, support), theta,
                             r)

  return {f.__name__: f for f in (two_gradients, gradient_of_difference,
                                   vmap_over_signs, exact)}


def make_round(loss_fn: Callable, hvp_fn: Callable, num_clients: int,
               batched_support_gradient: bool = False) -> Callable:
  """A jitted ``lax.map`` round of Eqs. (7), (10)-(12) with ``hvp_fn``."""

  def client(theta, dual, support, query, g_s=None):
    if g_s is None:
      g_s = jax.grad(loss_fn)(theta, support)
    phi = optax.tree.add_scale(theta, -ALPHA, g_s)
    r = jax.grad(loss_fn)(phi, query)
    g = hvp_fn(theta, r, support, 1.0 / 110)
    step = optax.tree.add_scale(dual, 1.0 / num_clients,
                                optax.tree.add_scale(r, -ALPHA, g))
    theta_i = optax.tree.add_scale(theta, -1.0 / RHO, step)
    return theta_i, optax.tree.add_scale(dual, RHO,
                                         optax.tree.sub(theta_i, theta))

  @jax.jit
  def round_fn(theta, duals, support, query):
    if batched_support_gradient:
      g_s = jax.vmap(jax.grad(loss_fn), (None, 0))(theta, support)
      return jax.lax.map(lambda a: client(theta, *a),
                         (duals, support, query, g_s))
    return jax.lax.map(lambda a: client(theta, *a), (duals, support, query))

  return round_fn


def run(f: Any = None) -> dict[str, Any]:
  """Times the forms; prints and returns the table."""
  f = f or FLAGS
  problem = cells.make_problem("cnn", "auto", f.clients, f.examples)
  duals = jax.tree.map(lambda t: jnp.zeros((f.clients,) + t.shape, t.dtype),
                       problem.params)
  args = (problem.params, duals, problem.clients.support,
          problem.clients.query)
  hvps = forms(problem.loss_fn)
  rounds = {name: make_round(problem.loss_fn, fn, f.clients)
            for name, fn in hvps.items()}
  rounds["batched_support_gradient"] = make_round(
      problem.loss_fn, hvps["two_gradients"], f.clients, True)
  outputs = {name: jax.block_until_ready(fn(*args))
             for name, fn in rounds.items()}  # compiles
  diff = {name: max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(out[0]), jax.tree.leaves(outputs["two_gradients"][0])))
          for name, out in outputs.items()}
  times: dict[str, list[float]] = {name: [] for name in rounds}
  for _ in range(f.repeats):
    for name, fn in rounds.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  med = {name: statistics.median(v) for name, v in times.items()}
  out = {"flags": {"clients": f.clients, "examples": f.examples,
                   "repeats": f.repeats},
         "jax": jax.__version__, "load_average": os.getloadavg(),
         "median_s": med,
         "ratio_to_two_gradients": {n: med[n] / med["two_gradients"]
                                    for n in med},
         "max_abs_diff_theta_i": diff}
  print(f"AugFL client round, {f.clients} cnn clients, n = {f.examples}, "
        "lax.map")
  for name in rounds:
    print(f"  {name:<24} {1e3 * med[name]:8.1f} ms  "
          f"x{out['ratio_to_two_gradients'][name]:.3f}  "
          f"max |theta_i - two_gradients'| {diff[name]:.1e}")
  print("  load average: " + ", ".join(f"{x:.2f}"
                                       for x in out["load_average"]))
  if f.output:
    command.write_json(f.output, out)
  return out


def main(argv: list[str]) -> None:
  del argv
  run()


if __name__ == "__main__":
  command.run(define_flags, main)
