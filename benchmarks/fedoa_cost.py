r"""What a FedOA round costs beside AugFL's and FedAvg's, in one process.

  python -m benchmarks.fedoa_cost \
    --preset=experiments/configs/fashion_mnist_cpu.flags --repeats=5

Builds the run of the flag file ``--preset`` (the fields of
``experiments.run``'s configuration it sets, ``--changes`` on top, e.g.
``--changes=pm.dir=runs/pm/my_pm``) once per method of ``--algorithms``,
every one on the same data (``training.build``; a PM the preset names is
loaded from its directory, or pretrained there first, as a run does), and
times each method's round, jitted as a run jits it, round-robin: one
round of each in turn, ``--repeats`` times after a first (compiling)
call, so that load on a shared machine hits all of them alike. Prints and
writes (``--output``, JSON):

* each round's median, min and max seconds, and the median over the
  repeats of its time over the ``--against`` method's in the same repeat;
* the round's matrix arithmetic, counted on its jaxpr
  (:func:`matmul_flops`: every ``dot_general`` and convolution, a loop
  body times its trip count, a conditional's costliest branch, so every
  minibatch of a local epoch counts, padding alone or not), beside XLA's
  cost analysis of the compiled round (``flops`` and ``bytes accessed``,
  which count a loop's body once, not per iteration);
* for FedOA, the arithmetic of one local step of each adapter
  (:func:`fedoa_steps`);
* the load average before and after (``os.getloadavg``, ``uptime``'s).
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any

from absl import flags
import jax

from augfl_jax import algorithms, training
from augfl_jax.algorithms import fedit
from augfl_jax.algorithms.fedoa import personal as fedoa_personal
from augfl_jax.core import fields, local
from augfl_jax.training import experiment
from benchmarks import command

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_string("preset", "experiments/configs/fashion_mnist_cpu.flags",
                      "flag file of experiments.run whose run is measured "
                      "(its --flagfile lines are read too; a relative path "
                      "from the current directory, else from the "
                      "repository's root)")
  flags.DEFINE_list("changes", [], "name=value fields of the run's "
                    "configuration set on top of the preset, e.g. "
                    "pm.dir=runs/pm/my_pm")
  flags.DEFINE_list("algorithms", ["fedoa", "augfl", "fedavg"],
                    "methods whose rounds are timed")
  flags.DEFINE_string("against", "augfl", "the method each round's time is "
                      "divided by")
  flags.DEFINE_integer("repeats", 5, "timed rounds of each method after the "
                       "first call", lower_bound=1)
  flags.DEFINE_string("output", "fedoa_cost.json", "JSON results path "
                      "(empty: none)")
  command.check("preset", lambda path: preset_changes(path))
  command.check("changes", named_changes)
  command.each("algorithms", "a registered method", algorithms.spec)
  command.check("against", algorithms.spec)
  command.output()


def _pair(item: str) -> tuple[str, str]:
  name, sep, value = item.partition("=")
  if not sep or not name:
    raise ValueError(f"a change is name=value, got {item!r}")
  return name.strip(), value.strip()


def _typed(changes: dict[str, str]) -> dict[str, Any]:
  """``changes`` (strings) typed as the fields of ``training.RunConfig``
  they name; checked by the fields' own rules."""
  owners = {name: owner for name, _, owner, _ in fields.walk(
      training.RunConfig())}
  typed = {}
  for name, value in changes.items():
    if name not in owners:
      raise ValueError(f"{name!r} is not a field of the run's configuration")
    kind = fields.leaf_type(owners[name], name.rpartition(".")[2])
    if kind is bool:
      typed[name] = value.lower() in ("1", "true", "yes")
    elif kind is tuple:
      typed[name] = tuple(v for v in value.split(",") if v)
    else:
      typed[name] = kind(value)
  fields.replace(training.RunConfig(), **typed)
  return typed


def named_changes(items: list[str]) -> dict[str, Any]:
  """``name=value`` items (``--changes``) typed as the fields of
  ``training.RunConfig`` they name, checked by the fields' own rules."""
  return _typed(dict(_pair(item) for item in items))


def _read_flags(path: str) -> dict[str, str]:
  """``{name: value}`` of the ``--name=value`` lines of the flag file
  ``path``, its ``--flagfile=`` lines read in place (as absl reads them);
  a relative path is taken from the current directory, else from the
  repository's root (the presets name each other so)."""
  if not os.path.isabs(path) and not os.path.exists(path):
    path = os.path.join(ROOT, path) if os.path.exists(
        os.path.join(ROOT, path)) else path
  try:
    with open(path) as f:
      lines = f.read().splitlines()
  except OSError as e:
    raise ValueError(f"cannot read the flag file {path}: {e.strerror}"
                     ) from None
  values: dict[str, str] = {}
  for line in lines:
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    if not line.startswith("--"):
      raise ValueError(f"{path}: {line!r} is not a --flag")
    name, _, value = line[2:].partition("=")
    if name == "flagfile":
      values.update(_read_flags(value))
    else:
      values[name] = value
  return values


def preset_changes(path: str) -> dict[str, Any]:
  """The configuration fields the flag file ``path`` sets (``--name=value``
  lines, ``--flagfile=`` lines read in place, ``#`` comments skipped),
  typed as ``training.RunConfig``'s fields.

  Raises:
    ValueError: a file that cannot be read, a line that is not a flag, or
      a flag that is not a field of the run's configuration.
  """
  return _typed(_read_flags(path))


def _flops_of(params: dict[str, Any]) -> list[Any]:
  """The jaxprs among an equation's parameters."""
  found = []
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      inner = getattr(item, "jaxpr", item)
      if hasattr(inner, "eqns"):
        found.append(inner)
  return found


def matmul_flops(jaxpr: Any) -> float:
  """FLOPs of the ``dot_general`` and ``conv_general_dilated`` equations of
  ``jaxpr`` (a ``ClosedJaxpr`` or ``Jaxpr``): 2 multiply-adds each, a
  ``scan`` body times its length, a ``cond``'s costliest branch, a
  ``while`` body once (its trip count is not in the jaxpr), every other
  inner jaxpr (jit, custom derivatives, ``shard_map``) once."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
          lhs[d] for d in contract)
    elif name == "conv_general_dilated":
      rhs = eqn.invars[1].aval.shape
      spec = eqn.params["dimension_numbers"].rhs_spec  # (out, in, spatial)
      per_output = rhs[spec[1]] * math.prod(rhs[d] for d in spec[2:])
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * per_output
    elif name == "scan":
      total += eqn.params["length"] * matmul_flops(eqn.params["jaxpr"])
    elif name == "cond":
      total += max(matmul_flops(b) for b in eqn.params["branches"])
    else:
      total += sum(matmul_flops(j) for j in _flops_of(eqn.params))
  return total


def xla_cost(compiled: Any) -> dict[str, float]:
  """``flops`` and ``bytes accessed`` of XLA's cost analysis of
  ``compiled`` (a loop's body counted once)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  analysis = analysis or {}
  return {"flops": float(analysis.get("flops", 0.0)),
          "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}


def fedoa_steps(built: training.Experiment, state: Any) -> dict[str, Any]:
  """Matmul FLOPs and XLA's cost analysis of one local step of FedOA's
  global adapter (FedIT's loss) and of its personal adapter (the FedOA
  objective) on one minibatch of ``batch_size`` rows of the first client,
  the personal adapter a perturbed copy of the global one."""
  config = built.plan.algorithm_config
  model, backbone = built.model, state.backbone
  client = jax.tree.map(lambda a: a[0], built.data.train)
  data = local.concat_batches(client.support, client.query)
  rows = min(config.batch_size, data["mask"].shape[0])
  batch = jax.tree.map(lambda a: a[:rows], data)
  personal = jax.tree.map(lambda a: a + 1e-3, state.global_adapter)
  steps = {
      "global": (jax.grad(fedit.adapter_loss_fn(model, backbone, config)),
                 state.global_adapter),
      "personal": (jax.grad(fedoa_personal.personal_objective(
          model, config, backbone, state.global_adapter)), personal)}
  out = {"rows": rows}
  for name, (grad_fn, adapter) in steps.items():
    jitted = jax.jit(grad_fn)
    out[name] = {"matmul_flops": matmul_flops(jax.make_jaxpr(grad_fn)(
        adapter, batch)), **xla_cost(jitted.lower(adapter, batch).compile())}
  return out


def measure(changes: dict[str, Any], names: list[str], against: str,
            repeats: int) -> dict[str, Any]:
  """Times the rounds of the methods ``names`` on the run ``changes``
  describes (module docstring); returns the results."""
  config = fields.replace(training.RunConfig(), **changes)
  rounds, first, costs, extra = {}, {}, {}, {}
  loaded = None
  for name in dict.fromkeys(names + [against]):
    plan = training.prepare(fields.replace(config, algorithm=name))
    loaded = loaded or experiment.load(plan)
    built = training.build(plan, loaded)
    algo, state, clients = built.algorithm, built.start(), built.data.train
    round_fn = jax.jit(algo.round) if algo.traceable else algo.round
    if algo.traceable:
      compiled = round_fn.lower(state, clients).compile()
      costs[name] = {"matmul_flops": matmul_flops(jax.make_jaxpr(algo.round)(
          state, clients)), **xla_cost(compiled)}
    if name == "fedoa":
      extra["fedoa_steps"] = fedoa_steps(built, state)
    rounds[name] = (lambda f=round_fn, s=state, c=clients: f(s, c)[0])
    first[name] = command.timed(rounds[name])
  times: dict[str, list[float]] = {name: [] for name in rounds}
  for _ in range(repeats):
    for name, run_round in rounds.items():
      times[name].append(command.timed(run_round))
  return {
      "round_s": {name: {"median": statistics.median(t), "min": min(t),
                         "max": max(t), "all": t}
                  for name, t in times.items()},
      "first_call_s": first,
      "ratio_to_" + against: {name: statistics.median(
          a / b for a, b in zip(t, times[against]))
                                for name, t in times.items()},
      "cost": costs, **extra,
      "train_clients": int(loaded.data.train.num_clients)}


def format_table(out: dict[str, Any]) -> str:
  """The figures of :func:`measure`, one method a line."""
  against = out["against"]
  ratios = out["ratio_to_" + against]
  lines = [f"{'method':<10} {'median s':>9} {'min s':>7} {'max s':>7} "
           f"{'/ ' + against:>9} {'matmul GFLOP':>12} {'XLA GFLOP':>9} "
           f"{'XLA GB':>7}"]
  for name, t in out["round_s"].items():
    cost = out["cost"].get(name, {})
    g = lambda k, scale=1e9: (f"{cost[k] / scale:.1f}" if k in cost else "-")
    lines.append(f"{name:<10} {t['median']:>9.3f} {t['min']:>7.3f} "
                 f"{t['max']:>7.3f} {ratios[name]:>9.2f} "
                 f"{g('matmul_flops'):>12} {g('flops'):>9} "
                 f"{g('bytes_accessed'):>7}")
  steps = out.get("fedoa_steps")
  if steps:
    lines.append(f"FedOA, one local step on {steps['rows']} rows: " + "; ".join(
        f"{k} adapter {steps[k]['matmul_flops'] / 1e9:.3f} matmul GFLOP "
        f"(XLA {steps[k]['flops'] / 1e9:.3f} GFLOP, "
        f"{steps[k]['bytes_accessed'] / 1e6:.0f} MB)"
        for k in ("global", "personal")))
  lines.append("load average (1, 5, 15 min) before: " + ", ".join(
      f"{x:.2f}" for x in out["load_average"]["before"]) + "; after: " +
               ", ".join(f"{x:.2f}" for x in out["load_average"]["after"]))
  return "\n".join(lines)


def run(f: Any = None) -> dict[str, Any]:
  """Measures what the flags ask; prints the table and writes the JSON."""
  f = f or FLAGS
  changes = {**preset_changes(f.preset),
             **named_changes(f.changes)}
  before = os.getloadavg()
  out = measure(changes, list(f.algorithms), f.against, f.repeats)
  out.update(against=f.against, load_average={"before": before,
                                              "after": os.getloadavg()},
             flags={k: getattr(f, k) for k in (
                 "preset", "changes", "algorithms", "against", "repeats")},
             jax=jax.__version__, backend=jax.default_backend())
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
