"""Tests of augfl_jax.models: shapes, parameter counts, masking, vmap."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from augfl_jax import models

SMALL_MODELS = ("cnn", "mlp", "logreg", "resnet8", "resnet20", "resnet32",
                "resnet8x4")
INPUT_SHAPES = ((8, 8, 1), (28, 28, 1), (32, 32, 3))
# Tolerance for "the same up to float32 rounding" (padded vs unpadded batches
# reduce over different array sizes, so summation order may differ).
RTOL, ATOL = 1e-4, 1e-5


def _reference_resnet_params(depth: int, filters: tuple[int, ...],
                             in_channels: int, num_classes: int) -> int:
  """Parameter count of RepDistiller's PyTorch ResNet, counted by hand."""
  blocks = (depth - 2) // 6
  count = 9 * in_channels * filters[0] + 2 * filters[0]  # conv1 + bn1
  inplanes = filters[0]
  for planes, stride in zip(filters[1:], (1, 2, 2)):
    for b in range(blocks):
      s = stride if b == 0 else 1
      count += 9 * inplanes * planes + 2 * planes + 9 * planes * planes
      count += 2 * planes
      if s != 1 or inplanes != planes:  # downsample: 1x1 conv + bn
        count += inplanes * planes + 2 * planes
      inplanes = planes
  return count + filters[3] * num_classes + num_classes  # fc


def _count(name: str, num_classes: int, input_shape: tuple[int, ...],
           **kwargs) -> int:
  model = models.create_model(name, num_classes, **kwargs)
  shapes = jax.eval_shape(
      lambda k: models.init_params(model, k, input_shape), jax.random.key(0))
  return models.num_params(shapes)


def _fake_params(model, input_shape: tuple[int, ...], seed: int = 0):
  """Random parameters of the right shapes without compiling ``model.init``.

  Kernels ~ N(0, 1 / fan_in), norm scales ~ 1 + N(0, 0.1^2), biases
  ~ N(0, 0.1^2). Much faster on CPU than the jitted initialisers.
  """
  shapes = jax.eval_shape(
      lambda k: models.init_params(model, k, input_shape), jax.random.key(0))
  rng = np.random.default_rng(seed)

  def fill(path, s):
    leaf = jax.tree_util.keystr(path)
    z = rng.normal(size=s.shape)
    if "kernel" in leaf:
      z = z / np.sqrt(np.prod(s.shape[:-1]))
    elif "scale" in leaf:
      z = 1.0 + 0.1 * z
    else:
      z = 0.1 * z
    return jnp.asarray(z, jnp.float32)

  return jax.tree_util.tree_map_with_path(fill, shapes)


def _batch(key, n: int, shape: tuple[int, ...], num_classes: int,
           num_real: int | None = None) -> dict[str, jax.Array]:
  kx, ky = jax.random.split(key)
  num_real = n if num_real is None else num_real
  return {
      "x": jax.random.normal(kx, (n,) + shape),
      "y": jax.random.randint(ky, (n,), 0, num_classes, jnp.int32),
      "mask": (jnp.arange(n) < num_real).astype(jnp.float32),
  }


# ---------------------------------------------------------------- registry


def test_available_models_and_unknown_name():
  assert set(models.available_models()) == {
      "cnn", "mlp", "logreg", "resnet8", "resnet20", "resnet32", "resnet8x4",
      "resnet32x4", "authors_fmnist_cnn", "authors_cifar_cnn"}
  with pytest.raises(ValueError, match="resnet8x4"):
    models.create_model("resnet9000", 10)


def test_bad_norm_raises():
  model = models.create_model("cnn", 10, norm="layer")
  with pytest.raises(ValueError, match="norm must be one of"):
    models.init_params(model, jax.random.key(0), (8, 8, 1))


# ------------------------------------------------------------------ shapes


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_shapes(name):
  """Traced shapes on every input size (no compilation: eval_shape)."""
  num_classes = 7
  model = models.create_model(name, num_classes)
  features_fn = models.make_features_fn(model)
  for shape in INPUT_SHAPES:
    params = jax.eval_shape(
        lambda k, s=shape: models.init_params(model, k, s), jax.random.key(0))
    x = jax.ShapeDtypeStruct((3,) + shape, jnp.float32)
    mask = jax.ShapeDtypeStruct((3,), jnp.float32)
    features, logits = jax.eval_shape(features_fn, params, x, mask)
    assert features.ndim == 2 and features.shape[0] == 3, (shape, features)
    chex.assert_shape(logits, (3, num_classes))
    if name == "logreg":
      assert features.shape[1] == np.prod(shape)


# resnet20/resnet32 only add blocks to resnet8 (their shapes are checked
# above); resnet8x4 runs in the padding tests, resnet32x4 below.
@pytest.mark.parametrize("name", ["cnn", "mlp", "logreg", "resnet8"])
def test_forward_runs(name):
  """Numerical forward pass on 8x8x1 digits-size inputs."""
  model = models.create_model(name, 7)
  params = _fake_params(model, (8, 8, 1))
  x = jax.random.normal(jax.random.key(1), (3, 8, 8, 1))
  features, logits = jax.jit(models.make_features_fn(model))(
      params, x, jnp.array([1.0, 1.0, 0.0]))
  chex.assert_shape(logits, (3, 7))
  assert features.shape[0] == 3
  chex.assert_tree_all_finite((features, logits))


def test_init_params():
  model = models.create_model("cnn", 5, widths=(4,), dense=8)
  params = jax.jit(lambda k: models.init_params(model, k, (8, 8, 1)))(
      jax.random.key(0))
  chex.assert_trees_all_equal_shapes_and_dtypes(
      params, _fake_params(model, (8, 8, 1)))
  chex.assert_trees_all_equal(params["norm1"], {
      "scale": jnp.ones(4), "bias": jnp.zeros(4)})
  assert "bias" not in params["conv1"]  # redundant before batch norm
  assert float(jnp.std(params["conv1"]["kernel"])) > 0.0


def test_feature_widths():
  shape = (8, 8, 1)
  expected = {"cnn": 512, "mlp": 128, "logreg": 64, "resnet8": 64,
              "resnet8x4": 256}
  for name, width in expected.items():
    model = models.create_model(name, 5)
    out = jax.eval_shape(
        lambda m=model: m.init_with_output(
            jax.random.key(0), jnp.zeros((2,) + shape))[0])
    chex.assert_shape(out[0], (2, width))


@pytest.mark.slow
def test_resnet32x4_tiny_batch():
  model = models.create_model("resnet32x4", 10)
  params = _fake_params(model, (8, 8, 3))
  x = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  features, logits = jax.jit(models.make_features_fn(model))(params, x)
  chex.assert_shape(features, (2, 256))
  chex.assert_shape(logits, (2, 10))
  chex.assert_tree_all_finite((features, logits))


@pytest.mark.slow
def test_client_models_are_pure_in_their_params():
  """A client model runs from its "params" alone (batch statistics of the
  batch at hand); the running statistics ("batch_stats") exist only for the
  PM's pretraining and its eval mode (norm="running")."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8, 8, 1)),
                  jnp.float32)
  for name in ("cnn", "resnet8", "mlp"):
    model = models.create_model(name, 3, norm="batch")
    variables = jax.eval_shape(
        lambda m=model: m.init(jax.random.key(0), jnp.zeros((2, 8, 8, 1))))
    assert set(variables) == {"params", "batch_stats"}, name
    params = models.init_params(model, jax.random.key(0), (8, 8, 1))
    assert jax.jit(model.apply)({"params": params}, x)[1].shape == (4, 3)
    stats = models.init_batch_stats(model, (8, 8, 1))
    running = model.clone(norm="running")
    # Initial running statistics (mean 0, var 1) normalise nothing away.
    assert jax.jit(running.apply)({"params": params, "batch_stats": stats},
                                  x)[1].shape == (4, 3)
  group = models.create_model("cnn", 3, norm="group")
  assert models.init_batch_stats(group, (8, 8, 1)) == {}


# -------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name,depth,filters", [
    ("resnet8", 8, (16, 16, 32, 64)),
    ("resnet20", 20, (16, 16, 32, 64)),
    ("resnet32", 32, (16, 16, 32, 64)),
    ("resnet8x4", 8, (32, 64, 128, 256)),
    ("resnet32x4", 32, (32, 64, 128, 256)),
])
def test_resnet_param_counts_match_reference(name, depth, filters):
  for num_classes in (10, 100):
    assert _count(name, num_classes, (32, 32, 3)) == _reference_resnet_params(
        depth, filters, 3, num_classes)


def test_param_counts_paper_sizes():
  # CRD / AugFL report resnet8x4 1.23M and resnet32x4 7.43M (CIFAR-100).
  n8x4 = _count("resnet8x4", 100, (32, 32, 3))
  n32x4 = _count("resnet32x4", 100, (32, 32, 3))
  assert n8x4 == 1_233_540
  assert n32x4 == 7_433_860
  assert abs(n8x4 - 1.2e6) / 1.2e6 < 0.05
  assert abs(n32x4 - 7.4e6) / 7.4e6 < 0.02
  # Small CNN, 28x28x1, 26 classes (EMNIST letters): 1,638,394 ~ 1.7M (-4%).
  n_cnn = _count("cnn", 26, (28, 28, 1))
  assert n_cnn == 1_638_394
  assert 1.6e6 <= n_cnn <= 1.75e6


# ---------------------------------------------------------- MaskedBatchNorm


def _numpy_masked_bn(x, mask, scale, bias, eps=1e-5):
  x = np.asarray(x, np.float64)
  real = x[np.asarray(mask) > 0]
  axes = tuple(range(real.ndim - 1))
  mean = real.mean(axis=axes)
  var = real.var(axis=axes)  # biased
  return (x - mean) / np.sqrt(var + eps) * scale + bias


@pytest.mark.parametrize("shape", [(7, 5, 4, 3), (9, 6)])
def test_masked_batchnorm_matches_numpy(shape):
  rng = np.random.default_rng(0)
  x = rng.normal(2.0, 3.0, shape).astype(np.float32)
  mask = np.ones(shape[0], np.float32)
  mask[[1, 4]] = 0.0
  channels = shape[-1]
  scale = rng.normal(size=channels).astype(np.float32)
  bias = rng.normal(size=channels).astype(np.float32)
  bn = models.MaskedBatchNorm()
  params = {"scale": jnp.asarray(scale), "bias": jnp.asarray(bias)}
  out = bn.apply({"params": params}, jnp.asarray(x), jnp.asarray(mask))
  expected = _numpy_masked_bn(x, mask, scale, bias)
  real = mask > 0
  np.testing.assert_allclose(out[real], expected[real], rtol=1e-5, atol=1e-5)
  # mask=None: every row counts.
  out_all = bn.apply({"params": params}, jnp.asarray(x))
  np.testing.assert_allclose(
      out_all, _numpy_masked_bn(x, np.ones_like(mask), scale, bias),
      rtol=1e-5, atol=1e-5)


def test_masked_batchnorm_init():
  params = models.MaskedBatchNorm().init(
      jax.random.key(0), jnp.ones((2, 3, 3, 4)))["params"]
  chex.assert_trees_all_equal(
      params, {"scale": jnp.ones(4), "bias": jnp.zeros(4)})


def test_masked_batchnorm_ignores_huge_padding_and_its_gradient():
  rng = np.random.default_rng(1)
  x_real = jnp.asarray(rng.normal(size=(4, 3, 3, 2)), jnp.float32)
  garbage = jnp.asarray(rng.normal(size=(3, 3, 3, 2)) * 1e30, jnp.float32)
  garbage = garbage.at[0].set(jnp.inf).at[1, 0, 0, 0].set(jnp.nan)
  x_pad = jnp.concatenate([x_real[:2], garbage, x_real[2:]])
  mask_pad = jnp.array([1, 1, 0, 0, 0, 1, 1], jnp.float32)
  real_idx = jnp.array([0, 1, 5, 6])
  bn = models.MaskedBatchNorm()
  params = {"scale": jnp.array([1.5, -0.5]), "bias": jnp.array([0.1, 0.2])}
  weights = jnp.asarray(rng.normal(size=(4, 3, 3, 2)), jnp.float32)

  def objective(params, x, mask, idx):
    y = bn.apply({"params": params}, x, mask)[idx]
    return jnp.sum(weights * y), y

  vg = jax.jit(jax.value_and_grad(objective, has_aux=True))
  (v1, y1), g1 = vg(params, x_real, jnp.ones(4), jnp.arange(4))
  (v2, y2), g2 = vg(params, x_pad, mask_pad, real_idx)
  chex.assert_trees_all_close(y1, y2, rtol=1e-6, atol=1e-6)
  chex.assert_trees_all_close(v1, v2, rtol=1e-6, atol=1e-6)
  chex.assert_trees_all_close(g1, g2, rtol=1e-6, atol=1e-6)
  # The gradient w.r.t. the input is 0 on padded rows, equal on real ones.
  gx = jax.jit(jax.grad(lambda x, m, i: objective(params, x, m, i)[0]))
  gx1 = gx(x_real, jnp.ones(4), jnp.arange(4))
  gx2 = gx(x_pad, mask_pad, real_idx)
  chex.assert_trees_all_close(gx2[real_idx], gx1, rtol=1e-6, atol=1e-6)
  chex.assert_trees_all_equal(gx2[2:5], jnp.zeros_like(gx2[2:5]))


def test_masked_batchnorm_all_padding_is_finite():
  bn = models.MaskedBatchNorm()
  x = jnp.ones((3, 2, 2, 4))
  params = bn.init(jax.random.key(0), x)["params"]
  out, grads = jax.value_and_grad(
      lambda p: jnp.sum(bn.apply({"params": p}, x, jnp.zeros(3))))(params)
  chex.assert_tree_all_finite((out, grads))


# ------------------------------------------------ padding invariance (models)


@pytest.mark.parametrize("name,kwargs,shape", [
    ("cnn", {}, (8, 8, 1)),
    pytest.param("resnet8x4", {}, (8, 8, 3), marks=pytest.mark.slow),
    ("mlp", {"norm": "batch"}, (8, 8, 1)),
])
def test_padding_invariance(name, kwargs, shape):
  num_classes = 5
  model = models.create_model(name, num_classes, **kwargs)
  params = _fake_params(model, shape)
  real = _batch(jax.random.key(1), 6, shape, num_classes)
  # Interleave 4 padded rows of garbage (huge values, inf, NaN, bad labels).
  garbage = 1e30 * jax.random.normal(jax.random.key(2), (4,) + shape)
  garbage = garbage.at[1].set(jnp.inf).at[2].set(jnp.nan)
  order = jnp.array([0, 6, 1, 2, 7, 8, 3, 4, 5, 9])
  padded = {
      "x": jnp.concatenate([real["x"], garbage])[order],
      "y": jnp.concatenate(
          [real["y"], jnp.array([-1, 999, 3, -7], jnp.int32)])[order],
      "mask": jnp.concatenate([real["mask"], jnp.zeros(4)])[order],
  }
  real_rows = np.flatnonzero(np.asarray(padded["mask"]))
  loss_fn = models.make_loss_fn(model)
  features_fn = models.make_features_fn(model)

  @jax.jit
  def run(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return loss, grads, features_fn(params, batch["x"], batch["mask"])

  loss_real, grad_real, out_real = run(params, real)
  loss_pad, grad_pad, out_pad = run(params, padded)
  chex.assert_tree_all_finite((loss_pad, grad_pad, out_pad))
  chex.assert_trees_all_close(
      jax.tree.map(lambda a: a[real_rows], out_pad), out_real,
      rtol=RTOL, atol=ATOL)
  chex.assert_trees_all_close(loss_pad, loss_real, rtol=RTOL, atol=ATOL)
  chex.assert_trees_all_close(grad_pad, grad_real, rtol=RTOL, atol=ATOL)
  # The loss is the plain mean cross-entropy of the real rows.
  expected = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
      out_real[1], real["y"]))
  np.testing.assert_allclose(loss_real, expected, rtol=1e-6)
  # An all-padding batch: loss 0, finite gradient (no 0 / 0 anywhere).
  loss_none, grad_none, _ = run(
      params, {**padded, "mask": jnp.zeros_like(padded["mask"])})
  assert float(loss_none) == 0.0
  chex.assert_tree_all_finite(grad_none)


# ---------------------------------------------------------- loss and eval


def test_loss_is_masked_mean_cross_entropy():
  num_classes = 6
  model = models.create_model("mlp", num_classes)
  params = _fake_params(model, (8, 8, 1))
  batch = _batch(jax.random.key(1), 10, (8, 8, 1), num_classes, num_real=7)
  loss_fn = jax.jit(models.make_loss_fn(model))
  features_fn = jax.jit(models.make_features_fn(model))
  _, logits = features_fn(params, batch["x"], None)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
  np.testing.assert_allclose(
      loss_fn(params, batch), jnp.mean(ce[:7]), rtol=1e-6)
  # Without a mask every row counts.
  no_mask = {"x": batch["x"], "y": batch["y"]}
  np.testing.assert_allclose(loss_fn(params, no_mask), jnp.mean(ce), rtol=1e-6)


def test_loss_keeps_float64_logits_in_float64():
  """Under jax_enable_x64 the loss of a float64 model is float64: its
  cross-entropy equals numpy's float64 one to float64 rounding."""
  with jax.enable_x64(True):
    model = models.create_model("mlp", 6)
    params = jax.tree.map(lambda p: p.astype(jnp.float64),
                          _fake_params(model, (8, 8, 1)))
    batch = _batch(jax.random.key(1), 10, (8, 8, 1), 6, num_real=7)
    batch = {**batch, "x": batch["x"].astype(jnp.float64)}
    loss = models.make_loss_fn(model)(params, batch)
    _, logits = models.make_features_fn(model)(params, batch["x"], None)
    logits = np.asarray(logits, np.float64)
    log_z = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + (
        logits.max(1))
    y = np.asarray(batch["y"])
    ce = log_z - logits[np.arange(len(y)), y]
    assert loss.dtype == jnp.float64
    np.testing.assert_allclose(float(loss), ce[:7].mean(), rtol=1e-13)


def test_eval_fn_counts_correct_real_examples():
  num_classes = 4
  model = models.create_model("logreg", num_classes)
  params = _fake_params(model, (8, 8, 1))
  batch = _batch(jax.random.key(1), 12, (8, 8, 1), num_classes, num_real=9)
  _, logits = jax.jit(models.make_features_fn(model))(params, batch["x"])
  pred = np.asarray(jnp.argmax(logits, -1))
  y = np.asarray(batch["y"])
  # Force one padded row to be "correct": it must not be counted.
  batch["y"] = batch["y"].at[10].set(int(pred[10]))
  loss, correct = jax.jit(models.make_eval_fn(model))(params, batch)
  assert loss.dtype == jnp.float32 and correct.dtype == jnp.float32
  assert correct.shape == () and loss.shape == ()
  assert float(correct) == float(np.sum(pred[:9] == y[:9]))
  np.testing.assert_allclose(
      loss, jax.jit(models.make_loss_fn(model))(params, batch), rtol=1e-6)


def test_group_norm_is_per_example():
  model = models.create_model("resnet8", 5, norm="group")
  params = _fake_params(model, (8, 8, 3))
  assert "scale" in params["norm1"] and params["norm1"]["scale"].shape == (16,)
  x = jax.random.normal(jax.random.key(1), (4, 8, 8, 3))
  x_pad = jnp.concatenate([x, jnp.full((2, 8, 8, 3), jnp.nan)])
  mask_pad = jnp.array([1, 1, 1, 1, 0, 0], jnp.float32)
  features_fn = jax.jit(models.make_features_fn(model))
  out = features_fn(params, x, None)
  out_pad = features_fn(params, x_pad, mask_pad)
  chex.assert_tree_all_finite(out_pad)
  chex.assert_trees_all_close(
      jax.tree.map(lambda a: a[:4], out_pad), out, rtol=RTOL, atol=ATOL)
  # Per-example statistics: a row's output does not depend on the others.
  chex.assert_trees_all_close(
      jax.tree.map(lambda a: a[:1], out), features_fn(params, x[:1], None),
      rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------- client vmap


@pytest.mark.parametrize("name,kwargs", [
    ("cnn", {"widths": (4,), "dense": 8}),
    ("mlp", {"norm": "batch"}),
])
def test_vmap_over_clients(name, kwargs):
  num_clients, num_classes, shape = 3, 4, (8, 8, 3)
  model = models.create_model(name, num_classes, **kwargs)
  params = jax.tree.map(lambda *a: jnp.stack(a), *[
      _fake_params(model, shape, seed=c) for c in range(num_clients)])
  batches = [_batch(jax.random.key(10 + c), 5, shape, num_classes,
                    num_real=c + 2) for c in range(num_clients)]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *batches)
  loss_fn = models.make_loss_fn(model)
  fn = jax.value_and_grad(loss_fn)
  out = jax.jit(jax.vmap(fn))(params, stacked)
  single = jax.jit(fn)
  for c in range(num_clients):
    out_c = single(jax.tree.map(lambda a, c=c: a[c], params), batches[c])
    chex.assert_trees_all_close(
        jax.tree.map(lambda a, c=c: a[c], out), out_c, rtol=RTOL, atol=ATOL)
  features, logits = jax.eval_shape(
      jax.vmap(models.make_features_fn(model)), params, stacked["x"],
      stacked["mask"])
  chex.assert_shape(logits, (num_clients, 5, num_classes))
  assert features.shape[:2] == (num_clients, 5)


# ------------------------------------------------------------- conv_impl


@pytest.mark.parametrize("name,shape", [
    ("cnn", (28, 28, 1)),  # the paper-size CNN (1.6M parameters)
    # AugFL's client ResNet, small images
    pytest.param("resnet8x4", (8, 8, 3), marks=pytest.mark.slow),
])
@pytest.mark.slow
def test_conv_impls_agree_on_full_models_and_under_client_vmap(name, shape):
  """xla vs patches: the same parameter tree, features, logits, loss and
  gradients (float32 rounding), one model and vmapped over per-client
  parameters (where xla's convolutions become grouped ones)."""
  num_clients, num_classes, n = 2, 5, 4
  nets = {impl: models.create_model(name, num_classes, conv_impl=impl)
          for impl in models.CONV_IMPLS}
  trees = {impl: jax.tree.structure(jax.eval_shape(
      lambda k, m=m: models.init_params(m, k, shape), jax.random.key(0)))
           for impl, m in nets.items()}
  assert trees["xla"] == trees["patches"]
  params = jax.tree.map(lambda *a: jnp.stack(a), *[
      _fake_params(nets["xla"], shape, seed=c) for c in range(num_clients)])
  batches = jax.tree.map(lambda *a: jnp.stack(a), *[
      _batch(jax.random.key(20 + c), n, shape, num_classes, num_real=n - c)
      for c in range(num_clients)])
  out = {}
  for impl, model in nets.items():
    features_fn = models.make_features_fn(model)
    grad_fn = jax.value_and_grad(models.make_loss_fn(model))
    one = jax.tree.map(lambda a: a[0], (params, batches))
    out[impl] = jax.jit(lambda p, b, f=features_fn, g=grad_fn: (
        f(one[0], one[1]["x"], one[1]["mask"]), g(*one),
        jax.vmap(f)(p, b["x"], b["mask"]), jax.vmap(g)(p, b)))(
            params, batches)
  chex.assert_trees_all_close(out["xla"], out["patches"], rtol=1e-4,
                              atol=1e-5)


def test_conv_impl_auto_resolves_per_backend():
  assert models.CNN(3).conv_impl == "auto"
  assert models.resnet8x4(3).conv_impl == "auto"
  assert models.default_conv_impl("cpu") == "patches"
  assert models.default_conv_impl("gpu") == "xla"
  assert models.default_conv_impl("tpu") == "xla"
  assert models.resolve_conv_impl("auto", "cpu") == "patches"
  assert models.resolve_conv_impl("auto", "gpu") == "xla"
  for impl in models.CONV_IMPLS:  # explicit choices are kept on every backend
    assert models.resolve_conv_impl(impl, "cpu") == impl
    assert models.resolve_conv_impl(impl, "gpu") == impl
  with pytest.raises(ValueError, match="conv_impl"):
    models.resolve_conv_impl("fft")
  # "auto" runs exactly what the backend's choice runs.
  shape, x = (8, 8, 1), jax.random.normal(jax.random.key(0), (3, 8, 8, 1))
  auto = models.create_model("cnn", 3, widths=(4,), dense=8)
  chosen = models.create_model("cnn", 3, widths=(4,), dense=8,
                               conv_impl=models.default_conv_impl())
  params = _fake_params(auto, shape)
  hlo = lambda m: jax.jit(models.make_features_fn(m)).lower(
      params, x).as_text()
  assert hlo(auto) == hlo(chosen)
