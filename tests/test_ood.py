"""experiments.ood: leave-one-rotated-domain-out runs, tables and resume.

Tiny: digits, three domains of one 30-example client, 2 rounds, a PM (an
mlp, fresh weights) saved into tmp_path; a persistent compilation cache in
the session's temporary directory.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from augfl_jax import data, models, training
from augfl_jax.core import fields
from augfl_jax.pm import pretrain
from augfl_jax.data import rotated
from augfl_jax.training import experiment
from experiments import ood, ood_domains
from tests import fake_pm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTOCOL = ood.Protocol(angles=(0.0, 45.0, 90.0), clients_per_domain=1,
                        examples_per_client=30)


# the CLI's compilation cache in the session's temp directory (conftest)
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.fixture(scope="module")
def pm_dir(tmp_path_factory):
  """An mlp PM checkpoint for digits (fresh weights: training it would only
  cost time here)."""
  path = str(tmp_path_factory.mktemp("pm") / "digits_mlp")
  norm = training.validate(training.RunConfig()).norm  # the runs' default
  mlp = models.create_model("mlp", 10, norm=norm)
  params = models.init_params(mlp, jax.random.key(0), (8, 8, 1))
  fake_pm.save(path, mlp, "mlp", params=params)
  return path


def test_held_out_domain_clients_are_the_test_clients():
  plan = training.prepare(training.RunConfig(algorithm="fedavg", seed=3))
  new, summary = ood.leave_out(plan, PROTOCOL, 1)(
      experiment.load_federated(plan))
  assert new.train.num_clients == 2 and new.test.num_clients == 1
  assert "held-out domain 45" in summary and "400 examples" in summary
  # The test client holds the 45-degree rotation of examples after the
  # server split (the first 400), drawn with the run's seed.
  digits = data.load_dataset("digits")
  domain = rotated.rotated_domains(
      data.Dataset("digits", digits.x[400:], digits.y[400:], 10),
      PROTOCOL.angles, clients_per_domain=1, examples_per_client=30,
      seed=3)[1]
  want = rotated.rotate_images(digits.x[400 + domain.source_index], 45.0)
  np.testing.assert_allclose(new.test.support["x"][0, :15],
                             want[domain.support[0]], atol=1e-6)
  np.testing.assert_array_equal(new.test.query["y"][0],
                                domain.y[domain.query[0]])
  assert new.server["x"].shape[0] == 400  # the server split is unchanged


@pytest.mark.slow
def test_ood_writes_tables_and_a_rerun_reuses_every_cell(tmp_path, pm_dir,
                                                        monkeypatch):
  base = training.RunConfig(rounds=2, pm=training.PMConfig(model="mlp",
                                                          dir=pm_dir))
  out = str(tmp_path / "ood")
  args = (base, ["digits"], ["fedavg", "fedoa"], [0.0, 90.0], [0], out,
          PROTOCOL)
  text = ood.run_ood(*args)
  assert "| held-out domain | FedAvg | FedOA | FedOA (personal) |" in text
  lines = [l for l in text.splitlines() if l.startswith("| ")]
  assert [l.split(" | ")[0] for l in lines[1:]] == ["| 0°", "| 90°",
                                                    "| average"]
  assert open(os.path.join(out, "ood.md")).read() == text
  rows = list(csv.DictReader(open(os.path.join(out, "ood.csv"))))
  assert [(r["method"], float(r["held_out"])) for r in rows] == [
      ("fedavg", 0.0), ("fedoa", 0.0), ("fedavg", 90.0), ("fedoa", 90.0)]
  for r in rows:
    assert 0.0 <= float(r["final_accuracy"]) <= 1.0
    assert (r["personal_accuracy"] != "") == (r["method"] == "fedoa")
  run_dir = os.path.join(out, "digits", "held_out_90", "fedoa", "seed0")
  assert "held-out domain 90" in open(
      os.path.join(run_dir, "partition.txt")).read()
  # A rerun trains and scores nothing: every cell is reused.
  def fail(*a, **k):
    raise AssertionError("recomputed a finished cell")
  monkeypatch.setattr(training, "run", fail)
  monkeypatch.setattr(ood_domains.fedoa, "make_evaluate_personal", fail)
  assert ood.run_ood(*args) == text
  # Another domain protocol in the same directory is refused before running.
  with pytest.raises(ValueError, match="another domain protocol"):
    ood.run_ood(*args[:-1], ood.Protocol(angles=(0.0, 90.0),
                                         clients_per_domain=1,
                                         examples_per_client=30))


def test_method_defaults_apply_to_fields_left_at_their_default():
  default = training.RunConfig()
  assert ood.method_cell(default, "fedoa") == {"fedoa.lr": 0.02,
                                               "algorithm": "fedoa"}
  assert ood.method_cell(default, "fedit") == {
      "fedit.lr": 0.02, "eval.alpha": 0.03, "algorithm": "fedit"}
  given = fields.replace(default, **{"fedoa.lr": 0.01, "fedit.lr": 0.01,
                                     "eval.alpha": 0.1})
  assert ood.method_cell(given, "fedoa") == {"algorithm": "fedoa"}
  assert ood.method_cell(given, "fedit") == {"algorithm": "fedit"}
  # Another method's section does not count.
  other = fields.replace(default, **{"fedavg.lr": 0.01})
  assert ood.method_cell(other, "fedoa")["fedoa.lr"] == 0.02


def test_bad_requests_fail_before_any_run(tmp_path):
  base = training.RunConfig(rounds=2)
  out = str(tmp_path / "ood")
  cases = [
      (dict(methods=["fedsgd"]), "unknown --algorithms"),
      (dict(held_out=[10.0]), "--held_out must name domains"),
      (dict(datasets=["synthetic"]), "need an image dataset"),
      (dict(protocol=ood.Protocol(examples_per_client=2000)), "need"),
  ]
  for change, message in cases:
    kwargs = dict(base=base, datasets=["digits"], methods=["fedavg"],
                  held_out=None, seeds=[0], out=out, protocol=PROTOCOL)
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
      ood.run_ood(**kwargs)
  assert not os.path.exists(out)


@pytest.mark.slow
def test_cli_runs_and_bad_flags_are_one_line(tmp_path, compile_cache):
  def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "experiments.ood", *args,
         f"--output_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
        text=True, timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": compile_cache})
  result = cli("--algorithms=fedavg", "--held_out=45", "--angles=0,45",
               "--clients_per_domain=1", "--examples_per_client=20",
               "--rounds=1", "--seeds=0")
  assert result.returncode == 0, result.stderr
  assert "[1/1] fedavg seed 0" in result.stdout
  assert "| 45° |" in result.stdout
  assert os.path.exists(tmp_path / "out" / "ood.md")
  for flag, message in (("--held_out=10", "--held_out must name domains"),
                        ("--seeds=0,a", "--seeds takes int values")):
    result = cli(flag)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("error: " + message)
    assert "Traceback" not in result.stderr


def test_importing_the_commands_defines_no_flags():
  """Every command defines its own flags only when it runs, so all of them
  import into one process (the run flags come with experiments.run)."""
  code = ("import experiments.ood, experiments.table2, experiments.ablations,"
          " experiments.sweep, experiments.pretrain_pm, benchmarks.round_cost;"
          " from absl import flags;"
          " print(sorted({'seeds', 'datasets', 'algorithms', 'methods',"
          " 'study', 'held_out', 'grid', 'output_dir', 'augfl.rho',"
          " 'pm.model', 'lr'} & set(flags.FLAGS)))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                       capture_output=True, text=True).stdout
  assert out.strip() == "[]"
