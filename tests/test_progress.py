"""Time per step, time left, the one-time warning of a long loop, counts,
the live line of a terminal and a run's console lines."""

import io
import sys

import pytest

from augfl_jax import data, models
from augfl_jax.core import progress
from augfl_jax.pm import pretrain as pt


class FakeClock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def _loop(total, first, rest, steps):
  """A Progress after ``steps`` steps: the first takes ``first`` s (it
  compiles), each later one ``rest`` s."""
  clock = FakeClock()
  p = progress.Progress(total, clock=clock)
  for i in range(steps):
    clock.now += first if i == 0 else rest
    p.step()
  return p, clock


def test_rate_and_time_left_skip_the_first_step():
  p, _ = _loop(total=100, first=50.0, rest=2.0, steps=1)
  assert p.seconds_per_step is None and p.seconds_left is None
  assert p.describe("round") == "50.0 s so far"
  p, _ = _loop(total=100, first=50.0, rest=2.0, steps=4)
  assert p.seconds_per_step == pytest.approx(2.0)
  assert p.seconds_left == pytest.approx(2.0 * 96)
  assert p.describe("round") == "2 s/round, 3m12s left"


@pytest.mark.parametrize("seconds,text", [
    (0, "0s"), (59.9, "59s"), (61, "1m01s"), (3600, "1h00m"),
    (86400 + 3 * 3600 + 59, "1d03h"), (-5, "0s")])
def test_format_duration(seconds, text):
  assert progress.format_duration(seconds) == text


@pytest.mark.parametrize("n,text", [(0, "0 epochs"), (1, "1 epoch"),
                                    (2, "2 epochs")])
def test_counted(n, text):
  assert progress.counted(n, "epoch") == text


def test_a_long_loop_is_said_once_as_soon_as_estimated():
  p, clock = _loop(total=33840, first=60.0, rest=5.0, steps=1)
  assert p.long_estimate("step") is None  # no estimate before step 2
  clock.now += 5.0
  p.step()
  said = p.long_estimate("step")
  # 33838 steps left at 5 s: 169190 s = 1 day 22 h.
  assert said == ("an estimated 1d22h for the 33838 steps left (5 s/step, "
                  "timed after the first)")
  clock.now += 5.0
  p.step()
  assert p.long_estimate("step") is None  # said once


def test_a_short_loop_is_not_said_and_the_first_estimate_decides():
  p, clock = _loop(total=100, first=60.0, rest=5.0, steps=2)
  assert p.long_estimate("round") is None  # 490 s left
  clock.now += 10_000.0  # a slow step later: the progress lines show it
  p.step()
  assert p.long_estimate("round") is None
  assert p.long_estimate("round", threshold=1.0) is None
  p, _ = _loop(total=100, first=60.0, rest=5.0, steps=2)
  assert p.long_estimate("round", threshold=400.0).startswith(
      "an estimated 8m10s for the 98 rounds left")


@pytest.mark.parametrize("threshold,lines_said", [(0.0, 1), (None, 0)])
def test_pretraining_says_a_long_estimate_with_the_flags_that_shorten_it(
    monkeypatch, threshold, lines_said):
  if threshold is not None:  # every estimate is "long"
    monkeypatch.setattr(progress, "LONG_SECONDS", threshold)
  dataset = data.load_dataset("digits")
  idx, _ = data.server_split(dataset.num_examples, 400)
  server = {"x": dataset.x[idx], "y": dataset.y[idx]}
  lines = []
  pt.pretrain(models.create_model("mlp", 10, hidden=(32,)), server,
              pt.PretrainConfig(model="mlp", epochs=6), log=lines.append)
  said = [l for l in lines if l.startswith("pm pretraining will take long")]
  assert len(said) == lines_said, lines
  if said:  # at step 2: 6 epochs of 6 steps of 64 over the 360 trained on
    assert "for the 34 steps left" in said[0], said
    assert "--pm.model=cnn --pm.epochs=10" in said[0]
    assert lines.index(said[0]) == 0  # before the first epoch's line


def test_the_rate_leaves_out_a_one_time_cost_after_the_first_step():
  """Rounds of 1 s after a 50 s first one; after round 10 an evaluation
  compiles for 30 s (its time lands in round 11's): neither counts in
  the rate, whether or not the caller marks it, nor does the time since
  the last step (an evaluation in progress)."""
  for marked in (False, True):
    p, clock = _loop(total=100, first=50.0, rest=1.0, steps=10)
    clock.now += 30.0 + 1.0
    if marked:
      p.step(timed=False)
    else:
      p.step()
    for _ in range(4):
      clock.now += 1.0
      p.step()
    clock.now += 12.0  # the next evaluation, while the line is written
    assert p.seconds_per_step == pytest.approx(1.0)
    assert p.describe("round") == "1 s/round, 1m25s left"
  p, clock = _loop(total=100, first=50.0, rest=1.0, steps=1)
  clock.now += 30.0
  p.step(timed=False)  # the only later step was marked: no rate yet
  assert p.seconds_per_step is None


@pytest.mark.parametrize("items,text", [
    ([3], "3"), ([3, 7], "3 and 7"), ([3, 7, 12, 20], "3, 7, 12 and 20"),
    (list(range(32)), "0, 1, 2 and 29 others")])
def test_some(items, text):
  assert progress.some(items) == text


def test_a_live_line_on_a_terminal_keeps_printed_lines_above_it():
  rich_console = pytest.importorskip("rich.console")
  out = io.StringIO()
  console = rich_console.Console(file=out, force_terminal=True, width=100,
                                 color_system=None)
  with progress.LiveLine(True, console=console) as live:
    live.update(0.25, "round 25/100  loss 0.5000")
    print("a plain line")
    live.update(0.5, "round 50/100  loss 0.2500")
  text = out.getvalue()
  assert "━" * 5 + "━" * 15 + "  25%  round 25/100  loss 0.5000" in text
  assert " 50%  round 50/100  loss 0.2500" in text
  assert "a plain line\n" in text
  assert "\x1b[" in text  # redrawn in place
  with progress.LiveLine(False) as live:  # a log file or a pipe: nothing
    live.update(0.5, "not shown")


def test_the_live_line_is_the_terminal_s_when_log_is_print(monkeypatch):
  from augfl_jax.training import loop  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
  assert loop.shows_live_line(print, None)
  assert not loop.shows_live_line(lambda line: None, None)
  assert loop.shows_live_line(lambda line: None, True)
  assert not loop.shows_live_line(print, False)
  monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
  assert not loop.shows_live_line(print, None)


def test_an_accuracy_without_an_interval_is_not_labelled_with_one():
  from augfl_jax.core import intervals  # pylint: disable=g-import-not-at-top
  from augfl_jax.training import scoring  # pylint: disable=g-import-not-at-top
  one = {"accuracy": 0.875, "accuracy_ci": [None, None],
         "client_accuracy": [0.875]}
  assert scoring.format_record(one) == "87.50 (1 client, no interval)"
  assert scoring.format_record({**one, "accuracy_ci": [0.8, 0.95],
                                "client_accuracy": [0.8, 0.95]}) == (
                                    "87.50 [80.00, 95.00] (95% CI across 2 "
                                    "clients)")
  assert scoring.accuracy_text(intervals.mean_interval([0.5])) == (
      "50.00 (1 client, no interval)")
  assert scoring.accuracy_text(intervals.mean_interval([0.4, 0.6])) == (
      "50.00 [-77.06, 177.06]")


@pytest.mark.slow
def test_a_runs_console_lines_are_short_and_say_what_they_cannot_compute(
    tmp_path, monkeypatch, compile_cache):
  """A round's line fits 100 columns (the test split on a line of its
  own), one held-out client gets no interval and is not labelled with
  one, and the live line shows every round while the log keeps the
  evaluations' lines (without it, here, a line would be due every
  round)."""
  from augfl_jax import training  # pylint: disable=g-import-not-at-top
  from augfl_jax.core import fields  # pylint: disable=g-import-not-at-top
  from augfl_jax.training import rounds  # pylint: disable=g-import-not-at-top
  del compile_cache
  updates = []

  class Recorded(progress.LiveLine):
    def update(self, fraction, text):
      assert self.enabled
      updates.append((fraction, text))

  monkeypatch.setattr(rounds, "LiveLine", Recorded)
  monkeypatch.setattr(rounds, "LOG_SECONDS", 0.0)
  config = fields.replace(training.RunConfig(rounds=4, eval_every=2), **{
      "augfl.lam": 0.0, "data.num_clients": 3, "eval.test_clients": 20})
  lines = []
  training.run(config, str(tmp_path / "run"), log=lines.append, live=True)
  said = [l for l in lines if l.startswith("round ")]
  assert all(len(l) <= 100 for l in said), said
  assert not any("95% CI across 1 client" in l for l in lines), lines
  assert ("accuracy: the held-out client's test-client accuracy (%); 1 "
          "client, no interval") in lines
  evaluations = [l for l in said if " loss " in l and " accuracy " in l]
  assert [l[:12] for l in evaluations] == ["round    2/4", "round    4/4"]
  assert all(l.split(" accuracy ")[1].split("  ")[0].endswith(
      " (1 client, no interval)") for l in evaluations), evaluations
  assert said[-1].startswith("round    4/4  test-split accuracy ")
  assert " across 20 clients (" in said[-1]
  assert sorted({int(l[6:10]) for l in said}) == [1, 2, 4]
  assert [f for f, _ in updates] == [0.25, 0.5, 0.75, 1.0]
  assert updates[2][1].startswith("round    3/4  loss ")
