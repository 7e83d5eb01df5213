"""Where a run's wall time goes: ``training.phases`` and ``summary.json``'s
``phase_seconds``, which sum to the run's wall time, a resumed run's
carried from its checkpoint."""

from __future__ import annotations

import json
import os
import time

import pytest

from augfl_jax import training
from augfl_jax.core import fields
from augfl_jax.training import checkpoints, phases

pytestmark = pytest.mark.usefixtures("compile_cache")
QUIET = lambda line: None  # noqa: E731


def test_each_second_goes_to_the_innermost_phase_and_setup_gets_the_rest():
  now = [0.0]
  clock = lambda: now[0]  # noqa: E731
  p = phases.Phases(clock=clock)
  now[0] = 1.0  # setup
  with p.timed("rounds"):
    now[0] += 2.0
    with p.timed("checkpoints"):
      now[0] += 3.0
      # A block still open counts as if it closed now.
      assert p.seconds() == {"setup": 1.0, "rounds": 2.0, "checkpoints": 3.0}
    now[0] += 4.0
  with pytest.raises(RuntimeError):
    with p.timed("first_heldout_eval"):  # counted when it raises too
      now[0] += 0.5
      raise RuntimeError
  now[0] += 1.0  # setup again (the summary)
  assert p.seconds() == {"setup": 2.0, "rounds": 6.0,
                         "first_heldout_eval": 0.5, "checkpoints": 3.0}
  assert sum(p.seconds().values()) == now[0]  # the wall time
  p.carry({"rounds": 10.0, "unattributed": 7.0})  # the sessions before
  assert p.seconds() == {"setup": 2.0, "rounds": 16.0,
                         "first_heldout_eval": 0.5, "checkpoints": 3.0,
                         "unattributed": 7.0}
  assert phases.ordered(["checkpoints", "mine_eval", "setup"]) == [
      "setup", "mine_eval", "checkpoints"]


def _run(run_dir, rounds, **kwargs):
  """``(summary, wall time)`` of a FedAvg run on digits, evaluated every
  round (the held-out clients) and after the last (the test-split
  clients), a checkpoint every round."""
  start = time.perf_counter()
  summary = training.run(training.RunConfig(
      algorithm="fedavg", rounds=rounds, eval_every=1), run_dir, log=QUIET,
                         checkpoint_every=1, **kwargs)
  return summary, time.perf_counter() - start


def _meta(run_dir, step):
  manager = checkpoints.RunCheckpoints(os.path.join(run_dir, "checkpoints"))
  try:
    return manager.read_meta(step)
  finally:
    manager.close()


def test_a_runs_phases_sum_to_its_wall_time_and_a_resume_adds_its_own(
    tmp_path):
  run_dir = str(tmp_path / "run")
  summary, wall = _run(run_dir, 3)
  spent = summary["phase_seconds"]
  assert set(spent) == {"setup", "first_round", "rounds",
                        "first_heldout_eval", "heldout_eval",
                        "first_test_split_eval", "checkpoints"}
  assert all(s >= 0 for s in spent.values())
  assert summary["wall_seconds"] == pytest.approx(sum(spent.values()),
                                                  abs=0.01)
  # From the call to the summary: all but the lock's release after it.
  assert 0 <= wall - summary["wall_seconds"] < 0.5
  # The first round's time, its compilation included, is first_round's.
  assert spent["first_round"] >= summary["first_round_seconds"]
  # The rounds' own time (from the first round's start) is a part of it.
  assert summary["seconds"] < summary["wall_seconds"]
  assert json.load(open(os.path.join(run_dir, "summary.json")))[
      "phase_seconds"] == spent
  # Each checkpoint records the phases until its save.
  sealed = _meta(run_dir, 3)["phase_seconds"]
  assert sum(sealed.values()) < summary["wall_seconds"]
  # A resumed run: the checkpoint's phases and this session's, which has
  # its own setup, restore and first round (compiling again).
  resumed, wall = _run(run_dir, 5, resume=True)
  again = resumed["phase_seconds"]
  assert resumed["wall_seconds"] == pytest.approx(
      sum(sealed.values()) + wall, abs=0.5)
  assert all(again[n] >= sealed[n] for n in sealed)
  assert again["first_round"] > sealed["first_round"]
  assert again["setup"] > sealed["setup"]


def test_a_checkpoint_without_phases_is_carried_as_unattributed(
    tmp_path, monkeypatch):
  """A run resumed from a checkpoint of a version that did not record
  phases carries that checkpoint's seconds as ``unattributed``."""
  run_dir = str(tmp_path / "run")
  save = checkpoints.RunCheckpoints.save

  def older(self, step, state, meta):
    return save(self, step, state, {k: v for k, v in meta.items()
                                    if k != "phase_seconds"})
  with monkeypatch.context() as m:
    m.setattr(checkpoints.RunCheckpoints, "save", older)
    _run(run_dir, 2)
  meta = _meta(run_dir, 2)
  assert "phase_seconds" not in meta
  resumed, wall = _run(run_dir, 3, resume=True)
  spent = resumed["phase_seconds"]
  assert spent["unattributed"] == pytest.approx(meta["seconds"], abs=1e-3)
  assert resumed["wall_seconds"] == pytest.approx(meta["seconds"] + wall,
                                                  abs=0.5)


@pytest.mark.slow
def test_a_run_with_a_pm_times_it(tmp_path):
  """The PM's pretraining is the run's ``pm`` phase (a run without one
  has none)."""
  config = fields.replace(training.RunConfig(
      dataset="synthetic", algorithm="fedlp", rounds=1,
      pm=training.PMConfig(epochs=1, dir=str(tmp_path / "pm"))),
      **{"data.num_clients": 10})
  summary = training.run(config, str(tmp_path / "run"), log=QUIET)
  assert summary["phase_seconds"]["pm"] > 0
  assert summary["wall_seconds"] == pytest.approx(
      sum(summary["phase_seconds"].values()), abs=0.01)
  summary, _ = _run(str(tmp_path / "fedavg"), 1)
  assert "pm" not in summary["phase_seconds"]
