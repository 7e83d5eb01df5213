r"""Per-round cost of AugFL / FedAvg / Per-FedAvg rounds, with references;
or of every registered method's round against FedAvg's (``--per_method``).

  python -m benchmarks.round_cost --clients=10,40,100 --models=cnn \
      --strategies=map,chunked:8,vmap --conv_impls=patches,xla \
      --output=round_cost.json
  python -m benchmarks.round_cost --dense_updates=materialised,factored
  python -m benchmarks.round_cost --per_method --dataset=fashion_mnist \
      --methods=fedavg,augfl,fedoa

``--per_method`` (:func:`time_methods`) builds each of ``--methods``
(default: every registered method, ``augfl_jax.algorithms.REGISTRY``) as
``experiments.run`` would on ``--dataset`` (its preset; the PM its run
uses, pretrained into the run's ``pm.dir`` first where none is there),
and times its round as the run's loop runs it, on every training client:
after a first call (compiling included) and ``--warmup`` rounds, the
methods run round-robin, one round each in turn, ``--repeats`` times; the
table gives each median and its ratio to FedAvg's round of the same passes.
The grid's flags (``--models``, ``--clients``, ``--strategies``, ...) do not
apply there.

For each cell (algorithm, model, conv_impl, clients C, examples n, strategy,
and AugFL's ``dense_updates``: the dense kernels' per-client quantities
materialised or as factors, ``augfl.factored``):
compile time, per-round time after warm-up (median, min, max over
``--repeats``), XLA's compiled memory (``memory_analysis()``: arguments,
outputs, temporaries), the bytes of the state the round carries
(``state_bytes``: AugFL's duals, and theta_i when materialised), the
process's peak RSS, and the arithmetic rate: the
round's gradient FLOPs (XLA cost analysis of one gradient, times the number
of gradients; see ``cells.round_flops``) over the median time, against a
jitted f32 matmul measured in the same run.

References (AugFL only, on identical data and weights): ``python_loop`` (the
jitted single-client ``augfl.client_update`` called in a Python loop, as
FedJAX's default backend does), ``torch`` (the per-client PyTorch loop of
``benchmarks.torch_reference``) and ``torch_vmap`` (the same round with
``torch.func.grad`` under ``torch.func.vmap`` over clients); ``torch:N`` /
``torch_vmap:N`` pin PyTorch to N intra-op threads. The PyTorch references
run on CUDA when PyTorch sees a CUDA device (``cells.torch_device``), and
are skipped with a message when torch is not installed. So that JAX and
PyTorch fit on one GPU together, this command turns JAX's preallocation of
75% of the GPU memory off (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless
the environment sets it). Ours and the references are timed round-robin,
one round each in turn, so load on a shared machine hits all of them alike;
the table shows reference time / our time per cell. Each PyTorch round's
theta^{t+1} is compared with each cell's (``reference_max_abs_diff``;
``torch_max_abs_diff`` is the first PyTorch reference's).
"""

from __future__ import annotations

import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable

import os

from absl import flags
import jax
import jax.numpy as jnp

from augfl_jax import algorithms, data, models, processes, training
from augfl_jax.algorithms.augfl import factored
from augfl_jax.core import client_axis
from augfl_jax.training import rounds
from benchmarks import cells
from benchmarks import command

FLAGS = flags.FLAGS
TORCH_REFERENCES = ("torch", "torch_vmap")


def define_flags() -> None:
  """The command's flags; defined only when it runs, so that importing this
  module (tests, other tools) never clashes with other absl flags."""
  flags.DEFINE_list("algorithms", ["augfl"], f"Any of {cells.ALGORITHMS}.")
  flags.DEFINE_list("models", ["cnn"], f"Any of {sorted(cells.MODELS)}.")
  flags.DEFINE_list("clients", ["40"], "Numbers of clients C.")
  flags.DEFINE_list("examples", ["15"], "Examples per support and query set.")
  flags.DEFINE_list("strategies", ["map", "chunked:8", "vmap"],
                    "Client strategies: vmap, map, chunked:K, sharded[:INNER].")
  flags.DEFINE_list("conv_impls", ["patches"], "Model conv_impl values.")
  flags.DEFINE_list("dense_updates", ["materialised"],
                    f"AugFL's dense_updates, any of {cells.DENSE_UPDATES} "
                    "(other algorithms: materialised only).")
  flags.DEFINE_list("references", ["python_loop", "torch:1", "torch:2"],
                    "AugFL references: python_loop, torch / torch_vmap "
                    "(PyTorch's per-client loop / torch.func.vmap over "
                    "clients, default threads) or torch:N / torch_vmap:N (N "
                    "threads); on CUDA when PyTorch sees it; empty: none.")
  flags.DEFINE_integer("reference_max_clients", 200,
                       "Time references only up to this many clients.",
                       lower_bound=0)
  flags.DEFINE_integer("repeats", 5, "Timed rounds per cell after warm-up.",
                       lower_bound=1)
  flags.DEFINE_integer("warmup", 1, "Untimed rounds after compilation.",
                       lower_bound=0)
  flags.DEFINE_integer("matmul_size", 2048, "Side of the peak-rate matmul.",
                       lower_bound=1)
  flags.DEFINE_string("output", "round_cost.json", "JSON results path.")
  flags.DEFINE_bool("compile_only", False,
                    "Compile and report XLA memory only (no rounds run): for "
                    "memory checks of cells too slow to time here.")
  flags.DEFINE_bool("donate_state", False,
                    "With --compile_only: compile the round with the state "
                    "donated (jax.jit(..., donate_argnums=0)), so the new "
                    "per-client state reuses the old one's buffers.")
  flags.DEFINE_integer("seed", 0, "Seed of the synthetic data and weights "
                       "(--per_method: the runs' seed).", lower_bound=0)
  flags.DEFINE_bool("per_method", False,
                    "Time the round of each of --methods as a run of "
                    "--dataset builds it, against FedAvg's, instead of the "
                    "grid.")
  flags.DEFINE_list("methods", list(algorithms.REGISTRY),
                    "With --per_method: the registered methods to time "
                    "(FedAvg, the reference, is always timed).")
  flags.DEFINE_string("dataset", "fashion_mnist",
                      "With --per_method: the runs' dataset (its preset).")
  command.choices("algorithms", cells.ALGORITHMS)
  command.choices("models", sorted(cells.MODELS))
  command.integers("clients", 1)
  command.integers("examples", 1)
  command.each("strategies", "a client strategy (vmap, map, chunked:K, "
               "sharded[:INNER])", client_axis.as_strategy)
  command.choices("conv_impls", ("auto",) + models.CONV_IMPLS)
  command.choices("dense_updates", cells.DENSE_UPDATES)
  command.choices("methods", tuple(algorithms.REGISTRY))
  command.check("dataset", data.canonical_name)
  command.each("references", "python_loop, torch, torch_vmap, torch:N or "
               "torch_vmap:N (N >= 1 threads)", _is_reference, empty=True)
  command.output()


def _is_reference(name: str) -> bool:
  """Whether ``name`` is one of ``--references``' forms."""
  kind, sep, threads = name.partition(":")
  if kind == "python_loop":
    return not sep
  return kind in TORCH_REFERENCES and (not sep or int(threads) >= 1)


def _sync(out: Any) -> Any:
  """Waits for JAX arrays; torch results are already computed."""
  return jax.block_until_ready(
      jax.tree.map(lambda a: a if isinstance(a, jax.Array) else None, out))


def _time(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  _sync(fn())
  return time.perf_counter() - start


def _summary(times: list[float]) -> dict[str, Any]:
  return {"median": statistics.median(times), "min": min(times),
          "max": max(times), "all": times}


def matmul_peak(size: int, repeats: int = 5) -> float:
  """GFLOP/s of a jitted ``[size, size] @ [size, size]`` f32 matmul (best)."""
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  _sync(f(a))
  best = min(_time(lambda: f(a)) for _ in range(repeats))
  return 2.0 * size ** 3 / best / 1e9


def _maxrss_mb() -> float:
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return rss / (1024.0 ** 2 if sys.platform == "darwin" else 1024.0)


def _memory(compiled: Any) -> dict[str, int]:
  m = compiled.memory_analysis()
  if m is None:
    return {}
  out = {k: int(getattr(m, k + "_in_bytes", 0)) for k in (
      "argument_size", "output_size", "temp_size", "alias_size",
      "generated_code_size")}
  out["peak_bytes"] = (out["argument_size"] + out["output_size"] +
                       out["temp_size"] - out["alias_size"])
  return out


def _references(algorithm: str, problem: cells.Problem, names: list[str]
                ) -> dict[str, Any]:
  """``{name: (run, to_jax or None)}`` of the references that can run."""
  refs: dict[str, Any] = {}
  if algorithm != "augfl":
    return refs
  for name in names:
    if name == "python_loop":
      refs[name] = (cells.python_loop_reference(problem), None)
    elif name.split(":")[0] in TORCH_REFERENCES:
      threads = int(name.split(":")[1]) if ":" in name else 0
      try:
        refs[name] = cells.torch_reference(
            problem, threads, vmap=name.split(":")[0] == "torch_vmap")
      except ImportError as e:
        print(f"torch reference skipped: PyTorch is not installed ({e}); "
              "pip install torch (the 'bench' extra) to time it.")
    else:
      raise ValueError(f"unknown reference {name!r}")
  return refs


def run_group(algorithm: str, model: str, conv_impl: str, num_clients: int,
              examples: int, strategies: list[str], references: list[str],
              repeats: int, warmup: int, peak: float, seed: int = 0,
              compile_only: bool = False, donate_state: bool = False,
              dense_updates: tuple[str, ...] = ("materialised",)
              ) -> list[dict[str, Any]]:
  """Measures every (strategy, dense_updates) cell of one (algorithm, model,
  impl, C, n) group.

  Ours (one compiled round per cell) and the references run round-robin,
  ``warmup + repeats`` times; returns one result dict per cell.
  """
  problem = cells.make_problem(model, conv_impl, num_clients, examples, seed)
  if algorithm != "augfl":
    dense_updates = ("materialised",)
  # compile_only: the states' shapes only (C = 1,000 materialised duals
  # and theta_i of the cnn are 13 GB)
  make = jax.eval_shape if compile_only else (lambda f: f())
  states = {mode: make(lambda m=mode: cells.initial_state(algorithm, problem,
                                                          m))
            for mode in dense_updates}
  flops = cells.round_flops(algorithm, problem)
  keys = [(name, mode) for name in strategies for mode in dense_updates]
  if compile_only:
    return [_compile_only(algorithm, problem, states[mode], name, mode,
                          conv_impl, examples, flops, donate_state)
            for name, mode in keys]
  runners: dict[Any, Callable[[], Any]] = {}
  info: dict[Any, dict[str, Any]] = {}
  for name, mode in keys:
    state = states[mode]
    round_fn = cells.make_round_fn(algorithm, problem,
                                   client_axis.as_strategy(name), mode)
    rss_before = _maxrss_mb()
    start = time.perf_counter()
    compiled = round_fn.lower(state, problem.clients).compile()
    key = (name, mode)
    info[key] = {"compile_s": time.perf_counter() - start,
                 "xla_memory": _memory(compiled)}
    runners[key] = (lambda c=compiled, s=state: c(s, problem.clients))
    _sync(runners[key]())  # first execution
    info[key]["maxrss_delta_mb_first_run"] = _maxrss_mb() - rss_before
  refs = _references(algorithm, problem, references)
  for ref, (run, _) in refs.items():
    runners["ref:" + ref] = run
  times: dict[str, list[float]] = {k: [] for k in runners}
  for i in range(warmup + repeats):
    for key, run in runners.items():
      t = _time(run)
      if i >= warmup:
        times[key].append(t)
  # each cell's theta^{t+1} against each PyTorch reference's
  diffs: dict[Any, dict[str, float]] = {key: {} for key in keys}
  torch_refs = [r for r in refs if r.split(":")[0] in TORCH_REFERENCES]
  for ref in torch_refs:
    run_torch, to_jax = refs[ref]
    theta_torch = jax.tree.leaves(to_jax(run_torch()))
    for key in keys:
      ours = jax.tree.leaves(runners[key]()[0].params)
      diffs[key][ref] = max(float(jnp.max(jnp.abs(jnp.asarray(a) - b)))
                            for a, b in zip(theta_torch, ours))
  ref_times = {r: _summary(times["ref:" + r]) for r in refs}
  results = []
  for key in keys:
    name, mode = key
    t = _summary(times[key])
    results.append({
        "algorithm": algorithm, "model": model, "conv_impl": conv_impl,
        "num_clients": num_clients, "examples": examples, "strategy": name,
        "dense_updates": mode,
        "num_params": int(sum(a.size for a in jax.tree.leaves(
            problem.params))),
        "state_bytes": factored.state_bytes(states[mode]),
        **info[key], "round_s": t, "maxrss_mb": _maxrss_mb(),
        "flops_per_round": flops,
        "gflops_per_s": flops / t["median"] / 1e9,
        "fraction_of_peak": flops / t["median"] / 1e9 / peak,
        "references": ref_times,
        "ratios": {r: ref_times[r]["median"] / t["median"] for r in refs},
        "paired_ratios": {r: statistics.median(
            a / b for a, b in zip(times["ref:" + r], times[key]))
                          for r in refs},
        "torch_max_abs_diff": (diffs[key][torch_refs[0]] if torch_refs
                               else None),
        "reference_max_abs_diff": diffs[key],
    })
  return results


def _compile_only(algorithm: str, problem: cells.Problem, state: Any,
                  name: str, mode: str, conv_impl: str, examples: int,
                  flops: float, donate_state: bool) -> dict[str, Any]:
  round_fn = cells.make_round_fn(algorithm, problem,
                                 client_axis.as_strategy(name), mode)
  if donate_state:
    round_fn = jax.jit(round_fn, donate_argnums=0)
  start = time.perf_counter()
  compiled = round_fn.lower(state, problem.clients).compile()
  nan = float("nan")
  return {
      "algorithm": algorithm, "model": problem.model_name,
      "conv_impl": conv_impl, "num_clients": problem.clients.num_clients,
      "examples": examples, "strategy": name, "dense_updates": mode,
      "compile_only": True, "donate_state": donate_state,
      "num_params": int(sum(a.size for a in jax.tree.leaves(problem.params))),
      "state_bytes": factored.state_bytes(state),
      "compile_s": time.perf_counter() - start,
      "xla_memory": _memory(compiled), "maxrss_mb": _maxrss_mb(),
      "round_s": {"median": nan, "min": nan, "max": nan, "all": []},
      "flops_per_round": flops, "gflops_per_s": nan, "fraction_of_peak": nan,
      "references": {}, "ratios": {}, "paired_ratios": {},
      "torch_max_abs_diff": None, "reference_max_abs_diff": {}}


def machine_info(peak_before: float | None) -> dict[str, Any]:
  info = {"platform": platform.platform(), "python": platform.python_version(),
          "jax": jax.__version__, "backend": jax.default_backend(),
          "devices": [str(d) for d in jax.devices()],
          "cpu_count": __import__("os").cpu_count(),
          "matmul_peak_gflops_start": peak_before}
  info["xla_python_client_preallocate"] = os.environ.get(
      "XLA_PYTHON_CLIENT_PREALLOCATE")
  try:
    import torch  # pylint: disable=g-import-not-at-top
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
    info["torch_device"] = cells.torch_device()
  except ImportError:
    info["torch"] = None
  return info


def format_table(results: list[dict[str, Any]]) -> str:
  """One line per cell: times, rate, memory and reference / ours ratios.

  A ratio column ``REF/ours`` is the median over the round-robin repeats of
  (reference time / our time) measured back to back.
  """
  refs = sorted({k for r in results for k in r["paired_ratios"]})
  head = (f"{'alg':<10} {'model':<9} {'impl':<7} {'C':>5} {'n':>3} "
          f"{'strategy':<12} {'dense':<12} {'compile':>7} {'median':>8} "
          f"{'min':>8} {'max':>8} {'GF/s':>6} {'%peak':>5} {'xla MB':>7} "
          f"{'temp MB':>7} {'state MB':>8}" +
          "".join(f" {k + '/ours':>14}" for k in refs))
  lines = [head, "-" * len(head)]
  for r in results:
    t = r["round_s"]
    ratio = lambda k: (f"{r['paired_ratios'][k]:.2f}"
                       if k in r["paired_ratios"] else "-")
    mem = r["xla_memory"].get("peak_bytes", 0) / 2 ** 20
    temp = r["xla_memory"].get("temp_size", 0) / 2 ** 20
    lines.append(
        f"{r['algorithm']:<10} {r['model']:<9} {r['conv_impl']:<7} "
        f"{r['num_clients']:>5} {r['examples']:>3} {r['strategy']:<12} "
        f"{r.get('dense_updates', 'materialised'):<12} "
        f"{r['compile_s']:>7.1f} {t['median']:>8.3f} {t['min']:>8.3f} "
        f"{t['max']:>8.3f} {r['gflops_per_s']:>6.1f} "
        f"{100 * r['fraction_of_peak']:>5.1f} {mem:>7.0f} {temp:>7.0f} "
        f"{r.get('state_bytes', 0) / 2 ** 20:>8.1f}" +
        "".join(f" {ratio(k):>14}" for k in refs))
  return "\n".join(lines)


def time_methods(configs: dict[str, training.RunConfig], repeats: int,
                 warmup: int = 1, log: Callable[[str], None] = print
                ) -> list[dict[str, Any]]:
  """Times the round of each run of ``configs`` (a method's name -> its
  run's configuration; ``"fedavg"`` among them, the reference) as
  ``training.run`` runs it: the run built (``training.build``: its data,
  its PM), its round jitted in the non-finite guard with its state donated
  (``rounds.compiled_round``) on every training client, each call until
  its state and metrics are ready. After a first call (compiling
  included) and ``warmup`` untimed rounds each, the methods run
  round-robin, one round each in turn, ``repeats`` times, so that load on
  a shared machine hits them alike.

  Returns:
    One dict per method, in ``configs``' order: ``method``, ``model``,
    ``train_clients``, ``first_call_s``, ``round_s`` (median, min, max,
    all), ``ratio_to_fedavg`` (its median over FedAvg's) and
    ``paired_ratio_to_fedavg`` (the median over the passes of its round
    over FedAvg's of the same pass).
  """
  if "fedavg" not in configs:
    raise ValueError("time_methods needs FedAvg's run, the reference")
  runs: dict[str, dict[str, Any]] = {}
  for name, config in configs.items():
    built = training.build(training.prepare(config), log=log)
    clients = processes.place_clients(built.data.train, built.plan.strategy)
    runs[name] = {"built": built, "step": rounds.compiled_round(
        built.algorithm), "clients": clients, "state": built.start(),
                  "round": 0}

  def one_round(name: str) -> float:
    run_ = runs[name]
    run_["round"] += 1
    ids = run_["built"].participants(run_["round"])
    start = time.perf_counter()
    run_["state"], metrics = run_["step"](run_["state"], run_["clients"],
                                          ids)
    jax.block_until_ready((run_["state"], metrics))
    return time.perf_counter() - start

  first = {}
  for name in runs:
    first[name] = one_round(name)
    for _ in range(warmup):
      one_round(name)
    log(f"{name}: first round {first[name]:.2f} s (compiling included)")
  times: dict[str, list[float]] = {name: [] for name in runs}
  for _ in range(repeats):
    for name in runs:
      times[name].append(one_round(name))
  reference = statistics.median(times["fedavg"])
  return [{"method": name, "model": run_["built"].plan.config.model,
           "train_clients": run_["built"].data.train.num_clients,
           "first_call_s": first[name], "round_s": _summary(times[name]),
           "ratio_to_fedavg": statistics.median(times[name]) / reference,
           "paired_ratio_to_fedavg": statistics.median(
               a / b for a, b in zip(times[name], times["fedavg"]))}
          for name, run_ in runs.items()]


def format_methods(results: list[dict[str, Any]]) -> str:
  """One line per method of :func:`time_methods`: its first call, its
  round's median, min and max, and its ratios to FedAvg's round."""
  head = (f"{'method':<11} {'model':<11} {'C':>5} {'first':>8} "
          f"{'median':>9} {'min':>9} {'max':>9} {'/fedavg':>8} "
          f"{'paired':>7}")
  lines = [head, "-" * len(head)]
  for r in results:
    t = r["round_s"]
    lines.append(
        f"{r['method']:<11} {r['model']:<11} {r['train_clients']:>5} "
        f"{r['first_call_s']:>8.2f} {t['median']:>9.4f} {t['min']:>9.4f} "
        f"{t['max']:>9.4f} {r['ratio_to_fedavg']:>8.2f} "
        f"{r['paired_ratio_to_fedavg']:>7.2f}")
  return "\n".join(lines)


def run_methods(f: Any) -> dict[str, Any]:
  """``--per_method``: :func:`time_methods` of FedAvg and ``f.methods`` on
  ``f.dataset``; prints the table and returns (and writes) the results."""
  names = list(dict.fromkeys(["fedavg", *f.methods]))
  configs = {name: training.RunConfig(dataset=f.dataset, algorithm=name,
                                      seed=f.seed) for name in names}
  results = time_methods(configs, f.repeats, f.warmup)
  out = {"machine": machine_info(None), "flags": {
      k: getattr(f, k) for k in ("per_method", "methods", "dataset",
                                 "repeats", "warmup", "seed")},
         "results": results}
  print(format_methods(results))
  return _written(out, f.output)


def _written(out: dict[str, Any], path: str) -> dict[str, Any]:
  """``out``, written as JSON to ``path`` (empty: not written), saying
  so."""
  if path:
    command.write_json(path, out)
    print(f"wrote {path}")
  return out


def run(argv_flags: Any = None) -> dict[str, Any]:
  """Runs the grid given by the flags (or, ``per_method``, each method's
  round: :func:`run_methods`); returns (and writes) the results."""
  f = argv_flags or FLAGS
  if getattr(f, "per_method", False):
    return run_methods(f)
  peak = matmul_peak(f.matmul_size)
  machine = machine_info(peak)
  print(f"matmul peak ({f.matmul_size}^2 f32, jitted): {peak:.1f} GFLOP/s")
  results = []
  for algorithm in f.algorithms:
    for model in f.models:
      for conv_impl in f.conv_impls:
        for examples in map(int, f.examples):
          for num_clients in map(int, f.clients):
            refs = (f.references if num_clients <= f.reference_max_clients
                    else [])
            group = run_group(algorithm, model, conv_impl, num_clients,
                              examples, list(f.strategies), list(refs),
                              f.repeats, f.warmup, peak, f.seed,
                              f.compile_only, f.donate_state,
                              tuple(f.dense_updates))
            results.extend(group)
            print(format_table(group), flush=True)
  machine["matmul_peak_gflops_end"] = matmul_peak(f.matmul_size)
  out = {"machine": machine, "flags": {
      k: getattr(f, k) for k in (
          "algorithms", "models", "clients", "examples", "strategies",
          "conv_impls", "dense_updates", "references",
          "reference_max_clients", "repeats",
          "warmup", "matmul_size", "seed", "compile_only", "donate_state")},
         "results": results}
  print()
  print(format_table(results))
  return _written(out, f.output)


def main(argv: list[str]) -> None:
  del argv
  # Before JAX starts its backend: on a GPU, leave room for PyTorch.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  run()


if __name__ == "__main__":
  command.run(define_flags, main)
