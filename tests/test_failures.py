"""Runs that cannot work fail early and clearly; a non-finite round stops
the run naming the round, the quantity and the clients.

Runs are tiny (digits, mlp, lam 0) and share a persistent compilation cache
in the session's temporary directory with their CLI subprocesses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from augfl_jax.core import fields
from augfl_jax import models, training
from augfl_jax.training import loop
from tests import fake_pm, run_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = lambda s: None  # noqa: E731


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


# One-primitive programs that putting the data on the device compiles.
DATA_PLACEMENT = {"jit(stage)", "jit(convert_element_type)",
                  "jit(broadcast_in_dim)", "jit(iota)"}


@contextlib.contextmanager
def nothing_compiled():
  """Fails if JAX compiles any program inside but the data placement's."""
  seen = []
  def listener(name, secs, fun_name="", **kw):
    del secs, kw
    if name == "/jax/core/compile/backend_compile_duration":
      seen.append(fun_name)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert set(seen) <= DATA_PLACEMENT, f"compiled: {seen}"


def _cli_all(commands, env_home):
  """Runs ``python -m experiments.run`` with each argument list, two at a
  time; returns their CompletedProcess-like (returncode, stdout, stderr)."""
  env = {**os.environ, "XDG_CACHE_HOME": env_home}
  results = []
  for i in range(0, len(commands), 2):
    procs = [subprocess.Popen(
        [sys.executable, *(["-m", "experiments.run"] if args[0] != "-c"
                           else []), *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in commands[i:i + 2]]
    for p in procs:
      out, err = p.communicate(timeout=300)
      results.append((p.returncode, out, err))
  return results


def _config(**changes):
  """A ``RunConfig`` with dotted fields changed."""
  return fields.replace(training.RunConfig(), **changes)


def _restore(out, step):
  """``(state, meta)`` of checkpoint ``step``, as saved."""
  manager = ocp.CheckpointManager(
      os.path.abspath(os.path.join(out, "checkpoints")),
      item_names=("state", "meta"),
      options=ocp.CheckpointManagerOptions(step_prefix="step", create=False,
                                           read_only=True))
  item = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
  manager.close()
  return item["state"], item["meta"]


def _fake_pm(directory):
  """A PM checkpoint recorded as an mlp (the digits runs expect a cnn)."""
  mlp = models.create_model("mlp", 10, norm="batch")
  shapes = jax.eval_shape(
      lambda: models.init_params(mlp, jax.random.key(0), (8, 8, 1)))
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  fake_pm.save(directory, mlp, "mlp", params=params)


# ----------------------------------------------------------------------------
# Bad flags and output directories: before any compilation, one clear line.


@pytest.mark.parametrize("changes,kwargs,message", [
    ({"augfl.rho": 0.0}, {}, "rho must be > 0"),
    ({"augfl.alpha": 0.0}, {}, "alpha must be > 0"),
    ({"eval.alpha": 0.0}, {}, "eval.alpha must be > 0"),
    ({"data.M": 0}, {}, "data.M must be >= 1"),
    ({"data.num_clients": 500}, {}, "num_clients"),
    ({"dataset": "imagenet"}, {}, "unknown dataset 'imagenet'"),
    ({"algorithm": "sgd"}, {}, "unknown algorithm 'sgd'"),
    ({"augfl.lam": 5.0}, {}, "PM checkpoint at"),
    ({"clients_per_round": -1}, {}, "clients_per_round must be >= 0"),
    ({"clients_per_round": 33}, {}, "--clients_per_round=33 is more than "
     "the 32 training clients"),
    ({"crd.kd_weight": float("nan")}, {}, "crd.kd_weight must be a finite"),
    ({}, {"checkpoint_every": -1}, "--checkpoint_every must be >= 0"),
    ({}, {"resume": True}, "no checkpoint in"),
    ({}, {"resume": True, "overwrite": True}, "exclude each other"),
])
def test_bad_runs_fail_before_compiling(tmp_path, changes, kwargs, message):
  _fake_pm(tmp_path / "pm")
  with nothing_compiled(), pytest.raises(ValueError) as e:
    # A section's own checks (augfl.rho > 0) run as the config is built.
    config = _config(**{"augfl.lam": 0.0, "pm.dir": str(tmp_path / "pm"),
                        **changes})
    training.run(config, str(tmp_path / "out"), log=QUIET, **kwargs)
  assert message in str(e.value) and "\n" not in str(e.value)
  if message == "PM checkpoint at":  # both architectures and the way out
    assert "architecture=mlp(" in str(e.value)
    assert "architecture=cnn(" in str(e.value) and "--pm.dir" in str(e.value)
  assert not os.path.exists(tmp_path / "out")  # nothing written


@pytest.mark.slow
def test_an_existing_run_is_not_overwritten(tmp_path):
  out = str(tmp_path / "run")
  config = _config(rounds=2, eval_every=1, **{"augfl.lam": 0.0})
  training.run(config, out, log=QUIET, checkpoint_every=1)
  assert run_files.steps(out) == [1, 2]
  before = open(os.path.join(out, "metrics.jsonl")).read()
  summary = json.load(open(os.path.join(out, "summary.json")))
  with nothing_compiled():
    # The same run again, finished: its summary, and where it is.
    lines = []
    assert training.run(config, out, log=lines.append) == summary
    assert lines == [
        f"the run in {out} has done its 2 rounds: nothing to train; its "
        f"summary is {out}/summary.json (a larger --rounds with --resume "
        "continues it, --overwrite starts it again)"]
    # Without its summary it is not finished: it is resumed, not rerun.
    os.rename(os.path.join(out, "summary.json"), str(tmp_path / "kept"))
    with pytest.raises(ValueError, match="already holds this run") as e:
      training.run(config, out, log=QUIET)
    assert "--resume" in str(e.value) and "--overwrite" in str(e.value)
    os.rename(str(tmp_path / "kept"), os.path.join(out, "summary.json"))
    # Another number of rounds is another run.
    with pytest.raises(ValueError, match="holds a different run "
                       r"\(rounds: 2 -> 3\)"):
      training.run(fields.replace(config, rounds=3), out, log=QUIET)
    with pytest.raises(ValueError, match="holds a different run") as e:
      training.run(fields.replace(config, seed=1, **{"augfl.alpha": 0.1}),
                   out, log=QUIET)
    assert "seed: 0 -> 1" in str(e.value) and (
        "augfl.alpha: 0.03 -> 0.1") in str(e.value) and "--overwrite" in str(
            e.value)
  assert open(os.path.join(out, "metrics.jsonl")).read() == before
  # --overwrite replaces it: new config, new metrics, only new checkpoints
  # (checkpoint_every=0 saves at the end only).
  training.run(fields.replace(config, seed=1, rounds=1), out, log=QUIET,
               overwrite=True, checkpoint_every=0)
  assert json.load(open(os.path.join(out, "config.json")))["seed"] == 1
  assert [json.loads(l)["round"] for l in open(
      os.path.join(out, "metrics.jsonl"))] == [1]
  assert run_files.steps(out) == [1]
  assert _restore(out, 1)[1]["config"]["seed"] == 1


@pytest.mark.parametrize("overwrite", [False, True])
def test_files_the_tool_did_not_write_are_never_removed(tmp_path, overwrite):
  """A directory holding files of the names a run writes, which no manifest
  of this tool claims, or files of other names, is refused (even with
  --overwrite) and left as it is."""
  out = tmp_path / "mine"
  out.mkdir()
  (out / "metrics.jsonl").write_text("my notes\n")
  (out / "notes.txt").write_text("other\n")
  config = _config(rounds=1, **{"augfl.lam": 0.0})
  with nothing_compiled(), pytest.raises(
      training.OutputDirError, match="which augfl_jax did not write") as e:
    training.run(config, str(out), log=QUIET, overwrite=overwrite)
  assert "metrics.jsonl" in str(e.value) and "\n" not in str(e.value)
  assert sorted(os.listdir(out)) == [".augfl_jax.lock", "metrics.jsonl",
                                     "notes.txt"]
  assert (out / "metrics.jsonl").read_text() == "my notes\n"
  # Files of other names alone: refused too, nothing written beside them.
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("other\n")
  with pytest.raises(training.OutputDirError,
                     match="holds notes.txt, which augfl_jax did not write"):
    training.run(config, str(other), log=QUIET, overwrite=overwrite)
  assert sorted(os.listdir(other)) == [".augfl_jax.lock", "notes.txt"]


def test_a_second_run_into_a_directory_in_use_is_refused(tmp_path):
  out = str(tmp_path / "run")
  config = _config(rounds=1, **{"augfl.lam": 0.0})
  holder = training.outputs.OutputDir(out)
  holder.check_writable()
  with holder.lock():
    with nothing_compiled(), pytest.raises(training.OutputDirError,
                                           match="in use by another run"):
      training.run(config, out, log=QUIET)
  training.run(config, out, log=QUIET)  # the lock went with its holder


# ----------------------------------------------------------------------------
# Non-finite rounds.


def _nan_client(client):
  """``transform_data``: NaN in every support input of training client
  ``client``."""
  def transform(fed):
    support = dict(fed.train.support)
    support["x"] = support["x"].at[client].set(jnp.nan)
    return dataclasses.replace(fed, train=fed.train.replace(support=support))
  return transform


def test_nan_in_one_clients_data_stops_the_run_naming_it(tmp_path):
  config = _config(rounds=3, eval_every=1, **{"augfl.lam": 0.0})
  with pytest.raises(training.NonFiniteError) as e:
    training.run(config, str(tmp_path), log=QUIET, checkpoint_every=0,
                 transform_data=_nan_client(3))
  message = str(e.value)
  assert message.startswith("round 1: ")
  assert "client_loss of training client 3 (nan)" in message
  assert "rows of training client 3" in message  # theta_i, y_i of client 3
  # The last good state (round 0: the initial one) is saved and finite.
  assert run_files.steps(tmp_path) == [0]
  state, meta = _restore(tmp_path, 0)
  assert meta["round"] == 0
  assert all(np.isfinite(np.asarray(x)).all()
             for x in jax.tree.leaves(state)
             if np.issubdtype(np.asarray(x).dtype, np.inexact))


def test_nan_with_sampled_clients_names_the_client_id(tmp_path):
  config = _config(rounds=20, eval_every=1, clients_per_round=8,
                   **{"augfl.lam": 0.0})
  first = next(r for r in range(1, 21)
               if 5 in loop.sample_participants(0, r, 32, 8))
  assert first > 1, "pick a client that sits out round 1"
  with pytest.raises(training.NonFiniteError) as e:
    training.run(config, str(tmp_path), log=QUIET, checkpoint_every=0,
                 transform_data=_nan_client(5))
  assert str(e.value).startswith(f"round {first}: ")
  assert "client_loss of training client 5" in str(e.value)
  assert run_files.steps(tmp_path) == [first - 1]
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [r["round"] for r in records] == list(range(1, first))


def test_a_non_finite_evaluation_stops_the_run(tmp_path):
  """A NaN in a held-out client's data: training is finite, its
  evaluation is not; the run stops at the first evaluation with the state
  of that round saved, and writes no non-finite record."""
  def nan_test_client(fed):
    support = dict(fed.test.support)
    support["x"] = support["x"].at[0].set(jnp.nan)
    return dataclasses.replace(fed, test=fed.test.replace(support=support))
  config = _config(rounds=4, eval_every=2, **{"augfl.lam": 0.0})
  with pytest.raises(training.NonFiniteError) as e:
    training.run(config, str(tmp_path), log=QUIET, checkpoint_every=0,
                 transform_data=nan_test_client)
  message = str(e.value)
  assert message.startswith("round 2: non-finite evaluation of the "
                            "held-out clients (")
  assert "(round 2)" in message and "\n" not in message
  assert run_files.steps(tmp_path) == [2]
  assert open(tmp_path / "metrics.jsonl").read() == ""
  assert not (tmp_path / "summary.json").exists()



def test_a_resume_scores_again_the_round_an_evaluation_stopped(tmp_path):
  """An adaptation step so large that the held-out clients' scores
  overflow stops the run at its first evaluation; resumed with a smaller
  one (``--resume_changes``), it scores that round again, "(restored)",
  and trains on."""
  config = _config(rounds=4, eval_every=2,
                   **{"augfl.lam": 0.0, "eval.alpha": 1e30})
  with pytest.raises(training.NonFiniteError, match="^round 2: non-finite "
                     "evaluation of the held-out clients"):
    training.run(config, str(tmp_path), log=QUIET, checkpoint_every=0)
  lines = []
  training.run(fields.replace(config, **{"eval.alpha": 0.03}),
               str(tmp_path), log=lines.append, checkpoint_every=0,
               resume=True, resume_changes=("eval.alpha",))
  assert any(line.startswith("round    2/4  (restored)  accuracy ")
             for line in lines), lines
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [r["round"] for r in records] == [2, 4]
  # Round 2's training losses, kept by its checkpoint; no round trained.
  assert records[0]["mean_train_loss"] > 0 and "train" not in records[0]

_NAN_CLI = """
import dataclasses, functools
import jax.numpy as jnp
from augfl_jax import training
from experiments import cli, run
def nan3(fed):
  support = dict(fed.train.support)
  support["x"] = support["x"].at[3].set(jnp.nan)
  return dataclasses.replace(fed, train=fed.train.replace(support=support))
training.run = functools.partial(training.run, transform_data=nan3)
cli.main_runner(run.main)
"""


def test_a_pm_inside_the_run_directory_is_refused_before_its_pretraining(
    tmp_path):
  out = tmp_path / "out"
  config = _config(**{"augfl.lam": 5.0, "pm.model": "mlp",
                      "pm.dir": str(out / "pm")})
  with nothing_compiled(), pytest.raises(ValueError) as e:
    training.run(config, str(out), log=QUIET)
  assert str(e.value).startswith(f"--pm.dir {out / 'pm'} lies inside "
                                 f"--output_dir {out}")
  assert f"--pm.dir={tmp_path / 'pm'}" in str(e.value)  # beside the run
  assert not os.path.exists(out)  # nothing pretrained, nothing written
  # A run without a PM (lam = 0) never reads --pm.dir: it runs there.
  training.run(_config(**{"augfl.lam": 0.0, "pm.dir": str(out / "pm"),
                          "rounds": 1}), str(out), log=QUIET)


@pytest.mark.slow
def test_cli_failures_are_one_line_without_traceback(tmp_path, compile_cache):
  _fake_pm(tmp_path / "pm")
  out = lambda name: f"--output_dir={tmp_path / name}"
  cases = [
      (["--augfl.lam=5", f"--pm.dir={tmp_path / 'pm'}", out("a")],
       "PM checkpoint at"),
      (["-c", _NAN_CLI, "--augfl.lam=0", "--rounds=3", out("nan")],
       "round 1: non-finite client_loss of training client 3"),
  ]
  results = _cli_all([args for args, _ in cases], compile_cache)
  for (args, message), (code, stdout, stderr) in zip(cases, results):
    assert code == 2, (args, stderr)
    errors = [l for l in stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], (args, stderr)
    assert "Traceback" not in stderr
