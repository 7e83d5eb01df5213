"""Per-dataset presets: what a run resolves to when a flag is left unset."""

from experiments import runner


def test_digits_uses_group_norm_and_the_papers_step_sizes():
  config = runner.validate(runner.RunConfig(dataset="digits"))
  assert (config.norm, config.alpha, config.rho, config.lam) == (
      "group", 0.03, 0.7, 5.0)
  # The PM takes the run's norm, and PMs of two norms never share a directory.
  assert config.pm_dir.endswith("cnn-group_srv400")
  batch = runner.validate(runner.RunConfig(dataset="digits", norm="batch"))
  assert batch.norm == "batch" and batch.pm_dir.endswith("cnn_srv400")


def test_other_datasets_keep_the_references_batch_norm():
  config = runner.validate(runner.RunConfig(dataset="synthetic",
                                            algorithm="fedavg"))
  assert config.norm == "batch"
