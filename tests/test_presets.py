"""Per-dataset presets: what a run resolves to when a field is left unset."""

from augfl_jax import training


def test_digits_uses_group_norm_and_the_papers_step_sizes():
  config = training.validate(training.RunConfig(dataset="digits"))
  assert (config.norm, config.augfl.alpha, config.augfl.rho,
          config.augfl.lam, config.eval.alpha) == (
              "group", 0.03, 0.7, 5.0, 0.03)
  # The PM takes the run's norm, and PMs of two norms never share a directory.
  assert config.pm.dir.endswith("cnn-group_e30_srv400")
  batch = training.validate(training.RunConfig(dataset="digits",
                                               norm="batch"))
  assert batch.norm == "batch" and batch.pm.dir.endswith("cnn_e30_srv400")


def test_other_datasets_keep_the_references_batch_norm():
  config = training.validate(training.RunConfig(dataset="synthetic",
                                                algorithm="fedavg"))
  assert config.norm == "batch"
