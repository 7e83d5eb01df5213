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

Both compute the same gradient (checked: ``max_abs_diff``). They are timed
round-robin with, if ``--clients > 0``, the AugFL client round of that many
clients (``--round_model``, default the CNN; ``benchmarks.cells``, the
backend's default strategy), so that the table
gives, from one run, cached / recomputed and each against a client round.
Models: a ``cnn`` student and a ``--pm`` PM (running batch norm) on 28x28x1
inputs, 26 classes; synthetic data.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax import clients as clients_lib
from augfl_jax import models
from augfl_jax import transfer
from benchmarks import cells

FLAGS = flags.FLAGS
INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 26


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_integer("server", 256, "Server-split examples n.")
  flags.DEFINE_string("pm", "resnet32x4", "PM architecture (norm 'running').")
  flags.DEFINE_string("student", "cnn", "Client model.")
  flags.DEFINE_integer("batch_size", 128, "CRD minibatch size.")
  flags.DEFINE_integer("nce_k", 4096, "CRD negatives per example.")
  flags.DEFINE_integer("clients", 40, "Clients of the AugFL round timed "
                       "alongside (0: none).")
  flags.DEFINE_integer("examples", 15, "Examples per support / query set of "
                       "the AugFL round.")
  flags.DEFINE_string("round_model", "cnn", "Benchmark model of the AugFL "
                      f"round, one of {sorted(cells.MODELS)}.")
  flags.DEFINE_integer("repeats", 3, "Timed rounds of each after warm-up.")
  flags.DEFINE_integer("seed", 0, "Seed of the synthetic data and weights.")
  flags.DEFINE_string("output", "crd_cost.json", "JSON results path.")


def _sync(out: Any) -> Any:
  return jax.block_until_ready(out)


def _time(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  _sync(fn())
  return time.perf_counter() - start


def make_regularizers(server: int, pm: str, student: str, batch_size: int,
                      nce_k: int, seed: int = 0) -> dict[str, Any]:
  """The student's parameters and the two regularisers (and their setup
  times) on one synthetic server split of ``server`` examples."""
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
  for name, per_example in (("recomputed", False), ("cached", True)):
    start = time.perf_counter()
    init_fn, grad_fn = transfer.make_crd_regularizer(
        models.make_features_fn(student_model), teacher, data, config,
        teacher_per_example=per_example)
    setup = time.perf_counter() - start
    out[name] = {"grad_fn": grad_fn, "setup_s": setup,
                 "state": init_fn(jax.random.key(seed + 2), student_params)}
  return out


def run(f: Any = None) -> dict[str, Any]:
  """Measures the flags' setting; returns (and writes) the results."""
  f = f or FLAGS
  regs = make_regularizers(f.server, f.pm, f.student, f.batch_size, f.nce_k,
                           f.seed)
  theta = regs["student_params"]
  runners: dict[str, Callable[[], Any]] = {}
  for name in ("recomputed", "cached"):
    grad_fn, state = regs[name]["grad_fn"], regs[name]["state"]
    runners[name] = (lambda g=grad_fn, s=state: g(theta, s))
  grads = {name: _sync(run_once())[0] for name, run_once in runners.items()}
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(grads["recomputed"]), jax.tree.leaves(grads["cached"])))
  if f.clients > 0:
    problem = cells.make_problem(f.round_model, "auto", f.clients,
                                 f.examples, f.seed)
    round_state = cells.initial_state("augfl", problem)
    strategy = clients_lib.as_strategy(None)
    round_fn = cells.make_round_fn("augfl", problem, strategy)
    round_fn = round_fn.lower(round_state, problem.clients).compile()
    runners[f"augfl_round_C{f.clients}"] = (
        lambda: round_fn(round_state, problem.clients))
  times: dict[str, list[float]] = {k: [] for k in runners}
  for i in range(1 + f.repeats):  # the first pass warms up (compiles)
    for key, run_once in runners.items():
      t = _time(run_once)
      if i:
        times[key].append(t)
  med = {k: statistics.median(v) for k, v in times.items()}
  paired = lambda a, b: statistics.median(
      x / y for x, y in zip(times[a], times[b]))
  ratios = {"recomputed/cached": paired("recomputed", "cached")}
  for k in runners:
    if k.startswith("augfl_round"):
      ratios[f"recomputed/{k}"] = paired("recomputed", k)
      ratios[f"cached/{k}"] = paired("cached", k)
  out = {"machine": {"jax": jax.__version__, "backend": jax.default_backend(),
                     "devices": [str(d) for d in jax.devices()]},
         "flags": {k: getattr(f, k) for k in (
             "server", "pm", "student", "batch_size", "nce_k", "clients",
             "examples", "round_model", "repeats", "seed")},
         "pm_num_params": regs["pm_params"],
         "student_num_params": regs["student_num_params"],
         "minibatches_per_round": regs["steps"],
         "setup_s": {k: regs[k]["setup_s"] for k in ("recomputed", "cached")},
         "round_s": {k: {"median": med[k], "all": v}
                     for k, v in times.items()},
         "paired_ratios": ratios, "max_abs_diff": diff}
  print(format_table(out))
  if f.output:
    with open(f.output, "w") as fh:
      json.dump(out, fh, indent=1)
    print(f"wrote {f.output}")
  return out


def format_table(out: dict[str, Any]) -> str:
  """The medians, setup times and paired ratios, one per line."""
  fl = out["flags"]
  lines = [f"CRD step: student {fl['student']} "
           f"({out['student_num_params']:,} params), PM {fl['pm']} "
           f"({out['pm_num_params']:,} params, running batch norm), server "
           f"n = {fl['server']} in {out['minibatches_per_round']} minibatches"
           f" of {fl['batch_size']}, K = {fl['nce_k']}"]
  for k, v in out["round_s"].items():
    setup = out["setup_s"].get(k)
    lines.append(f"  {k:<20} median {v['median']:8.3f} s/round" +
                 (f"  (setup {setup:.2f} s)" if setup is not None else ""))
  for k, v in out["paired_ratios"].items():
    lines.append(f"  {k:<38} {v:8.2f}")
  lines.append(f"  max |grad recomputed - grad cached| = "
               f"{out['max_abs_diff']:.2e}")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  del argv
  run()


if __name__ == "__main__":
  define_flags()
  app.run(main)
