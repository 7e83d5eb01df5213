"""experiments.run end to end on the embedded digits."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from augfl_jax.core import client_axis as clients, fields
from augfl_jax import models, training
from augfl_jax.training import defaults
from experiments import curves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("algorithm", [
    pytest.param("augfl", marks=pytest.mark.slow), "fedavg",
    pytest.param("per_fedavg", marks=pytest.mark.slow)])
def test_run_writes_its_files(tmp_path, algorithm):
  # AugFL runs with its PM (lam = 5 by default): pretrained into tmp_path.
  config = training.RunConfig(
      algorithm=algorithm, rounds=4, eval_every=2,
      pm=training.PMConfig(dir=str(tmp_path / "pm"), epochs=1))
  run_dir = tmp_path / "run"  # beside the PM's directory, not holding it
  summary = training.run(config, str(run_dir), log=lambda s: None)
  records = [json.loads(line)
             for line in open(run_dir / "metrics.jsonl").read().splitlines()]
  assert [r["round"] for r in records] == [2, 4]
  keys = {"round", "mean_train_loss", "accuracy", "accuracy_ci",
          "accuracy_std", "test_loss", "client_accuracy", "client_count",
          "clients_digest", "seconds", "train"}
  assert set(records[0]) == keys
  assert set(records[1]) == keys | {"test_split"}  # after the last round
  for r in records:
    assert 0.0 <= r["accuracy"] <= 1.0
    assert len(r["client_accuracy"]) == len(r["client_count"]) == 8
    assert np.isclose(np.std(r["client_accuracy"]), r["accuracy_std"],
                      atol=1e-6)
    low, high = r["accuracy_ci"]
    assert low <= r["accuracy"] <= high
    correct = np.rint(np.array(r["client_accuracy"]) * r["client_count"])
    assert np.isclose(correct.sum() / np.sum(r["client_count"]),
                      r["accuracy"], atol=1e-6)
  split = records[1]["test_split"]
  assert split["clients"] == len(split["client_correct"]) == len(
      split["client_count"]) == training.EvalConfig().test_clients
  assert np.isclose(np.sum(split["client_correct"]) /
                    np.sum(split["client_count"]), split["accuracy"])
  assert split["accuracy_ci"][0] <= split["accuracy"] <= split["accuracy_ci"][1]
  saved = json.load(open(run_dir / "summary.json"))
  assert saved["final_accuracy"] == summary["final_accuracy"] == records[-1]["accuracy"]
  assert saved["final_accuracy_ci"] == records[-1]["accuracy_ci"]
  assert saved["test_split"]["accuracy"] == split["accuracy"]
  assert saved["test_split"]["round"] == 4
  assert "left unused" in saved["test_split"]["source"]  # digits
  resolved = json.load(open(run_dir / "config.json"))
  assert resolved["model"] == "mlp" and resolved["data"]["num_clients"] == 40
  assert resolved["augfl"]["lam"] == 5.0 and resolved["eval"]["alpha"] == (
      0.03)
  # what ran, not "auto"
  assert resolved["strategy"] == clients.default_strategy().name
  assert resolved["conv_impl"] == models.default_conv_impl()
  assert "clients: 40" in open(run_dir / "partition.txt").read()
  # config.json says which sections the run read (the others hold values
  # it never used); it reads back as the same run, with or without that
  # list (a run of an older version), and curves leave the list out.
  assert resolved["read_sections"] == {
      "augfl": ["data", "pm", "crd", "eval", "augfl"],
      "fedavg": ["data", "eval", "fedavg"],
      "per_fedavg": ["data", "eval", "per_fedavg"]}[algorithm]
  assert set(resolved) - {"read_sections"} == set(fields.to_dict(
      training.validate(config)))
  lines = []
  assert training.run(config, str(run_dir), log=lines.append) == saved
  assert "nothing to train" in lines[-1]
  del resolved["read_sections"]
  with open(run_dir / "config.json", "w") as f:
    json.dump(resolved, f)
  assert training.run(config, str(run_dir), log=lambda s: None) == saved
  flat, _ = curves.load_run(str(run_dir))
  assert "read_sections" not in flat and flat["algorithm"] == algorithm


@pytest.mark.slow
def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path):
  run = lambda seed, name: training.run(
      fields.replace(training.RunConfig(rounds=3, eval_every=3, seed=seed),
                     **{"augfl.lam": 0.0}),
      str(tmp_path / name), log=lambda s: None)
  a, b, c = run(0, "a"), run(0, "b"), run(1, "c")
  metrics = lambda name: open(tmp_path / name / "metrics.jsonl").read()
  strip = lambda text: [{k: v for k, v in json.loads(l).items() if k != "seconds"}
                        for l in text.splitlines()]
  assert strip(metrics("a")) == strip(metrics("b"))
  assert a["final_accuracy"] == b["final_accuracy"]
  assert open(tmp_path / "a" / "partition.txt").read() != open(
      tmp_path / "c" / "partition.txt").read()


def test_auto_strategy_and_conv_impl_resolve_to_the_backend_choice():
  config = training.validate(training.RunConfig(model="cnn"))
  assert config.strategy == clients.default_strategy().name
  assert config.conv_impl == models.default_conv_impl()
  if jax.default_backend() == "cpu":
    assert (config.strategy, config.conv_impl) == ("map", "patches")
  explicit = training.validate(training.RunConfig(strategy="vmap",
                                                  conv_impl="xla"))
  assert (explicit.strategy, explicit.conv_impl) == ("vmap", "xla")
  assert training.validate(training.RunConfig(
      strategy="chunked", chunk_size=4)).strategy == "chunked"
  with pytest.raises(ValueError, match="unknown strategy 'pmap'"):
    training.validate(training.RunConfig(strategy="pmap"))
  # The client model and the PM get the run's conv_impl (conv models only).
  assert defaults.model_kwargs("cnn", "batch", conv_impl="xla") == {
      "norm": "batch", "conv_impl": "xla"}
  assert defaults.model_kwargs("resnet32x4", "batch", "", "patches")[
      "conv_impl"] == "patches"
  assert "conv_impl" not in defaults.model_kwargs("mlp", "batch")
  assert defaults.model_kwargs("logreg", "batch") == {}


def _run_cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.run", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--augfl.rho=0"], "--augfl.rho must be > 0, got 0.0"),
    (["--augfl.alpha=-1"], "--augfl.alpha must be > 0, got -1.0"),
    (["--eval.alpha=-1"], "--eval.alpha must be > 0"),
    (["--data.M=0"], "--data.M must be >= 1"),
    (["--dataset=imagenet"], "unknown --dataset 'imagenet'; choose one of "),
    (["--algorithm=sgd"], "unknown --algorithm 'sgd'; choose one of "),
    (["--algorithm=FedAvg"], "unknown --algorithm 'FedAvg'; did you mean "
     "fedavg? Choose one of "),
    (["--data.num_clients=500"], "num_clients"),
    (["--conv_impl=fft"], "unknown --conv_impl 'fft'; choose one of auto, "
     "xla, patches"),
    (["--rounds=1.5"], "flag --rounds=1.5"),
    (["--augfl.rho=abc"], "flag --augfl.rho=abc"),
    (["--lam=0"], "unknown flag --lam; it is now --augfl.lam"),
    (["extra"], "unexpected arguments: extra"),
])
def test_bad_flags_fail_with_one_clear_line(tmp_path, args, message):
  result = _run_cli(*args, f"--output_dir={tmp_path}")
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  assert message in lines[0] and not lines[0].startswith("error: '")
  assert not os.path.exists(tmp_path / "config.json")


@pytest.mark.slow
def test_cli_prints_progress_and_accuracy(tmp_path):
  result = _run_cli("--rounds=2", "--eval_every=1", "--augfl.lam=0",
                    "--pm.epochs=3", f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr
  assert "round    1/2" in result.stdout
  assert "test-client accuracy" in result.stdout
  assert os.path.exists(tmp_path / "summary.json")
  # lam 0: AugFL w/o PM, which reads no --pm.* flag.
  assert result.stderr.splitlines() == [
      "warning: ignored, as the run does not read them: --pm.epochs (the "
      "run has no PM)"]
  # The same command again: the run is done, and says where its summary is.
  again = _run_cli("--rounds=2", "--eval_every=1", "--augfl.lam=0",
                   "--pm.epochs=3", f"--output_dir={tmp_path}")
  assert again.returncode == 0, again.stderr
  assert again.stdout.strip().splitlines()[-1] == (
      f"the run in {tmp_path} has done its 2 rounds: nothing to train; its "
      f"summary is {tmp_path}/summary.json (a larger --rounds with --resume "
      "continues it, --overwrite starts it again)")


def _run_cli_inspected(*args, env=None):
  """``experiments.run`` in a subprocess that reports, after it exits,
  whether TensorFlow was imported and how many programs JAX compiled."""
  code = (
      "import sys, jax, jax.monitoring\n"
      "compiles = []\n"
      "jax.monitoring.register_event_duration_secs_listener(\n"
      "    lambda name, *a, **k: compiles.append(name) if 'compile' in name "
      "else None)\n"
      "from absl import app\n"
      "from experiments import run\n"
      f"sys.argv = ['run'] + {list(args)!r}\n"
      "try:\n"
      "  app.run(run.main)\n"
      "finally:\n"
      "  print('tensorflow' in sys.modules, len(compiles))\n")
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_missing_dataset_fails_fast_before_tensorflow_or_compiling(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "AUGFL_JAX_DATA_DIR"}
  env["TFDS_DATA_DIR"] = str(tmp_path / "tfds")
  env["XDG_CACHE_HOME"] = str(tmp_path / "no_user_data")
  for args, hint in (
      (["--dataset=emnist"], "emnist-letters-test-labels-idx1-ubyte"),
      (["--dataset=cifar10"], "--data.download fetches them"),
      (["--dataset=mnist", f"--data.data_dir={tmp_path}"],
       "--data.data_dir=DIR")):
    result = _run_cli_inspected(*args, f"--output_dir={tmp_path / 'out'}",
                                env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dataset"), lines
    assert hint in lines[0] and str(tmp_path / "tfds") in lines[0]
    assert result.stdout.split() == ["False", "0"]  # no TF, nothing compiled
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("damage", ["truncate", "mismatch", "label_range",
                                    "no_labels"])
def test_bad_data_gets_one_line_and_writes_nothing(tmp_path, damage):
  from tests import test_idx  # pylint: disable=g-import-not-at-top
  data_dir = tmp_path / "data"
  labels = {"mismatch": np.zeros(119, np.uint8),
            "label_range": np.full(120, 10, np.uint8)}.get(damage)
  test_idx.write_pair(data_dir, 120, labels=labels)
  images = data_dir / (test_idx.IMAGES + ".gz")
  if damage == "truncate":
    images.write_bytes(images.read_bytes()[:-200])
  if damage == "no_labels":
    os.remove(data_dir / (test_idx.LABELS + ".gz"))
  out = tmp_path / "out"
  result = _run_cli("--dataset=mnist", f"--data.data_dir={data_dir}",
                    "--algorithm=fedavg", "--data.server_size=20",
                    "--data.num_clients=4", "--data.M=5",
                    f"--output_dir={out}")
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:"), lines
  assert str(data_dir) in lines[0]
  assert not out.exists() or not os.listdir(out)
