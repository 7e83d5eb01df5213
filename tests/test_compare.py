"""experiments.compare: two configurations, seed by seed, on the same
clients; a run's directory or a directory of seeds; its output checked
before any work."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from augfl_jax.commands import output_files
from augfl_jax.core import intervals
from experiments import compare
from tests.test_scores import _t_interval, _write_run

CHEAP = {0: [18, 17, 19, 15, 20], 1: [16, 18, 19, 17, 18]}
FULL = {0: [17, 17, 18, 16, 19], 1: [16, 17, 20, 15, 18]}


def _runs(tmp_path):
  for name, correct in (("cheap", CHEAP), ("full", FULL)):
    for seed, c in correct.items():
      _write_run(tmp_path / name / f"seed{seed}", [9, 8, 10, 7], c,
                 seed=seed)
  return {"cheap": str(tmp_path / "cheap"), "full": str(tmp_path / "full")}


def test_the_table_holds_the_paired_differences(tmp_path):
  text = compare.compare(_runs(tmp_path), [0, 1])
  assert "Scored on test-split clients" in text
  # seed 0: 89/100 against 87/100, the difference's interval across the
  # five clients (equal counts: the t-interval of per-client differences)
  diff0 = np.subtract(CHEAP[0], FULL[0]) / 20
  low, high = _t_interval(diff0)
  assert (f"| 0 | 89.00 [" in text and
          f"2.00 [{100 * low:.2f}, {100 * high:.2f}]" in text)
  # over seeds: the t-interval of the two per-seed differences
  per_seed = [(sum(CHEAP[s]) - sum(FULL[s])) / 100 for s in (0, 1)]
  low, high = _t_interval(per_seed)
  assert f"{100 * np.mean(per_seed):.2f} [{100 * low:.2f}, {100 * high:.2f}]" in text
  assert intervals.mean_interval(per_seed).format() in text


def test_fewer_than_three_seeds_are_said_to_give_no_useful_interval(
    tmp_path):
  """2 seeds: the t-interval across seeds (1 degree of freedom) with a
  line saying that one needs 3 seeds; 1 seed: no interval across seeds,
  said so; 3 seeds: no such line."""
  runs = _runs(tmp_path)
  two = compare.compare(runs, [0, 1]).splitlines()
  assert two[-5].startswith("| mean of 2 | ") and "[" in two[-5]  # shown
  assert two[-3] == (
      "An interval across seeds needs at least 3 seeds (--seeds=0,1,2): with "
      "2 seeds it is a t-interval with 1 degree of freedom, ± 12.71 standard "
      "errors (± 4.30 with 3 seeds).")
  one = compare.compare(runs, [0]).splitlines()
  assert one[-5] == "| mean of 1 | 89.00 | 87.00 | 2.00 |"  # no interval
  assert one[-3] == (
      "An interval across seeds needs at least 3 seeds (--seeds=0,1,2): with "
      "1 seed there is none (each run has its own, across its clients).")
  for name in ("cheap", "full"):
    _write_run(tmp_path / name / "seed2", [9, 8, 10, 7], [15, 16, 17, 18, 19],
               seed=2)
  assert "An interval across seeds" not in compare.compare(runs, [0, 1, 2])


def test_the_held_out_clients_on_request(tmp_path):
  """--clients=held_out pairs the protocol's held-out clients even where
  the runs have test-split clients; test_split is refused of a run
  without them."""
  heldout = {"a": [9, 8, 10, 7], "b": [7, 8, 9, 6]}
  for name, correct in heldout.items():
    _write_run(tmp_path / name / "seed0", correct, CHEAP[0])
  runs = {name: str(tmp_path / name) for name in heldout}
  text = compare.compare(runs, [0], "held_out")
  assert "Scored on the protocol's held-out clients" in text
  diff = np.subtract(heldout["a"], heldout["b"]) / 10
  low, high = _t_interval(diff)
  assert (f"| 0 | 85.00 [" in text and "| 75.00 [" in text and
          f"10.00 [{100 * low:.2f}, {100 * high:.2f}]" in text)
  # auto: the test-split clients, identical here
  assert "| 0 | 89.00 [" in compare.compare(runs, [0])
  _write_run(tmp_path / "c" / "seed0", heldout["a"], None)
  runs["c"] = str(tmp_path / "c")
  with pytest.raises(ValueError, match="no test-split clients"):
    compare.compare(runs, [0], "test_split")
  with pytest.raises(ValueError, match="clients must be one of"):
    compare.compare(runs, [0], "train")


def test_bad_input_stops_with_one_line(tmp_path):
  with pytest.raises(ValueError, match="NAME=DIR"):
    compare.parse_runs(["nodir"])
  with pytest.raises(ValueError, match="at least two"):
    compare.parse_runs(["a=x"])
  runs = _runs(tmp_path)
  with pytest.raises(ValueError, match="no finished run"):
    compare.compare(runs, [0, 7])


@pytest.mark.slow
def test_the_command_stops_with_one_line_and_exit_2(tmp_path):
  runs = _runs(tmp_path)
  result = subprocess.run(
      [sys.executable, "-m", "experiments.compare", f"--runs=a={runs['cheap']}",
       f"--runs=b={tmp_path}/missing", "--seeds=0"],
      capture_output=True, text=True)
  assert result.returncode == 2
  assert result.stderr.strip().startswith("error:")
  assert len(result.stderr.strip().splitlines()) == 1


def _one_run(path, seed, correct=CHEAP[0]):
  """A finished run's directory as experiments.run writes it (no seed<s>
  below it), its seed in its config.json."""
  return _write_run(path, [9, 8, 10, 7], correct, seed=seed)


def test_a_run_directory_is_the_run_of_its_seed(tmp_path):
  """``--runs=NAME=DIR`` takes the directory experiments.run writes as well
  as a directory of seeds; its seed is its config.json's."""
  a = _one_run(tmp_path / "fashion_mnist_augfl_seed1", 1, CHEAP[1])
  b = _one_run(tmp_path / "fashion_mnist_fedavg_seed1", 1, FULL[1])
  text = compare.compare({"a": a, "b": b})
  assert "| 1 | 88.00 [" in text and "| 86.00 [" in text
  assert "| mean of 1 |" in text and f"a = {a}; b = {b}" in text
  assert "| 1 |" in compare.compare({"a": a, "b": b}, [1])
  seeds = _runs(tmp_path / "seeds")  # beside a directory of seeds
  text = compare.compare({"a": a, "full": seeds["full"]})
  assert "| 1 | 88.00 [" in text and f"full = {seeds['full']}/seed<s>" in text


def test_a_run_directory_of_another_seed_is_one_line(tmp_path):
  a = _one_run(tmp_path / "a", 0)
  b = _one_run(tmp_path / "b", 1)
  seeds = _runs(tmp_path / "seeds")
  cases = [
      (({"a": a, "cheap": seeds["cheap"]}, [1]), "a run of seed 0 alone"),
      (({"a": a, "cheap": seeds["cheap"]}, [0, 1]), "--seeds=0,1; pass "
       "--seeds=0"),
      (({"a": a, "b": b}, None), "run directories of seeds 0, 1"),
  ]
  for (runs, chosen), message in cases:
    with pytest.raises(ValueError, match=message) as e:
      compare.compare(runs, chosen)
    assert "\n" not in str(e.value)
  os.remove(os.path.join(b, "summary.json"))
  with pytest.raises(ValueError, match="has not finished"):
    compare.compare({"a": a, "b": b})
  os.remove(os.path.join(a, "config.json"))
  with pytest.raises(ValueError, match=os.path.join(a, "config.json")):
    compare.compare({"a": a, "cheap": seeds["cheap"]})
  with pytest.raises(ValueError, match="directory of seeds"):
    compare.compare({"cheap": seeds["cheap"], "x": str(tmp_path / "x")})


def test_seeds_are_integers_each_named_once():
  assert compare.parse_seeds(None) is None
  assert compare.parse_seeds(["2", "0"]) == [2, 0]
  with pytest.raises(ValueError, match="0 named twice"):
    compare.parse_seeds(["0", "0", "1"])
  with pytest.raises(ValueError, match="takes integers"):
    compare.parse_seeds(["a"])


def test_the_output_file_is_checked_before_any_work(tmp_path):
  (tmp_path / "file").write_text("x")
  for output, message in [
      (tmp_path, "is a directory"),
      (tmp_path / "missing" / "x.md", "does not exist: create it"),
      (tmp_path / "file" / "x.md", "is not a directory"),
      ("/proc/x.md", "a file cannot be created in /proc")]:
    with pytest.raises(ValueError, match=message):
      output_files.check_output_file(str(output))
  output_files.check_output_file(str(tmp_path / "x.md"))
  output_files.check_output_file(str(tmp_path / "file"))  # replaced
  assert os.listdir(tmp_path) == ["file"]


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.compare", *args],
                        capture_output=True, text=True, check=False,
                        timeout=120)


@pytest.mark.slow
def test_the_command_helps_and_fails_in_one_line_before_any_work(tmp_path):
  """--help: the command's docstring and flags, exit 0; a bad flag or
  --output: one line, exit 2, nothing printed before it."""
  result = _cli("--help")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("Two configurations compared")
  assert "the flags of python -m experiments.compare:" in result.stdout
  a = _one_run(tmp_path / "a", 0)
  b = _one_run(tmp_path / "b", 0, FULL[0])
  out = tmp_path / "table.md"
  result = _cli(f"--runs=a={a}", f"--runs=b={b}", f"--output={out}")
  assert result.returncode == 0, result.stderr
  assert "| 0 | 89.00 [" in result.stdout
  assert out.read_text() == result.stdout
  for args, message in [
      ((f"--output={tmp_path}/missing/x.md",), "does not exist"),
      ((f"--output={tmp_path}",), "is a directory"),
      (("--seeds=0,0",), "named twice"),
      (("--seeds=1",), "a run of seed 0 alone"),
      (("--clients=train",), "--clients"),
      (("--nosuch",), "nosuch")]:
    result = _cli(f"--runs=a={a}", f"--runs=b={b}", *args)
    assert result.returncode == 2, (args, result.stderr)
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and not result.stdout
  assert sorted(os.listdir(tmp_path)) == ["a", "b", "table.md"]


def _write_rounds(path, heldout_by_round, test_by_round, seed,
                  counts=(10, 10, 10, 10), test_counts=(20, 20, 20, 20, 20)):
  """A finished run evaluated at each round of ``heldout_by_round`` (round
  -> held-out correct per client), its test-split clients scored at the
  rounds of ``test_by_round``, sealed as a run seals them."""
  from augfl_jax.training import checkpoints  # pylint: disable=g-import-not-at-top
  os.makedirs(path)
  records = []
  for t, correct in sorted(heldout_by_round.items()):
    record = {"round": t, "accuracy": sum(correct) / sum(counts),
              "client_accuracy": [c / n for c, n in zip(correct, counts)],
              "client_count": list(counts)}
    if t in test_by_round:
      record["test_split"] = {"client_correct": list(test_by_round[t]),
                              "client_count": list(test_counts)}
    records.append(record)
  config = {"algorithm": "augfl", "dataset": "digits", "seed": seed}
  last = records[-1]["round"]
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  with open(os.path.join(path, "summary.json"), "w") as f:
    json.dump({"rounds": last, "final_accuracy": records[-1]["accuracy"],
               "best_accuracy": max(r["accuracy"] for r in records),
               "seconds": 3.0}, f)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  manager = checkpoints.RunCheckpoints(os.path.join(path, "checkpoints"))
  manager.save(last, {"w": np.zeros(1)}, {"round": last, "config": config,
                                          "records": records, "changes": []})
  manager.close()


# held-out correct per round (4 clients of 10), test-split correct at
# round 2 (5 clients of 20), per method and seed
_HELD = {("a", s): {1: [5, 5, 5, 5], 2: [9, 8, 9, 7], 3: [9, 9, 9, 9]}
         for s in (0, 1, 2)}
_HELD.update({("b", s): {1: [5, 6, 4, 5], 2: [6 - s, 5, 6, 5],
                         3: [9, 9, 9, 8 + (s == 1)]} for s in (0, 1, 2)})
_TEST = {("a", s): {2: [18, 17, 19, 15, 20]} for s in (0, 1, 2)}
_TEST.update({("b", s): {2: [14, 17, 15, 12 + s, 19]} for s in (0, 1, 2)})


def _round_runs(tmp_path):
  for (name, seed), held in _HELD.items():
    _write_rounds(tmp_path / name / f"seed{seed}", held, _TEST[name, seed],
                  seed)
  return {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}


def test_a_round_of_longer_runs_is_compared_on_its_clients(tmp_path):
  runs = _round_runs(tmp_path)
  text = compare.compare(runs, [0, 1, 2], round_=2)
  assert "Scored on test-split clients after round 2" in text
  per_seed = [(sum(_TEST["a", s][2]) - sum(_TEST["b", s][2])) / 100
              for s in (0, 1, 2)]
  assert intervals.mean_interval(per_seed).format() in text
  # the last round has no test-split scores: the held-out clients'
  last = compare.compare(runs, [0, 1, 2])
  assert "Scored on the protocol's held-out clients;" in last
  with pytest.raises(ValueError, match="--round=4: .* has no evaluation of "
                     "round 4 .*rounds 1, 2, 3"):
    compare.compare(runs, [0, 1, 2], round_=4)


def test_by_round_gives_each_rounds_paired_difference_and_when_it_leaves_0(
    tmp_path):
  text, curves = compare.by_round(_round_runs(tmp_path), [0, 1, 2])
  rounds, diffs = curves["a - b (held-out clients)"]
  assert rounds == [1, 2, 3]
  for t, d in zip(rounds, diffs):
    per_seed = [(sum(_HELD["a", s][t]) - sum(_HELD["b", s][t])) / 40
                for s in (0, 1, 2)]
    expected = intervals.mean_interval(per_seed)
    assert (d.mean, d.low, d.high) == pytest.approx(
        (expected.mean, expected.low, expected.high))
  assert diffs[0].low <= 0 <= diffs[0].high and diffs[1].low > 0
  assert ("The interval first leaves 0 at round 2 (above it); it does not "
          "stay there at every later round.") in text
  assert curves["a - b (test-split clients)"][0] == [2]
  assert "| 2 | " in text.split("### a - b (test-split clients)")[1]
  figure = tmp_path / "by_round.png"
  compare.plot_by_round(curves, str(figure))
  assert figure.read_bytes()[:4] == b"\x89PNG"
