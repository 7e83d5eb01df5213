"""The benchmark harness on a tiny grid: it runs and writes the JSON fields;
every command refuses a bad flag value in one line and prints its flags for
``--help``."""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys
import types

import jax
import pytest

from augfl_jax import algorithms, training
from augfl_jax.core import fields
from augfl_jax.training import defaults
from benchmarks import cells
from benchmarks import round_cost
from benchmarks import run_defaults

pytest.importorskip("absl")


class _Flags:
  """Stands in for absl FLAGS (round_cost.run reads attributes only)."""

  def __init__(self, tmp_path, references):
    self.algorithms = ["augfl"]
    self.models = ["tiny_cnn"]
    self.clients = ["3"]
    self.examples = ["4"]
    self.strategies = ["map"]
    self.conv_impls = ["patches"]
    self.dense_updates = ["materialised", "factored"]
    self.references = references
    self.reference_max_clients = 10
    self.repeats = 2
    self.warmup = 0
    self.matmul_size = 128
    self.seed = 0
    self.compile_only = False
    self.donate_state = False
    self.output = str(tmp_path / "out.json")


@pytest.mark.slow
def test_round_cost_tiny_grid_writes_json(tmp_path):
  try:
    import torch  # noqa: F401 pylint: disable=g-import-not-at-top,unused-import
    refs = ["python_loop", "torch:1", "torch_vmap:1"]
  except ImportError:
    refs = ["python_loop"]
  flags = _Flags(tmp_path, refs)
  round_cost.run(flags)
  with open(flags.output) as fh:
    out = json.load(fh)
  assert out["machine"]["matmul_peak_gflops_start"] > 0
  results = out["results"]
  assert [r["dense_updates"] for r in results] == ["materialised", "factored"]
  # the dual sum alone, against each client's dual and theta_i
  assert results[1]["state_bytes"] < results[0]["state_bytes"]
  for r in results:
    for key in ("compile_s", "round_s", "xla_memory", "maxrss_mb",
                "flops_per_round", "gflops_per_s", "fraction_of_peak",
                "references", "ratios", "paired_ratios"):
      assert key in r, key
    t = r["round_s"]
    assert 0 < t["min"] <= t["median"] <= t["max"] and len(t["all"]) == 2
    assert r["xla_memory"]["peak_bytes"] > 0
    assert r["flops_per_round"] > 0
  assert set(results[0]["paired_ratios"]) == set(refs)
  if "torch:1" in refs:  # same equations, same weights and data
    for r in results:  # materialised and factored
      assert r["torch_max_abs_diff"] < 1e-4
      diffs = r["reference_max_abs_diff"]
      assert set(diffs) == {"torch:1", "torch_vmap:1"}
      assert max(diffs.values()) < 1e-4, diffs
    assert out["machine"]["torch_device"] in ("cpu", "cuda")


def test_cnn_digits_cell_is_the_cnn_on_8x8_inputs():
  problem = cells.make_problem("cnn_digits", "patches", 2, 3)
  assert problem.clients.support["x"].shape == (2, 3, 8, 8, 1)
  assert problem.num_classes == 10
  assert sum(a.size for a in jax.tree.leaves(problem.params)) == 155_626


def test_round_flops_counts_gradients():
  problem = cells.make_problem("tiny_cnn", "patches", 3, 4)
  one = cells.gradient_flops(problem, 4)
  assert one > 0
  assert cells.round_flops("augfl", problem) == pytest.approx(3 * 4 * one)
  # FedAvg: 1 epoch of ceil(8 / 10) = 1 minibatch of 10 rows.
  assert cells.round_flops("fedavg", problem) == pytest.approx(
      3 * cells.gradient_flops(problem, 10))


def test_plot_writes_png(tmp_path):
  pytest.importorskip("matplotlib")
  from benchmarks import plot  # pylint: disable=g-import-not-at-top
  results = []
  for c, t in ((10, 1.0), (100, 9.0)):
    results.append({"algorithm": "augfl", "model": "cnn",
                    "conv_impl": "patches", "examples": 15,
                    "strategy": "map", "num_clients": c,
                    "round_s": {"median": t, "min": t * 0.9, "max": t * 1.1},
                    "references": {"torch:1": {"median": 2 * t,
                                               "min": 2 * t, "max": 2 * t}}})
  lines = plot.series(results)[("augfl", "cnn", "patches", 15)]
  assert lines["map"] == [(10, 1.0, 0.9, 1.1), (100, 9.0, 8.1, 9.9)]
  assert lines["ref torch:1"][1][1] == 18.0
  assert plot.loglog_slope(lines["map"]) == pytest.approx(
      math.log(9.0) / math.log(10.0))
  assert "slope 0.954" in plot.summary(results)
  path = tmp_path / "plot.png"
  plot.plot(results, str(path))
  assert path.read_bytes()[:4] == b"\x89PNG"
  for r, mib in zip(results, (100, 1000)):
    r["xla_memory"] = {"peak_bytes": mib * 2 ** 20}
  factored = [{**r, "dense_updates": "factored",
               "xla_memory": {"peak_bytes": 2 ** 20 * r["num_clients"]}}
              for r in results]
  memory = plot.series(results + factored, "memory")[
      ("augfl", "cnn", "patches", 15)]
  assert memory == {"map": [(10, 100.0, 100.0, 100.0),
                            (100, 1000.0, 1000.0, 1000.0)],
                    "map factored": [(10, 10.0, 10.0, 10.0),
                                     (100, 100.0, 100.0, 100.0)]}
  assert "map factored: slope 1.000; per client 10: 1.00 MiB" in (
      plot.summary(results + factored, "memory"))
  plot.plot(results + factored, str(path), "memory")


def test_plot_names_a_file_it_cannot_read(tmp_path):
  pytest.importorskip("matplotlib")
  from benchmarks import plot  # pylint: disable=g-import-not-at-top
  files = {"missing.json": None, "text.json": "not JSON",
           "other.json": json.dumps({"rows": []}),
           "partial.json": json.dumps({"results": [{"algorithm": "augfl"}]})}
  for name, text in files.items():
    if text is not None:
      (tmp_path / name).write_text(text)
  reasons = {}
  for name in files:
    with pytest.raises(ValueError) as e:
      plot.load([str(tmp_path / name)])
    reasons[name] = str(e.value).rpartition(" (")[2]
  assert reasons == {"missing.json": "No such file or directory)",
                     "text.json": "it is not JSON)",
                     "other.json": "it has no results)",
                     "partial.json": "a result has no 'model')"}
  with pytest.raises(ValueError, match="name the JSON files"):
    plot.load([])


def test_run_defaults_parses_variants_and_pairs_ratios_by_repeat():
  assert run_defaults.parse_variants(
      "vmap_xla=--strategy=vmap --conv_impl=xla;auto=") == [
          ("vmap_xla", ["--strategy=vmap", "--conv_impl=xla"]), ("auto", [])]
  with pytest.raises(ValueError, match="label=flags"):
    run_defaults.parse_variants("--strategy=vmap")
  records = [{"label": "a", "repeat": 0, "wall_s": 6.0},
             {"label": "b", "repeat": 0, "wall_s": 2.0},
             {"label": "a", "repeat": 1, "wall_s": 9.0},
             {"label": "b", "repeat": 1, "wall_s": 3.0}]
  assert run_defaults.ratios(records, "wall_s") == {"a": [3.0, 3.0],
                                                    "b": [1.0, 1.0]}


@pytest.mark.slow
def test_crd_cost_times_recomputed_and_cached_pm(tmp_path):
  from benchmarks import crd_cost  # pylint: disable=g-import-not-at-top

  # The run's dotted flag names (--crd.nce_k), as attributes of a stand-in.
  stand_in = types.SimpleNamespace(**{
      "server": 16, "pm": "mlp", "student": "mlp", "crd.batch_size": 8,
      "crd.nce_k": 8, "clients": 2, "examples": 3, "round_model": "tiny_cnn",
      "repeats": 1, "seed": 0,
      "variants": ["shared:negative_sampling=shared+nce_k=16",
                   "one:kt_steps=1"],
      "output": str(tmp_path / "crd.json")})

  out = crd_cost.run(stand_in)
  assert out["flags"]["crd.batch_size"] == 8
  assert out["flags"]["crd.nce_k"] == 8
  assert set(out["round_s"]) == {"recomputed", "cached", "shared", "one",
                                 "augfl_round_C2"}
  assert out["variants"]["shared"] == {"negative_sampling": "shared",
                                       "nce_k": 16}
  assert set(out["rel_diff"]) == {"shared", "one", "full_reseeded"}
  assert out["rel_diff"]["full_reseeded"] > 0  # other draws, other numbers
  assert "one/augfl_round_C2" in out["paired_ratios"]
  assert out["minibatches_per_round"] == 2
  assert out["max_abs_diff"] < 1e-6  # the same gradient either way
  assert out["paired_ratios"]["recomputed/cached"] > 0
  assert "cached/augfl_round_C2" in out["paired_ratios"]
  with open(stand_in.output) as fh:
    written = json.load(fh)
  assert written["setup_s"]["cached"] > 0
  # A file written before the flags had the run's names still reads.
  old = dict(written, flags={("batch_size" if k == "crd.batch_size" else
                              "nce_k" if k == "crd.nce_k" else k): v
                             for k, v in written["flags"].items()})
  assert crd_cost.format_table(old) == crd_cost.format_table(written)
  # mlp students have no convolutions: every step scans, as a run would.
  assert set(out["loop"].values()) == {"scan"}


def test_crd_benchmarks_read_the_runs_dotted_flag_names():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from benchmarks import crd_cost  # pylint: disable=g-import-not-at-top
  from benchmarks import crd_profile  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  flags.DEFINE_integer("crd.nce_k", 16, "", flag_values=values)
  values(["benchmark", "--crd.nce_k=32"])
  assert crd_cost.flag(values, "crd.nce_k") == 32
  assert crd_cost.flag(types.SimpleNamespace(**{"crd.nce_k": 4}),
                       "crd.nce_k") == 4
  # crd_profile reads its dotted flags through crd_cost.flag
  parts, minibatches = crd_profile.make_parts(types.SimpleNamespace(
      seed=0, server=20, student="mlp", num_classes=3, pm_features=6,
      **{"crd.batch_size": 8, "crd.nce_k": 4,
         "crd.negative_sampling": "per_example", "crd.bank_dtype": "float32"}))
  assert minibatches == 3 and "step" in parts


def test_crd_cost_variants_take_the_students_convolutions_and_loop():
  from benchmarks import crd_cost  # pylint: disable=g-import-not-at-top
  assert crd_cost.parse_variants(
      ["xla:conv_impl=xla+loop=python+kt_steps=4"]) == {
          "xla": {"conv_impl": "xla", "loop": "python", "kt_steps": 4}}
  with pytest.raises(ValueError, match="'widths' is not a CRDConfig"):
    crd_cost.parse_variants(["w:widths=4"])
  # Runs loop in Python on CPU only over XLA's convolutions.
  cpu = jax.default_backend() == "cpu"
  assert defaults.crd_loop("xla") == ("python" if cpu else "scan")
  assert defaults.crd_loop("patches") == "scan"


# Few clients; FedBC's five local epochs over synthetic's largest clients
# take most of the time: one epoch shows the same.
QUICKER = {"fedbc": {"fedbc.local_epochs": 1},
           "per_fedbc": {"fedbc.local_epochs": 1}}


@pytest.mark.slow
def test_round_cost_times_every_registered_method_against_fedavg(tmp_path):
  """--per_method at toy size (synthetic, 10 clients, PMs of 1 epoch, 1
  repeat): every registered method's round runs, and each has its ratio to
  FedAvg's round of the same pass."""
  configs = {}
  for name in algorithms.REGISTRY:
    config = fields.replace(training.RunConfig(
        dataset="synthetic", algorithm=name, pm=training.PMConfig(epochs=1)),
        **{"data.num_clients": 10, **QUICKER.get(name, {})})
    resolved = training.validate(config)
    if training.pm_role(resolved) != "none":
      # FedLP's PM is the client model; the others share the dataset's PM.
      pm = resolved.pm.model + ("_client" if name == "fedlp" else "")
      config = fields.replace(config, **{"pm.dir": str(tmp_path / pm)})
    configs[name] = config
  results = round_cost.time_methods(configs, repeats=1, warmup=0,
                                    log=lambda line: None)
  assert [r["method"] for r in results] == list(algorithms.REGISTRY)
  for r in results:
    assert len(r["round_s"]["all"]) == 1 and r["round_s"]["median"] > 0
    assert r["first_call_s"] > 0 and r["ratio_to_fedavg"] > 0
    assert r["paired_ratio_to_fedavg"] == pytest.approx(r["ratio_to_fedavg"])
  assert next(r for r in results if r["method"] == "fedavg")[
      "ratio_to_fedavg"] == 1.0
  table = round_cost.format_methods(results).splitlines()
  assert "/fedavg" in table[0] and len(table) == 2 + len(results)
  with pytest.raises(ValueError, match="FedAvg"):
    round_cost.time_methods({}, repeats=1)


# ----------------------------------------------------------------------------
# Every command's flags: a bad value is one line and exit code 2 before any
# work; --help exits 0 with the command's own flags.

# command -> (a value its flags refuse, the line that refuses it). The first
# runs in the default suite; each is two processes of a few seconds.
REFUSED = {
    "round_cost": ("--models=nosuch", "flag --models=['nosuch']: each item "
                   "must be one of cnn, cnn_dense16, cnn_digits, logreg, mlp, "
                   "resnet8x4, tiny_cnn, got 'nosuch'"),
    "crd_cost": ("--clients=-1", "flag --clients=-1: -1 is not a "
                 "non-negative integer"),
    "crd_profile": ("--crd.nce_k=0", "flag --crd.nce_k=0: crd.nce_k must be "
                    ">= 1, got 0"),
    "eval_cost": ("--dataset=nosuch", "flag --dataset=nosuch: unknown dataset "
                  "'nosuch'; choose one of"),
    "fedoa_cost": ("--algorithms=nosuch", "flag --algorithms=['nosuch']: "
                   "each item must be a registered method, got 'nosuch'"),
    "hvp_forms": ("--examples=0", "flag --examples=0: 0 is not a positive "
                  "integer"),
    "head_to_head": ("--augfl.alpha=0", "flag --augfl.alpha=0.0: augfl.alpha "
                     "must be > 0, got 0.0"),
    "run_defaults": ("--variants=vmap", "flag --variants=vmap: a variant is "
                     "label=flags, got 'vmap'"),
    "seed_population": ("--seeds=3,3", "flag --seeds=['3', '3']: a "
                        "population is at least two distinct seeds, got 3,3"),
    "processes": ("--processes=2,0", "flag --processes=['2', '0']: each item "
                  "must be an integer >= 1, got '0'"),
    "conv_forms": ("--batch=0", "flag --batch=0: 0 is not a positive "
                   "integer"),
    "plot": ("--value=seconds", "flag --value=seconds: value should be one "
             "of <time|memory>"),
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(tmp_path, name, *args):
  return subprocess.run(
      [sys.executable, "-m", f"benchmarks.{name}", *args], cwd=tmp_path,
      env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
      timeout=300, check=False)


def test_every_benchmark_command_is_checked():
  commands = {os.path.basename(path)[:-3] for path in glob.glob(
      os.path.join(ROOT, "benchmarks", "*.py"))
              if 'if __name__ == "__main__":' in open(path).read()}
  assert commands == set(REFUSED)


@pytest.mark.parametrize("name", [
    name if i == 0 else pytest.param(name, marks=pytest.mark.slow)
    for i, name in enumerate(REFUSED)])
def test_a_bad_value_is_one_line_and_help_exits_0(tmp_path, name):
  value, line = REFUSED[name]
  result = _command(tmp_path, name, value)
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith(f"error: {line}"), result.stderr
  assert result.stderr.count("\n") == 1 and not result.stdout
  assert not os.listdir(tmp_path)  # nothing written
  result = _command(tmp_path, name, "--help")
  assert result.returncode == 0, result.stderr
  assert f"the flags of python -m benchmarks.{name}:" in result.stdout
  flag = value.partition("=")[0]
  assert f"\n  {flag}: " in result.stdout  # among the command's own flags


def test_a_run_that_refuses_the_benchmarks_flags_stops_it(tmp_path):
  from benchmarks import command  # pylint: disable=g-import-not-at-top
  args = ["--dataset=digits", "--rounds=0"]
  with pytest.raises(ValueError) as e:
    command.check_started(2, str(tmp_path), ["error: --rounds must be >= 1, "
                                             "got 0"], args)
  assert str(e.value) == ("experiments.run --dataset=digits --rounds=0 "
                          "stopped before its first round (--rounds must be "
                          ">= 1, got 0)")
  command.check_started(1, str(tmp_path), ["Killed"], args)  # recorded
  (tmp_path / "metrics.jsonl").write_text("")  # it ran: recorded
  command.check_started(2, str(tmp_path), ["error: non-finite"], args)


@pytest.mark.slow
def test_run_defaults_stops_at_flags_the_run_refuses(tmp_path):
  result = _command(tmp_path, "run_defaults", "--common=--rounds=0",
                    "--variants=a=", "--repeats=1", "--nowarmup")
  assert result.returncode == 2, result.stderr
  assert result.stderr == ("error: experiments.run --rounds=0 stopped before "
                           "its first round (--rounds must be >= 1, got 0)\n")
  assert not os.path.exists(tmp_path / "run_defaults.json")
