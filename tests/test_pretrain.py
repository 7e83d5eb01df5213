"""PM pretraining, its lr schedule, checkpoints and the pretrain_pm CLI."""

import dataclasses
import os
import subprocess
import sys
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from augfl_jax.storage import checkpoint
from augfl_jax import data, models, training
from augfl_jax.core import fields
from augfl_jax.pm import store
from augfl_jax.pm import pretrain as pt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def digits():
  return data.load_dataset("digits")


def _server(dataset, n):
  idx, _ = data.server_split(dataset.num_examples, n)
  return {"x": dataset.x[idx], "y": dataset.y[idx]}


def _tiny_mlp():
  return models.create_model("mlp", 10, hidden=(32,))


# One recipe for every test that trains, so that it compiles once.
CONFIG = pt.PretrainConfig(model="mlp", epochs=6)


# ----------------------------------------------------------------------------
# Training.


@pytest.fixture(scope="module")
def trained(digits):
  """The tiny MLP pretrained with CONFIG on digits' 400 server examples."""
  model, server = _tiny_mlp(), _server(digits, 400)
  lines = []
  variables, metrics = pt.pretrain(model, server, CONFIG, log=lines.append)
  assert variables["batch_stats"] == {}  # no batch norm in this mlp
  return model, server, variables["params"], metrics, lines


def test_a_few_epochs_lift_heldout_accuracy_far_above_chance(trained):
  model, server, params, metrics, lines = trained
  assert metrics["num_train"] == 360 and metrics["num_heldout"] == 40
  # Held-out accuracy recomputed from the model on the last 40 examples.
  _, logits = model.apply({"params": params}, server["x"][360:])
  acc = np.mean(np.argmax(np.asarray(logits), -1) == server["y"][360:])
  assert metrics["heldout_accuracy"] == pytest.approx(acc, abs=1e-6)
  assert acc > 0.6  # chance is 0.1
  assert metrics["train_accuracy"] > 0.6 and metrics["train_loss"] < 1.5
  assert lines[0].startswith("pm epoch    1/6")
  assert "held-out acc" in lines[-1] and len(lines) == 6


def test_only_the_training_part_of_the_server_split_is_trained_on(trained):
  # Other held-out labels: the same parameters, another held-out accuracy.
  model, server, params, metrics, _ = trained
  flipped = dict(server, y=np.concatenate(
      [server["y"][:360], (server["y"][360:] + 1) % 10]))
  other, other_metrics = pt.pretrain(model, flipped, CONFIG)
  other = other["params"]
  assert other_metrics["train_loss"] == metrics["train_loss"]
  assert other_metrics["heldout_accuracy"] < 0.4 < metrics["heldout_accuracy"]
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(other)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _reference_decays(epochs):
  # 150/180/210 of 240, scaled and rounded half up, in exact arithmetic.
  return [int(Fraction(e * epochs, 240) + Fraction(1, 2)) for e in
          (150, 180, 210)]


@pytest.mark.parametrize("epochs", [1, 2, 7, 8, 60, 240])
def test_decay_epochs_are_62_5_75_87_5_percent(epochs):
  assert list(pt.decay_epochs(epochs)) == _reference_decays(epochs)
  if epochs == 240:
    assert pt.decay_epochs(epochs) == (150, 180, 210)


# (3, 2): decays after epochs 2, 2 and 3, so the 3rd epoch runs at lr / 100.
@pytest.mark.parametrize("epochs,steps_per_epoch", [(8, 3), (3, 2)])
def test_optimizer_is_pytorch_sgd_with_the_stepped_lr(epochs, steps_per_epoch):
  config = pt.PretrainConfig(epochs=epochs, lr=0.05, momentum=0.9,
                             weight_decay=5e-4)
  opt = pt.make_optimizer(config, steps_per_epoch)
  rng = np.random.default_rng(0)
  p = {"w": rng.normal(size=(3,)).astype(np.float32)}
  state = opt.init(p)
  update = jax.jit(opt.update)
  ref_p, buf = p["w"].astype(np.float64), np.zeros(3)
  decays = _reference_decays(epochs)
  for t in range(epochs * steps_per_epoch):
    g = rng.normal(size=(3,)).astype(np.float32)
    updates, state = update({"w": g}, state, p)
    p = optax.apply_updates(p, updates)
    # torch.optim.SGD(lr, momentum, weight_decay) + the reference's
    # adjust_learning_rate: lr * 0.1 ** #{d : epoch > d}, 1-based epochs.
    epoch = t // steps_per_epoch + 1
    lr = 0.05 * 0.1 ** sum(epoch > d for d in decays)
    buf = 0.9 * buf + (g + 5e-4 * ref_p) if t else g + 5e-4 * ref_p
    ref_p = ref_p - lr * buf
  np.testing.assert_allclose(np.asarray(p["w"]), ref_p, rtol=1e-5)


# ----------------------------------------------------------------------------
# Checkpoints.


def test_checkpoint_round_trip_is_bit_identical_with_prng_keys(tmp_path):
  tree = {"w": jax.random.normal(jax.random.key(1), (4, 3)),
          "n": {"b": np.arange(5, dtype=np.int32), "s": np.asarray(2.5, np.float32)},
          "key": jax.random.key(7), "rbg": jax.random.key(3, impl="rbg")}
  meta = {"a": 1, "b": [1, 2], "c": {"d": "x"}}
  checkpoint.save(tmp_path / "c", tree, meta)
  assert sorted(os.listdir(tmp_path)) == ["c"]  # no temporary left over
  for like in (None, tree):
    got, got_meta = checkpoint.restore(tmp_path / "c", like=like)
    assert got_meta == meta
    np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(tree["w"]))
    assert np.asarray(got["n"]["b"]).dtype == np.int32
    np.testing.assert_array_equal(got["n"]["b"], tree["n"]["b"])
    for k in ("key", "rbg"):
      assert jax.dtypes.issubdtype(got[k].dtype, jax.dtypes.prng_key)
      np.testing.assert_array_equal(jax.random.key_data(got[k]),
                                    jax.random.key_data(tree[k]))
    np.testing.assert_array_equal(  # the keys still draw the same numbers
        jax.random.uniform(got["rbg"], (3,)),
        jax.random.uniform(tree["rbg"], (3,)))


def test_checkpoint_overwrite_and_errors(tmp_path):
  path = tmp_path / "c"
  checkpoint.save(path, {"a": np.zeros(2)}, {"v": 1})
  with pytest.raises(FileExistsError):
    checkpoint.save(path, {"a": np.ones(2)}, {"v": 2})
  checkpoint.save(path, {"a": np.ones(3)}, {"v": 2}, overwrite=True)
  tree, meta = checkpoint.restore(path)
  assert meta == {"v": 2} and np.array_equal(tree["a"], np.ones(3))
  assert sorted(os.listdir(tmp_path)) == ["c"]
  with pytest.raises(ValueError, match="does not fit"):
    checkpoint.restore(path, like={"a": np.zeros(4)})
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing")):
    checkpoint.restore(tmp_path / "missing")
  (tmp_path / "junk").mkdir()
  (tmp_path / "junk" / "state").write_text("not a checkpoint")
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "junk")):
    checkpoint.restore(tmp_path / "junk")
  with pytest.raises(TypeError):
    checkpoint.save(tmp_path / "bad", {"a": np.zeros(1)}, {"v": object()})
  assert not (tmp_path / "bad").exists()


def _expected(model, dataset="digits", name="mlp", server_size=400, seed=0,
              config=CONFIG):
  return store.pm_metadata(dataset, name, server_size, seed,
                        model_kwargs=store.model_kwargs(model), config=config)


def _variables(params):
  return {"params": params, "batch_stats": {}}


def test_pm_round_trip_and_mismatches_name_every_field(tmp_path, trained):
  model, _, params, _, _ = trained
  path = str(tmp_path / "pm")
  store.save_pm(path, _variables(params), {
      **_expected(model), "heldout_accuracy": 0.9, "epochs": 3})
  got, meta = store.load_pm(path, _expected(model))
  got = got["params"]
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert jax.tree.structure(got) == jax.tree.structure(params)
  assert meta["num_params"] == 32 * 64 + 32 + 32 * 10 + 10
  assert meta["heldout_accuracy"] == 0.9 and meta["epochs"] == 3
  assert meta["architecture"] == {
      "model": "mlp",
      "kwargs": {"num_classes": 10, "hidden": [32], "norm": "none"}}
  assert "created" in meta

  with pytest.raises(store.PMCheckpointMismatch) as e:
    store.load_pm(path, _expected(model, dataset="mnist", server_size=500))
  msg = str(e.value)
  assert "dataset=digits, server_size=400" in msg
  assert "dataset=mnist, server_size=500" in msg
  assert path in msg and "python -m experiments.pretrain_pm" in msg
  assert "--pm.dir" in msg and "architecture" not in msg
  assert "--data.server_size=500" in msg
  other = models.create_model("mlp", 10, hidden=(64,))
  with pytest.raises(store.PMCheckpointMismatch, match="architecture=mlp") as e:
    store.load_pm(path, _expected(other))
  assert "hidden=[64]" in str(e.value) and "hidden=[32]" in str(e.value)
  with pytest.raises(store.PMCheckpointMismatch, match="split_seed=0"):
    store.load_pm(path, _expected(model, seed=3))
  with pytest.raises(store.PMCheckpointMismatch, match="architecture=cnn"):
    store.load_pm(path, _expected(models.create_model("cnn", 10), name="cnn"))
  assert isinstance(e.value, ValueError)
  # The recipe is part of what a PM was trained for: a short test's PM is
  # never reused by a longer configuration (and the reverse).
  longer = pt.PretrainConfig(model="mlp", epochs=30)
  with pytest.raises(store.PMCheckpointMismatch, match="epochs=6") as e:
    store.load_pm(path, _expected(model, config=longer))
  assert "epochs=30" in str(e.value) and "--pm.epochs=30" in str(e.value)
  with pytest.raises(store.PMCheckpointMismatch, match="lr=0.05"):
    store.load_pm(path, _expected(model, config=pt.PretrainConfig(
        model="mlp", epochs=6, lr=0.1)))


def test_default_pm_dir():
  assert store.default_pm_dir("runs", "emnist/letters", "resnet32x4",
                              10000) == os.path.join(
                                  "runs", "pm",
                                  "emnist_letters_resnet32x4_srv10000")


def test_get_or_pretrain_pm_creates_then_reuses_then_refuses(
    tmp_path, digits, trained, monkeypatch):
  calls = []
  real = store.pretrain
  monkeypatch.setattr(store, "pretrain",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  model, server, trained_params, _, _ = trained
  path = str(tmp_path / "pm" / "x")
  kw = dict(model=model, model_name="mlp", dataset_name="digits",
            server=server, server_size=400, split_seed=0, config=CONFIG,
            input_shape=(8, 8, 1))
  lines = []
  params, meta = store.get_or_pretrain_pm(path, log=lines.append, **kw)
  params = params["params"]
  assert len(calls) == 1 and os.path.isdir(path)
  assert lines[0].startswith(f"no PM at {path}: pretraining mlp")
  assert meta["epochs"] == 6 and meta["pretrain_config"]["epochs"] == 6
  assert meta["heldout_accuracy"] > 0.6 and meta["num_heldout"] == 40
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(trained_params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same seed
  lines.clear()
  again, meta2 = store.get_or_pretrain_pm(path, log=lines.append, **kw)
  again = again["params"]
  assert len(calls) == 1  # reused, not retrained
  assert meta2 == meta and lines[0].startswith(f"reusing the PM at {path}")
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(store.PMCheckpointMismatch, match="server_size=400"):
    store.get_or_pretrain_pm(path, **dict(kw, server=_server(digits, 420),
                                       server_size=420))
  assert len(calls) == 1


@pytest.mark.slow
def test_a_pm_restores_under_either_conv_impl(tmp_path, digits, monkeypatch):
  """conv_impl is not part of the architecture: a cnn PM pretrained with
  "patches" is reused (not retrained) by a run with "xla", with the same
  parameter tree and the same outputs (float32 rounding); a checkpoint that
  records conv_impl in its architecture (as older ones do) is reused too."""
  server = _server(digits, 100)
  nets = {impl: models.create_model("cnn", 10, widths=(4, 8), dense=16,
                                    conv_impl=impl)
          for impl in models.CONV_IMPLS}
  kw = dict(model_name="cnn", dataset_name="digits", server=server,
            server_size=100, split_seed=0, input_shape=(8, 8, 1),
            config=pt.PretrainConfig(model="cnn", epochs=1))
  path = str(tmp_path / "pm")
  params, meta = store.get_or_pretrain_pm(path, model=nets["patches"], **kw)
  params = params["params"]
  assert "conv_impl" not in meta["architecture"]["kwargs"]
  monkeypatch.setattr(store, "pretrain", lambda *a, **k: pytest.fail("retrain"))
  again, _ = store.get_or_pretrain_pm(path, model=nets["xla"], **kw)
  again = again["params"]
  assert jax.tree.structure(again) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  x = jnp.asarray(server["x"][:16])
  outputs = [jax.jit(models.make_features_fn(nets[impl]))(again, x)
             for impl in models.CONV_IMPLS]
  for a, b in zip(*outputs):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  old = str(tmp_path / "old")
  store.save_pm(old, {"params": params, "batch_stats": models.init_batch_stats(
      nets["xla"], (8, 8, 1))}, store.pm_metadata(
          "digits", "cnn", 100, 0, config=kw["config"],
          model_kwargs={**store.model_kwargs(nets["xla"]), "conv_impl": "xla"}))
  for impl in models.CONV_IMPLS:
    store.get_or_pretrain_pm(old, model=nets[impl], **kw)
  with pytest.raises(store.PMCheckpointMismatch, match="widths"):
    store.get_or_pretrain_pm(old, model=models.create_model(
        "cnn", 10, widths=(4, 4), dense=16, conv_impl="xla"), **kw)


# ----------------------------------------------------------------------------
# The command line.


def _cli(*args):
  return subprocess.run(
      [sys.executable, "-m", "experiments.pretrain_pm", *args], cwd=ROOT,
      capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_writes_a_loadable_checkpoint(tmp_path):
  pm_dir = str(tmp_path / "pm")
  result = _cli("--pm.epochs=2", "--pm.model=logreg",
                "--data.server_size=200", f"--pm.dir={pm_dir}")
  assert result.returncode == 0, result.stderr
  assert "pm epoch    2/2" in result.stdout
  assert f"PM saved to {pm_dir}" in result.stdout
  model = models.create_model("logreg", 10)
  variables, meta = store.load_pm(
      pm_dir, _expected(model, name="logreg", server_size=200,
                        config=pt.PretrainConfig(model="logreg", epochs=2)))
  assert variables["params"]["head"]["kernel"].shape == (64, 10)
  assert meta["num_heldout"] == 20 and meta["epochs"] == 2
  assert f"held-out accuracy {100 * meta['heldout_accuracy']:.2f}%" in (
      result.stdout)


@pytest.mark.slow
def test_cli_pretrains_the_pm_a_default_run_uses(tmp_path):
  """Same model, norm (GroupNorm on digits), split and default directory as
  ``experiments.run`` resolves: the run reuses the PM instead of refusing
  or retraining it."""
  pm_dir = str(tmp_path / "pm")
  result = _cli("--pm.epochs=1", f"--pm.dir={pm_dir}")
  assert result.returncode == 0, result.stderr
  config = training.validate(fields.replace(training.RunConfig(rounds=1),
                                            **{"pm.dir": pm_dir,
                                               "pm.epochs": 1}))
  assert config.norm == "group"
  lines = []
  training.run(config, str(tmp_path / "run"), log=lines.append)
  assert not any("pretraining" in line for line in lines)
  assert any(line.startswith(f"reusing the PM at {pm_dir}")
             for line in lines)


@pytest.mark.slow
def test_cli_pretrains_into_the_default_directory_of_a_run(tmp_path):
  """Without --pm.dir: the directory a run with the same flags looks in
  (here under a temporary working directory)."""
  result = subprocess.run(
      [sys.executable, "-m", "experiments.pretrain_pm", "--pm.epochs=1",
       "--pm.model=mlp", "--pm.kwargs={\"hidden\": [16]}", "--norm=batch"],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": ROOT})
  assert result.returncode == 0, result.stderr
  config = training.validate(fields.replace(training.RunConfig(), **{
      "pm.model": "mlp", "pm.kwargs": "{\"hidden\": [16]}", "norm": "batch",
      "pm.epochs": 1}))
  assert config.pm.dir == os.path.join("runs", "pm",
                                       "digits_mlp-hidden-16_e1_srv400")
  assert f"PM saved to {config.pm.dir}" in result.stdout
  assert os.path.isdir(tmp_path / config.pm.dir)


@pytest.mark.parametrize("args,message", [
    (["--pm.epochs=0"], "--pm.epochs must be >= 1"),
    (["--pm.model=vgg"], "unknown --pm.model 'vgg'"),
    (["--pm.kwargs={"], "--pm.kwargs is not valid JSON"),
    (["--data.server_size=1"], "--data.server_size must be >= 2"),
    (["--dataset=synthetic"], "synthetic has natural clients"),
    (["--pm.lr=x"], "flag --pm.lr=x"),
    (["--epochs=2"], "unknown flag --epochs; it is now --pm.epochs"),
    (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
])
def test_cli_bad_flags_fail_with_one_line(tmp_path, args, message):
  result = _cli(*args, f"--pm.dir={tmp_path / 'pm'}")
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  assert message in lines[0]
  assert not (tmp_path / "pm").exists()


# ----------------------------------------------------------------------------
# Running statistics (the PM as the reference's eval-mode teacher).


@pytest.mark.slow
def test_running_statistics_follow_pytorch(digits):
  """Two steps of a batch-norm PM: its running mean/var are PyTorch's
  (momentum 0.1, unbiased variance) of the first layer's pre-norm
  activations, recomputed here from the parameters before each step."""
  model = models.create_model("mlp", 10, hidden=(8,), norm="batch")
  server = _server(digits, 64)
  config = pt.PretrainConfig(model="mlp", epochs=1, batch_size=32,
                             holdout_fraction=0.0, momentum=0.0, lr=0.1)
  captured = []
  real_step = pt.local.step

  def spy(loss_fn, tx, params, opt_state, batch, stats):
    captured.append((params, batch, stats))
    return real_step(loss_fn, tx, params, opt_state, batch, stats)

  pt._jitted.cache_clear()  # pylint: disable=protected-access
  try:
    pt.local.step = spy
    variables, _ = pt.pretrain(model, server, config)
  finally:
    pt.local.step = real_step
    pt._jitted.cache_clear()  # pylint: disable=protected-access
  # One trace: recompute both steps by hand with the final epoch order.
  assert len(captured) == 1
  batches = pt._jitted(model, dataclasses.replace(  # pylint: disable=protected-access
      config, model="", seed=0), 2, (8, 8, 1))[1](
          jax.random.split(jax.random.key(0))[1], 1,
          jax.device_put(pt._split(server, 0.0)[0]))  # pylint: disable=protected-access
  mean, var = np.zeros(8), np.ones(8)
  params = models.init_params(model, jax.random.split(jax.random.key(0))[0],
                              (8, 8, 1))
  opt = pt.make_optimizer(config, 2)
  opt_state = opt.init(params)
  loss = pt._loss_and_correct(model, True, track=True)  # pylint: disable=protected-access
  stats = models.init_batch_stats(model, (8, 8, 1))
  for i in range(2):
    batch = jax.tree.map(lambda b: b[i], batches)
    x = np.asarray(batch["x"]).reshape(32, -1)
    h = x @ np.asarray(params["fc1"]["kernel"])
    mean = 0.9 * mean + 0.1 * h.mean(0)
    var = 0.9 * var + 0.1 * h.var(0, ddof=1)
    params, opt_state, (_, stats) = pt.local.step(loss, opt, params,
                                                  opt_state, batch, stats)
  got = variables["batch_stats"]["norm1"]
  np.testing.assert_allclose(got["mean"], mean, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got["var"], var, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_the_eval_mode_pm_is_per_example(digits):
  """With running statistics, a PM's output for an example does not depend
  on the rest of its batch; with batch statistics it does."""
  from augfl_jax.training import pm_roles  # pylint: disable=g-import-not-at-top
  model = models.create_model("cnn", 10, widths=(4, 8), dense=16)
  variables, _ = pt.pretrain(model, _server(digits, 100),
                             pt.PretrainConfig(model="cnn", epochs=1))
  x = jnp.asarray(digits.x[:12])
  mask = jnp.ones(12)
  for statistics, per_example in (("running", True), ("batch", False)):
    config = fields.replace(training.RunConfig(), norm="batch",
                            **{"pm.statistics": statistics})
    apply, flag = pm_roles.pm_apply(config, model, variables)
    assert flag == per_example
    whole = np.asarray(apply(x, mask)[1][:4])
    part = np.asarray(apply(x[:4], mask[:4])[1])
    assert np.allclose(whole, part, atol=1e-5) == per_example
