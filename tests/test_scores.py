"""experiments.scores: a comparison's figures against direct computations."""

import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from augfl_jax.training import checkpoints
from experiments import scores


def _write_run(path, heldout_correct, test_correct, counts=(10, 10, 10, 10),
               test_counts=(20, 20, 20, 20, 20), seed=0, algorithm="augfl"):
  """A finished 5-round run's files, as a run writes them: its last
  record in metrics.jsonl, its summary and config.json, and its newest
  checkpoint, which seals them."""
  os.makedirs(path)
  record = {"round": 5, "accuracy": sum(heldout_correct) / sum(counts),
            "client_accuracy": [c / n for c, n in zip(heldout_correct,
                                                      counts)],
            "client_count": list(counts)}
  if test_correct is not None:
    record["test_split"] = {"client_correct": list(test_correct),
                            "client_count": list(test_counts)}
  config = {"algorithm": algorithm, "dataset": "digits", "seed": seed}
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.write(json.dumps(record) + "\n")
  with open(os.path.join(path, "summary.json"), "w") as f:
    json.dump({"rounds": 5, "final_accuracy": record["accuracy"],
               "best_accuracy": record["accuracy"], "seconds": 3.0}, f)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  manager = checkpoints.RunCheckpoints(os.path.join(path, "checkpoints"))
  manager.save(5, {"w": np.zeros(1)}, {"round": 5, "config": config,
                                       "records": [record], "changes": []})
  manager.close()
  return str(path)


def _t_interval(values):
  values = np.asarray(values, float)
  half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(
      len(values))
  return values.mean() - half, values.mean() + half


def test_run_scores_and_paired_differences(tmp_path):
  runs = []
  test = {("augfl", 0): [18, 17, 19, 15, 20], ("augfl", 1): [16, 18, 19, 17, 18],
          ("fedavg", 0): [14, 17, 15, 12, 19], ("fedavg", 1): [15, 12, 18, 16, 17]}
  for (method, seed), correct in test.items():
    runs.append(scores.load_run_score(
        _write_run(tmp_path / f"{method}{seed}", [9, 8, 10, 7], correct),
        method, seed))
  assert scores.uses_test_split(runs)
  # One run: equal query sizes make its interval the t-interval of the
  # clients' accuracies.
  one = runs[0].test_split.interval
  assert one.mean == pytest.approx(np.mean(test["augfl", 0]) / 20)
  assert (one.low, one.high) == pytest.approx(
      np.clip(_t_interval(np.array(test["augfl", 0]) / 20), 0, 1))
  # A method over seeds: the t-interval of its seeds' accuracies.
  fedavg = scores.across_seeds(runs, "fedavg", True)
  means = [np.mean(test["fedavg", s]) / 20 for s in (0, 1)]
  assert fedavg.mean == pytest.approx(np.mean(means))
  assert (fedavg.low, fedavg.high) == pytest.approx(
      np.clip(_t_interval(means), 0, 1))
  # Paired: per seed, the t-interval of the per-client differences; over
  # seeds, the t-interval of the per-seed differences.
  per_seed, overall = scores.paired(runs, "fedavg", "augfl", True)
  for seed in (0, 1):
    diff = (np.array(test["fedavg", seed]) -
            np.array(test["augfl", seed])) / 20
    assert per_seed[seed].mean == pytest.approx(diff.mean())
    assert (per_seed[seed].low, per_seed[seed].high) == pytest.approx(
        _t_interval(diff))
  assert overall.mean == pytest.approx(np.mean(
      [per_seed[0].mean, per_seed[1].mean]))
  assert (overall.low, overall.high) == pytest.approx(
      _t_interval([per_seed[0].mean, per_seed[1].mean]))
  # The held-out clients are read too.
  assert runs[0].heldout.interval.mean == pytest.approx(34 / 40)


def test_without_test_split_the_heldout_clients_are_the_headline(tmp_path):
  runs = [scores.load_run_score(_write_run(tmp_path / "a", [9, 8, 10, 7],
                                           None), "augfl", 0)]
  assert not scores.uses_test_split(runs)
  assert scores.across_seeds(runs, "augfl", False).mean == pytest.approx(
      34 / 40)


def test_runs_on_other_clients_are_not_paired(tmp_path):
  a = scores.load_run_score(_write_run(tmp_path / "a", [9, 8, 10, 7],
                                       [1, 2, 3, 4, 5]), "augfl", 0)
  b = scores.load_run_score(_write_run(
      tmp_path / "b", [9, 8, 10, 7], [1, 2, 3, 4, 5],
      test_counts=(20, 20, 20, 20, 21)), "fedavg", 0)
  with pytest.raises(ValueError, match="not scored on the same clients"):
    b.test_split.minus(a.test_split)


def test_a_run_of_an_older_version_is_named(tmp_path):
  """Its sealed records hold no per-client query sizes."""
  path = _write_run(tmp_path / "old", [9, 8, 10, 7], None)
  manager = checkpoints.RunCheckpoints(os.path.join(path, "checkpoints"))
  meta = manager.read_meta(5)
  manager.save(6, {"w": np.zeros(1)}, {**meta, "round": 6,
                                       "records": [{"round": 6}]})
  manager.close()
  with pytest.raises(ValueError, match="older version"):
    scores.load_run_score(path, "augfl", 0)
