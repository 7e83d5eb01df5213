"""Time per step, time left, the one-time warning of a long loop, counts."""

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
