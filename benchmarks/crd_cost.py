r"""Per-round cost of the server's CRD step (R_h's gradient, Section V).

  python -m benchmarks.crd_cost --server=256 --pm=resnet32x4 --clients=40

Every round the server computes ``grad R_h(theta^t)`` with
``transfer.make_crd_regularizer``'s ``grad_fn``: one pass over the server
split in minibatches, each through the client model (forward and backward)
and, unless cached, through the frozen PM. Two regularisers on the same
student, PM, server split and CRD configuration:

* ``recomputed``: ``teacher_per_example=False``: the PM runs on every
  minibatch of every round (what a PM with per-batch statistics, or
  augmented server images, needs);
* ``cached``: ``teacher_per_example=True`` (a PM with running batch-norm
  statistics, no augmentation): the PM runs over the server split once, when
  the regulariser is built (``setup_s``), and every round reads its rows.

Both compute the same gradient (checked: ``max_abs_diff``). ``--variants``
adds cheaper steps, each the cached one with some ``CRDConfig`` fields
changed (``name:field=value+field=value``, e.g.
``shared:negative_sampling=shared``, ``subset10:kt_steps=10``), or the
student's convolutions (``xla:conv_impl=xla``, ``models.conv``). Unless a
variant names ``loop``, each step loops over its minibatches as a run of
that student would (``training.defaults.crd_loop``). Each
variant's gradient is compared with the cached step's at the same theta and
state (``rel_diff``: ``||g - g_full|| / ||g_full||``), beside the cached
step's own difference between two draws of its negatives and minibatches
(``full_reseeded``). All are timed round-robin with, if ``--clients > 0``,
the AugFL client round of that many clients (``--round_model``, default the
CNN; ``benchmarks.cells``, the backend's default strategy), so that the
table gives, from one run, every step against the others and against a
client round.
Models: a ``cnn`` student and a ``--pm`` PM (running batch norm) on 28x28x1
inputs, 26 classes; synthetic data.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any, Callable

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.core import client_axis
from augfl_jax import models
from augfl_jax.models.conv import check_conv_impl
from augfl_jax import transfer
from augfl_jax.training import defaults
from benchmarks import cells
from benchmarks import command

FLAGS = flags.FLAGS
INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 26


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_integer("server", 256, "Server-split examples n.",
                       lower_bound=1)
  flags.DEFINE_enum("pm", "resnet32x4", pm_models(), "PM architecture (norm "
                    "'running').")
  flags.DEFINE_enum("student", "cnn", models.available_models(),
                    "Client model.")
  flags.DEFINE_integer("crd.batch_size", 128, "CRD minibatch size.")
  flags.DEFINE_integer("crd.nce_k", 4096, "CRD negatives per example.")
  flags.DEFINE_integer("clients", 40, "Clients of the AugFL round timed "
                       "alongside (0: none).", lower_bound=0)
  flags.DEFINE_integer("examples", 15, "Examples per support / query set of "
                       "the AugFL round.", lower_bound=1)
  flags.DEFINE_enum("round_model", "cnn", sorted(cells.MODELS), "Benchmark "
                    "model of the AugFL round.")
  flags.DEFINE_list("variants", [], "Cheaper steps: name:field=value+..."
                    " (CRDConfig fields of the cached step).")
  flags.DEFINE_bool("recomputed", True, "Also time the step that runs the PM "
                    "on every minibatch.")
  flags.DEFINE_integer("repeats", 3, "Timed rounds of each after warm-up.",
                       lower_bound=1)
  flags.DEFINE_integer("seed", 0, "Seed of the synthetic data and weights.",
                       lower_bound=0)
  flags.DEFINE_string("output", "crd_cost.json", "JSON results path.")
  command.config_rule("crd.batch_size")
  command.config_rule("crd.nce_k")
  command.check("variants", parse_variants)
  command.output()


def pm_models() -> list[str]:
  """The models that can be a PM here: those with a ``norm`` field (the
  PM's batch norm runs on its running statistics)."""
  return [m for m in models.available_models()
          if "norm" in models.model_fields(m)]


def flag(f: Any, name: str) -> Any:
  """Flag ``name`` of ``f``: absl's ``FLAGS`` (``f[name].value``, which reads
  the run's dotted names, ``crd.nce_k``, that attribute access cannot spell)
  or a stand-in that has ``name`` as an attribute (``getattr``)."""
  if isinstance(f, flags.FlagValues):
    return f[name].value
  return getattr(f, name)


def _sync(out: Any) -> Any:
  return jax.block_until_ready(out)


def parse_variants(specs: list[str]) -> dict[str, dict[str, Any]]:
  """``["shared:negative_sampling=shared+kt_steps=10"]`` ->
  ``{"shared": {"negative_sampling": "shared", "kt_steps": 10}}``, each
  value converted to its ``CRDConfig`` field's type (``conv_impl``: the
  student's, a string)."""
  types = {f.name: f.type for f in dataclasses.fields(transfer.CRDConfig)}
  types["conv_impl"] = "str"
  variants = {}
  for spec in specs:
    name, _, body = spec.partition(":")
    overrides = {}
    for item in filter(None, body.split("+")):
      field, _, value = item.partition("=")
      if field not in types:
        raise ValueError(f"variant {name!r}: {field!r} is not a CRDConfig "
                         f"field or conv_impl ({', '.join(types)})")
      kind = str(types[field])
      try:
        overrides[field] = (int(value) if kind.startswith("int") else
                            float(value) if kind.startswith("float") else
                            value)
      except ValueError:
        what = "an integer" if kind.startswith("int") else "a number"
        raise ValueError(f"variant {name!r}: {field}={value!r} is not "
                         f"{what}") from None
    try:  # each value by its field's rule
      dataclasses.replace(transfer.CRDConfig(), **{
          k: v for k, v in overrides.items() if k != "conv_impl"})
      check_conv_impl(overrides.get("conv_impl", "auto"))
    except ValueError as e:
      raise ValueError(f"variant {name!r}: {e}") from None
    variants[name] = overrides
  return variants


def make_regularizers(server: int, pm: str, student: str, batch_size: int,
                      nce_k: int, seed: int = 0,
                      variants: dict[str, dict[str, Any]] | None = None,
                      recomputed: bool = True) -> dict[str, Any]:
  """The student's parameters and the regularisers (and their setup
  times) on one synthetic server split of ``server`` examples: the cached
  step, its variants and, if ``recomputed``, the step that runs the PM on
  every minibatch."""
  rng = np.random.default_rng(seed)
  data = {"x": jnp.asarray(rng.standard_normal((server,) + INPUT_SHAPE,
                                               dtype=np.float32)),
          "y": jnp.asarray(rng.integers(0, NUM_CLASSES, server, np.int32)),
          "mask": jnp.ones((server,), jnp.float32)}
  student_model = models.create_model(student, NUM_CLASSES)
  student_params = models.init_params(student_model, jax.random.key(seed),
                                      INPUT_SHAPE)
  pm_model = models.create_model(pm, NUM_CLASSES, norm="running")
  pm_vars = {"params": models.init_params(pm_model, jax.random.key(seed + 1),
                                          INPUT_SHAPE),
             "batch_stats": models.init_batch_stats(pm_model, INPUT_SHAPE)}
  teacher = lambda x, mask: pm_model.apply(pm_vars, x, mask=mask)
  config = transfer.CRDConfig(batch_size=batch_size, nce_k=nce_k)
  out = {"student_params": student_params,
         "pm_params": models.num_params(pm_vars["params"]),
         "student_num_params": models.num_params(student_params),
         "steps": -(-server // batch_size)}
  steps = {"cached": (config, True, {})}
  if recomputed:
    steps["recomputed"] = (config, False, {})
  for name, overrides in (variants or {}).items():
    overrides = dict(overrides)
    model_kwargs = ({"conv_impl": overrides.pop("conv_impl")}
                    if "conv_impl" in overrides else {})
    steps[name] = (dataclasses.replace(config, **overrides), True,
                   model_kwargs)
  for name, (step_config, per_example, model_kwargs) in steps.items():
    if step_config.loop == "auto":  # what a run of this student runs
      step_config = dataclasses.replace(step_config, loop=defaults.crd_loop(
          models.resolve_conv_impl(model_kwargs.get("conv_impl", "auto"))))
    start = time.perf_counter()
    init_fn, grad_fn = transfer.make_crd_regularizer(
        models.make_features_fn(models.create_model(
            student, NUM_CLASSES, **model_kwargs)),
        teacher, data, step_config, teacher_per_example=per_example)
    setup = time.perf_counter() - start
    out[name] = {"grad_fn": grad_fn, "setup_s": setup,
                 "loop": step_config.loop,
                 "state": init_fn(jax.random.key(seed + 2), student_params)}
  out["names"] = list(steps)
  return out


def _rel_diff(a: Any, b: Any) -> float:
  """``||a - b|| / ||b||`` over all leaves."""
  num = sum(float(jnp.sum((x - y) ** 2)) for x, y in zip(
      jax.tree.leaves(a), jax.tree.leaves(b)))
  den = sum(float(jnp.sum(y ** 2)) for y in jax.tree.leaves(b))
  return (num / den) ** 0.5


def run(f: Any = None) -> dict[str, Any]:
  """Measures the flags' setting; returns (and writes) the results."""
  f = f or FLAGS
  variants = parse_variants(list(getattr(f, "variants", [])))
  with_recomputed = getattr(f, "recomputed", True)
  regs = make_regularizers(f.server, f.pm, f.student,
                           flag(f, "crd.batch_size"), flag(f, "crd.nce_k"),
                           f.seed, variants, with_recomputed)
  theta = regs["student_params"]
  runners: dict[str, Callable[[], Any]] = {}
  for name in regs["names"]:
    grad_fn, state = regs[name]["grad_fn"], regs[name]["state"]
    runners[name] = (lambda g=grad_fn, s=state: g(theta, s))
  grads = {name: _sync(run_once())[0] for name, run_once in runners.items()}
  diff = (max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(grads["recomputed"]), jax.tree.leaves(grads["cached"])))
          if with_recomputed else None)
  cached = regs["cached"]
  reseeded = cached["grad_fn"](theta, cached["state"].replace(
      key=jax.random.key(f.seed + 3)))[0]
  rel_diff = {name: _rel_diff(grads[name], grads["cached"])
              for name in variants}
  rel_diff["full_reseeded"] = _rel_diff(reseeded, grads["cached"])
  if f.clients > 0:
    problem = cells.make_problem(f.round_model, "auto", f.clients,
                                 f.examples, f.seed)
    round_state = cells.initial_state("augfl", problem)
    strategy = client_axis.as_strategy(None)
    round_fn = cells.make_round_fn("augfl", problem, strategy)
    round_fn = round_fn.lower(round_state, problem.clients).compile()
    runners[f"augfl_round_C{f.clients}"] = (
        lambda: round_fn(round_state, problem.clients))
  times: dict[str, list[float]] = {k: [] for k in runners}
  for i in range(1 + f.repeats):  # the first pass warms up (compiles)
    for key, run_once in runners.items():
      t = command.timed(run_once)
      if i:
        times[key].append(t)
  med = {k: statistics.median(v) for k, v in times.items()}
  paired = lambda a, b: statistics.median(
      x / y for x, y in zip(times[a], times[b]))
  ratios = {f"{name}/cached": paired(name, "cached")
            for name in regs["names"] if name != "cached"}
  for k in runners:
    if k.startswith("augfl_round"):
      for name in regs["names"]:
        ratios[f"{name}/{k}"] = paired(name, k)
  out = {"machine": {"jax": jax.__version__, "backend": jax.default_backend(),
                     "devices": [str(d) for d in jax.devices()]},
         "load_average": os.getloadavg(),
         "flags": {k: flag(f, k) for k in (
             "server", "pm", "student", "crd.batch_size", "crd.nce_k",
             "clients", "examples", "round_model", "repeats", "seed")},
         "variants": variants,
         "pm_num_params": regs["pm_params"],
         "student_num_params": regs["student_num_params"],
         "minibatches_per_round": regs["steps"],
         "setup_s": {k: regs[k]["setup_s"] for k in regs["names"]},
         "loop": {k: regs[k]["loop"] for k in regs["names"]},
         "round_s": {k: {"median": med[k], "all": v}
                     for k, v in times.items()},
         "paired_ratios": ratios, "max_abs_diff": diff,
         "rel_diff": rel_diff}
  print(format_table(out))
  if f.output:
    command.write_json(f.output, out)
    print(f"wrote {f.output}")
  return out


def format_table(out: dict[str, Any]) -> str:
  """The medians, setup times and paired ratios, one per line."""
  fl = out["flags"]
  # Files written before the flags had the run's names: batch_size, nce_k.
  batch_size = fl.get("crd.batch_size", fl.get("batch_size"))
  nce_k = fl.get("crd.nce_k", fl.get("nce_k"))
  lines = [f"CRD step: student {fl['student']} "
           f"({out['student_num_params']:,} params), PM {fl['pm']} "
           f"({out['pm_num_params']:,} params, running batch norm), server "
           f"n = {fl['server']} in {out['minibatches_per_round']} minibatches"
           f" of {batch_size}, K = {nce_k}"]
  for k, v in out["round_s"].items():
    setup = out["setup_s"].get(k)
    loop = out["loop"].get(k)
    lines.append(f"  {k:<20} median {v['median']:8.3f} s/round" +
                 (f"  (setup {setup:.2f} s, {loop} loop)"
                  if setup is not None else ""))
  for k, v in out["paired_ratios"].items():
    lines.append(f"  {k:<38} {v:8.2f}")
  if out["max_abs_diff"] is not None:
    lines.append(f"  max |grad recomputed - grad cached| = "
                 f"{out['max_abs_diff']:.2e}")
  for k, v in out["rel_diff"].items():
    lines.append(f"  ||grad {k} - grad cached|| / ||grad cached|| = "
                 f"{v:.3f}")
  lines.append("  load average (1, 5, 15 min) at the end: " + ", ".join(
      f"{x:.2f}" for x in out["load_average"]))
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  del argv
  run()


if __name__ == "__main__":
  command.run(define_flags, main)
