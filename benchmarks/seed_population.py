r"""Seeds as one program: a round vmapped over a population of seeds against
the same seeds' rounds one after another, in one process.

  python -m benchmarks.seed_population \
    --preset=experiments/configs/fashion_mnist_cpu.flags \
    --algorithms=fedavg,augfl --seeds=0,1,2,3,4 --changes=model=mlp

Builds the run of the flag file ``--preset`` (``--changes`` on top, as
``benchmarks.fedoa_cost`` reads them) once per seed of ``--seeds`` and per
method of ``--algorithms``, each seed with its own partition, initial
parameters and state, and times two ways of taking one round of every
seed, round-robin, ``--repeats`` times after a first (compiling) call:

* ``separate``: the method's jitted round called once per seed, as
  separate runs call it (one compilation: the seeds' clients pad to the
  same shapes);
* ``population``: one call of ``jit(vmap(round))`` over the seeds' states
  and clients stacked on a leading axis of size S.

Both ways call the round of the first seed's build, which takes a seed's
state and clients as its arguments (``FederatedAlgorithm.round``).

Prints and writes (``--output``, JSON) each way's median seconds for the
S rounds, ``separate / population`` (above 1: the population wins), the
largest difference between the two ways' states after one round (the same
arithmetic, batched: rounding only) and the load average before and
after. A method whose round is not traceable (AugFL's CRD step looped in
Python, a cnn with XLA's convolutions on a CPU) or whose seeds pad to
different shapes is reported as such and not timed.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax import algorithms, training
from augfl_jax.core import fields
from augfl_jax.training import experiment
from benchmarks import command
from benchmarks.fedoa_cost import named_changes, preset_changes

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_string("preset", "experiments/configs/fashion_mnist_cpu.flags",
                      "flag file of experiments.run whose run is measured "
                      "(as benchmarks.fedoa_cost reads it)")
  flags.DEFINE_list("changes", [], "name=value fields of the run's "
                    "configuration set on top of the preset, e.g. model=mlp")
  flags.DEFINE_list("algorithms", ["fedavg", "augfl"],
                    "methods whose rounds are timed")
  flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"],
                    "the population's seeds (at least two)")
  flags.DEFINE_integer("repeats", 3, "timed rounds of each way after the "
                       "first call", lower_bound=1)
  flags.DEFINE_string("output", "seed_population.json", "JSON results path "
                      "(empty: none)")
  command.check("preset", preset_changes)
  command.check("changes", named_changes)
  command.each("algorithms", "a registered method", algorithms.spec)
  command.integers("seeds", 0)
  command.check("seeds", _distinct_pair)
  command.output()


def _distinct_pair(seeds: list[str]) -> None:
  if len(seeds) < 2 or len(set(map(int, seeds))) != len(seeds):
    raise ValueError("a population is at least two distinct seeds, got "
                     f"{','.join(seeds)}")


def stack(trees: list[Any]) -> Any:
  """The pytrees ``trees`` (one structure, one shape per leaf) stacked on
  a new leading axis."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _shapes(tree: Any) -> list[tuple[int, ...]]:
  return [np.shape(leaf) for leaf in jax.tree.leaves(tree)]


def max_difference(a: Any, b: Any) -> float:
  """The largest absolute difference between the float leaves of two
  pytrees of one structure."""
  return max((float(jnp.max(jnp.abs(x - y)))
              for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
              if jnp.issubdtype(x.dtype, jnp.floating) and x.size),
             default=0.0)


def measure_method(config: training.RunConfig, name: str, seeds: list[int],
                   repeats: int) -> dict[str, Any]:
  """Times one round of every seed of ``seeds`` both ways (module
  docstring) for the method ``name`` on the run ``config`` describes."""
  runs = []
  for seed in seeds:
    plan = training.prepare(fields.replace(config, algorithm=name, seed=seed))
    built = training.build(plan, experiment.load(plan))
    if not built.algorithm.traceable:
      return {"skipped": "its round is not traceable (a Python loop of its "
                         "own), so it cannot be vmapped"}
    runs.append((built.algorithm, built.start(), built.data.train))
  algo = runs[0][0]
  states, clients = [r[1] for r in runs], [r[2] for r in runs]
  if len({str(_shapes(c)) for c in clients}) > 1:
    return {"skipped": "the seeds' clients pad to different shapes"}
  one = jax.jit(algo.round)
  population = jax.jit(jax.vmap(algo.round))
  stacked_states, stacked_clients = stack(states), stack(clients)

  def separate():
    return [one(s, c)[0] for s, c in zip(states, clients)]

  def together():
    return population(stacked_states, stacked_clients)[0]

  # The first (compiling) calls' states serve the comparison.
  first_separate, apart = command.timed_call(separate)
  first_population, joint = command.timed_call(together)
  first = {"separate": first_separate, "population": first_population}
  difference = max(max_difference(s, jax.tree.map(lambda a, i=i: a[i], joint))
                   for i, s in enumerate(apart))
  times = {"separate": [], "population": []}
  for _ in range(repeats):
    times["separate"].append(command.timed(separate))
    times["population"].append(command.timed(together))
  medians = {way: statistics.median(t) for way, t in times.items()}
  return {"seconds": times, "median_s": medians, "first_call_s": first,
          "separate_over_population": statistics.median(
              a / b for a, b in zip(times["separate"], times["population"])),
          "max_state_difference": difference}


def format_table(out: dict[str, Any]) -> str:
  """The figures of :func:`run`, one method a line."""
  lines = [f"{'method':<10} {'separate s':>10} {'population s':>12} "
           f"{'sep / pop':>9} {'max diff':>9}"]
  for name, r in out["methods"].items():
    if "skipped" in r:
      lines.append(f"{name:<10} not timed: {r['skipped']}")
      continue
    lines.append(f"{name:<10} {r['median_s']['separate']:>10.3f} "
                 f"{r['median_s']['population']:>12.3f} "
                 f"{r['separate_over_population']:>9.2f} "
                 f"{r['max_state_difference']:>9.2e}")
  lines.append(f"{len(out['seeds'])} seeds; load average (1, 5, 15 min) "
               "before: " + ", ".join(
                   f"{x:.2f}" for x in out["load_average"]["before"]) +
               "; after: " + ", ".join(
                   f"{x:.2f}" for x in out["load_average"]["after"]))
  return "\n".join(lines)


def run(f: Any = None) -> dict[str, Any]:
  """Measures what the flags ask; prints the table and writes the JSON."""
  f = f or FLAGS
  changes = {**preset_changes(f.preset),
             **named_changes(f.changes)}
  config = fields.replace(training.RunConfig(), **changes)
  seeds = [int(s) for s in f.seeds]
  before = os.getloadavg()
  methods = {name: measure_method(config, name, seeds, f.repeats)
             for name in f.algorithms}
  out = {"methods": methods, "seeds": seeds,
         "load_average": {"before": before, "after": os.getloadavg()},
         "flags": {k: getattr(f, k) for k in (
             "preset", "changes", "algorithms", "seeds", "repeats")},
         "jax": jax.__version__, "backend": jax.default_backend()}
  print(format_table(out))
  if f.output:
    command.write_json(f.output, out)
    print(f"wrote {f.output}")
  return out


def main(argv: list[str]) -> None:
  del argv
  run()


if __name__ == "__main__":
  command.run(define_flags, main)
