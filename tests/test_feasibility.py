"""Values the machine or the model cannot take are one line before anything
is loaded: integers beyond 32 bits, evaluations of a billion steps, batch
sizes and negatives whose memory exceeds the machine's, PM arguments that
do not build the PM.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from augfl_jax.core import fields
from augfl_jax import training
from augfl_jax.training import experiment, limits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 10 ** 9

# The cases of the replay: flags, and the start of the one line they give.
CASES = [
    (["--crd.nce_k=100000000"], "--crd.nce_k=100000000 needs at least "),
    (["--algorithm=fedavg", "--fedavg.batch_size=1000000000"],
     "--fedavg.batch_size=1000000000 needs at least "),
    (["--crd.batch_size=1000000000"], "--crd.batch_size=1000000000 needs "),
    (["--pm.batch_size=1000000000"], "--pm.batch_size=1000000000 needs "),
    (["--eval.test_clients=1000000000"], "--eval.test_clients=1000000000 "
     "with --data.M=20 needs at least "),
    (["--pm.kwargs={\"bogus_arg\": 1}"],
     "--pm.kwargs={\"bogus_arg\": 1} does not build a cnn PM (TypeError"),
    (["--pm.kwargs={\"hidden\": \"abc\"}", "--pm.model=mlp"],
     "--pm.kwargs={\"hidden\": \"abc\"} does not build a mlp PM ("),
    (["--rounds=99999999999999999999"], "--rounds must be in [-2147483648, "
     "2147483647] (a 32-bit integer), got 99999999999999999999"),
    (["--eval.steps=1000000000"], "--eval.steps must be at most 10,000"),
]


def _config(args):
  """The RunConfig of CLI-style ``--name=value`` arguments."""
  config = training.RunConfig()
  for arg in args:
    name, value = arg[2:].split("=", 1)
    kind = type(fields.get(config, name) or "")
    if name in ("crd.nce_k",):
      kind = int
    config = fields.replace(config, **{name: kind(value)})
  return config


@pytest.fixture
def sixteen_gb(monkeypatch):
  """A machine of 16 GB (the checks compare with the machine's memory)."""
  monkeypatch.setattr(limits, "machine_memory",
                      lambda: (16 * GB, "this machine's memory"))


@pytest.mark.parametrize("args,message", CASES)
def test_values_beyond_the_machine_or_the_model_fail_before_loading(
    args, message, monkeypatch, sixteen_gb):
  def refuse(*a, **k):
    raise AssertionError("the data were loaded")
  monkeypatch.setattr(experiment, "load_federated", refuse)
  with pytest.raises(ValueError) as e:
    training.validate(_config(args))
  assert str(e.value).startswith(message), str(e.value)
  assert "\n" not in str(e.value)
  if " needs " in message:
    assert str(e.value).endswith("more than the 16.0 GB of this machine's "
                                 "memory")


def test_the_defaults_and_a_large_but_possible_run_pass(sixteen_gb):
  training.validate(training.RunConfig())
  training.validate(_config(["--crd.nce_k=100000", "--eval.steps=10000",
                             "--rounds=2147483647"]))
  training.validate(_config(["--pm.kwargs={\"hidden\": [32]}",
                             "--pm.model=mlp"]))


def test_memory_needs_leave_out_the_sections_the_run_does_not_read():
  config = training.validate(_config(["--algorithm=fedavg",
                                      "--crd.nce_k=100000000"]))
  flags = " ".join(f for f, *_ in limits.memory_needs(
      config, training.unread_sections(config)))
  assert "--crd.nce_k" not in flags and "--fedavg.batch_size=10" in flags
  assert "--pm.batch_size" not in flags


@pytest.mark.slow
def test_the_replayed_flags_are_one_line_and_exit_2_on_the_cli(tmp_path):
  """The cases on the command line, with the machine's own memory (a case
  whose need this machine could hold is left out): none of them loads
  anything or writes a file."""
  available = limits.machine_memory()[0]
  for args, message in CASES:
    if " needs " in message:
      config = training.defaults.resolve(_config(args))
      need = next(size for flags, size, _ in limits.memory_needs(
          config, training.unread_sections(config))
                  if flags.startswith(args[-1]))
      if need <= available:
        continue
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", *args,
         f"--output_dir={out}", "--nocompilation_cache"], cwd=ROOT,
        capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: " + message.split(
        " needs ")[0]), lines
    assert "dataset digits" not in result.stdout and not out.exists()
