"""core.dense_factors and algorithms.augfl.factored against the
materialised computation (float64 unless said)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from augfl_jax import algorithms, models
from augfl_jax.algorithms.augfl import factored
from augfl_jax.algorithms import augfl
from augfl_jax.core import dense_factors as df
from augfl_jax.core import tree
from augfl_jax.core.types import ClientData


class SharedDense(nn.Module):
  """One Dense called twice, and a Dense on [n, t, d] inputs."""

  @nn.compact
  def __call__(self, x, mask=None):
    x = x.reshape((x.shape[0], 4, -1))
    h = nn.relu(nn.Dense(128, name="tokens")(x))  # [n, 4, 128]
    shared = nn.Dense(128, name="shared")
    h = nn.tanh(shared(nn.tanh(shared(h))))
    features = h.reshape((h.shape[0], -1))
    return features, nn.Dense(3, name="head")(features)


# name -> (model, example shape, support = query rows): sized so that the
# big kernels are factored (r (d_in + d_out) < d_in d_out, r = 3 n; the
# authors' 3136x10 head at r = 9).
PROBLEMS = {
    "mlp": (lambda: models.create_model("mlp", 3), (28, 28, 1), 5),
    "cnn": (lambda: models.create_model("cnn", 3, widths=(4,), dense=64,
                                        norm="batch"), (16, 16, 1), 4),
    "authors": (lambda: models.create_model("authors_fmnist_cnn", 10),
                (28, 28, 1), 3),
    "shared": (SharedDense, (16, 16, 1), 2),
    "resnet8x4": (lambda: models.create_model("resnet8x4", 3), (32, 32, 3),
                  2),
}


def _problem(name, clients=3, seed=0, dtype=jnp.float64):
  make, shape, n = PROBLEMS[name]
  model = make()
  params = models.init_params(model, jax.random.PRNGKey(seed), shape)
  params = jax.tree.map(lambda a: a.astype(dtype), params)
  rng = np.random.default_rng(seed)

  def batch():
    mask = np.ones((clients, n))
    mask[0, -1] = 0.0  # a padded row
    return {"x": jnp.asarray(rng.standard_normal((clients, n) + shape),
                             dtype),
            "y": jnp.asarray(rng.integers(0, 3, (clients, n)), jnp.int32),
            "mask": jnp.asarray(mask, dtype)}

  data = ClientData(support=batch(), query=batch(),
                    num_examples=jnp.asarray(rng.integers(4, 9, clients),
                                             dtype))
  return models.make_loss_fn(model), params, data


def _max_diff(a, b):
  """The largest difference of two trees relative to the first's leaf."""
  return max(float(jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(x)) + 1e-30))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _abs_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _scale(t):
  return max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(t))


def _layers(loss_fn, params, data):
  one = lambda b: jax.tree.map(lambda a: a[0], b)
  return factored.factored_layers(loss_fn, params, one(data.support),
                                  one(data.query))


@pytest.mark.parametrize("name", ["mlp", "cnn", "shared", pytest.param(
    "resnet8x4", marks=pytest.mark.slow)])
def test_factored_gradient_equals_the_gradient(name):
  """Every Dense kernel as factors (resnet8x4: its head), with low-rank
  corrections added: the loss and gradient of the corrected kernels."""
  with jax.enable_x64(True):
    loss_fn, params, data = _problem(name)
    batch = jax.tree.map(lambda a: a[0], data.support)
    layers = df.dense_kernels(loss_fn, params, batch)
    rng = np.random.default_rng(1)
    rest, kernels = df.split_kernels(params, layers)
    corrections = {
        p: df.Factors(jnp.asarray(rng.normal(size=(2, k.shape[0]))),
                      jnp.asarray(rng.normal(size=(2, k.shape[1]))))
        for p, k in kernels.items()}
    shifted = df.join_kernels(rest, {
        p: k + 0.1 * corrections[p].u.T @ corrections[p].v
        for p, k in kernels.items()})
    value, grad_rest, factors = df.value_and_grad(
        loss_fn, params, batch, layers=layers,
        corrections={p: c.scale(0.1) for p, c in corrections.items()})
    want_value, want = jax.value_and_grad(loss_fn)(shifted, batch)
    assert abs(float(value - want_value)) < 1e-13
    assert _max_diff(want, df.materialise(grad_rest, factors)) < 1e-12


def test_only_kernels_whose_factors_are_smaller_are_factored():
  """The cnn at n = 15: its 3136x512 kernel (r = 45 rows of 3,648), not
  the 512x10 head (45 x 522 > 5,120); the shared Dense called twice on
  [n, 4, 128] counts 2 x 4 rows per example (n = 2: 16 + 2 x 16 rows)."""
  model = models.create_model("cnn", 10)
  params = models.init_params(model, jax.random.PRNGKey(0), (28, 28, 1))
  batch = {"x": jnp.zeros((15, 28, 28, 1)), "y": jnp.zeros(15, jnp.int32),
           "mask": jnp.ones(15)}
  layers, layers_q = factored.factored_layers(models.make_loss_fn(model),
                                              params, batch, batch)
  assert list(layers) == list(layers_q) == [("fc",)]
  loss_fn, params, data = _problem("shared", dtype=jnp.float32)
  layers, _ = _layers(loss_fn, params, data)
  assert sorted(layers) == [("shared",), ("tokens",)]
  state = factored.init_state(loss_fn, params, data, rho=1.0, partial=True)
  assert state.duals[1][("shared",)].u.shape == (3, 48, 128)


def _config(**changes):
  return augfl.AugFLConfig(**{"alpha": 0.05, "rho": 2.0, **changes})


@pytest.mark.parametrize("name", ["mlp", "cnn", pytest.param(
    "authors", marks=pytest.mark.slow), "shared"])
def test_ten_factored_rounds_equal_the_rounds_with_duals_and_the_pm(name):
  """theta after 10 rounds with lam grad R_h (R_h = sum sin(theta)): the
  duals of each round enter the next."""
  with jax.enable_x64(True):
    loss_fn, params, data = _problem(name)
    assert _layers(loss_fn, params, data)[0]  # something is factored
    config = _config(lam=0.5)
    round_m = augfl.make_round(loss_fn, config, "map")
    round_f = factored.make_round(loss_fn, config, "map")
    state_m = augfl.init_state(params, 3)
    state_f = factored.init_state(loss_fn, params, data)
    reg = lambda p: jax.tree.map(jnp.cos, p)  # grad of sum sin(theta)
    for _ in range(10):
      state_m, metrics_m = round_m(state_m, data, reg(state_m.params))
      state_f, metrics_f = round_f(state_f, data, reg(state_f.params))
    assert _max_diff(state_m.params, state_f.params) < 1e-12
    for key in ("loss", "support_loss", "client_loss"):
      np.testing.assert_allclose(metrics_f[key], metrics_m[key], rtol=1e-12)
    # Y = sum_i y_i, y_i = -w_i d_i: the materialised duals, which step 5
    # computes as y + rho (theta_i - theta), exact to rho eps |theta|
    assert _abs_diff(jax.tree.map(lambda y: y.sum(0), state_m.duals),
                     state_f.dual_sum) < (
                         1e-12 * config.rho * _scale(state_m.params))


@pytest.mark.parametrize("name", ["mlp", pytest.param(
    "cnn", marks=pytest.mark.slow)])
def test_factored_rounds_with_partial_participation(name):
  with jax.enable_x64(True):
    loss_fn, params, data = _problem(name, clients=5)
    config = _config(lam=0.5, uniform_weights=True)
    round_m = augfl.make_round(loss_fn, config, "map")
    round_f = factored.make_round(loss_fn, config, "map")
    state_m = augfl.init_state(params, 5)
    state_f = factored.init_state(loss_fn, params, data, rho=config.rho,
                                  partial=True)
    reg = jax.tree.map(lambda a: 0.01 * jnp.ones_like(a), params)
    for ids in ([0, 2], [1, 2, 4], None, [3], [4, 0], [0, 1, 2], None,
                [2], [3, 4], [1]):
      ids = None if ids is None else jnp.asarray(ids)
      state_m, _ = round_m(state_m, data, reg, ids)
      state_f, _ = round_f(state_f, data, reg, ids)
    assert _max_diff(state_m.params, state_f.params) < 1e-12
    np.testing.assert_array_equal(state_f.client_rounds,
                                  state_m.client_rounds)
    # s_j = y_j + rho theta_j and y_j of the materialised state
    terms = jax.tree.map(lambda y, t: y + config.rho * t, state_m.duals,
                         state_m.client_params)
    assert _abs_diff(terms, state_f.terms) < 1e-12 * _scale(terms)
    rest, factors = state_f.duals
    duals = df.join_kernels(rest, {p: jnp.einsum("cri,cro->cio", f.u, f.v)
                                   for p, f in factors.items()})
    assert _abs_diff(state_m.duals, duals) < (
        1e-12 * config.rho * _scale(state_m.params))


def test_the_first_factored_round_is_the_closed_form():
  """From zero duals: theta^1 = theta^0 - 2 sum_i w_i (r_i - alpha g_i) /
  (rho C), r_i and the finite-difference g_i by jax.grad of the loss (no
  factors)."""
  with jax.enable_x64(True):
    loss_fn, theta, data = _problem("mlp")
    config = _config()
    state, _ = factored.make_round(loss_fn, config)(
        factored.init_state(loss_fn, theta, data), data)
    w = data.num_examples / jnp.sum(data.num_examples)
    total = optax.tree.zeros_like(theta)
    delta = 1 / 110
    for i in range(3):
      c = tree.take(data, i)
      phi = optax.tree.add_scale(
          theta, -config.alpha, jax.grad(loss_fn)(theta, c.support))
      r = jax.grad(loss_fn)(phi, c.query)
      gp, gm = (jax.grad(loss_fn)(optax.tree.add_scale(theta, s * delta, r),
                                  c.support) for s in (1, -1))
      g = jax.tree.map(lambda a, b: (a - b) / (2 * delta), gp, gm)
      total = jax.tree.map(lambda t, a, b: t + w[i] * (a - config.alpha * b),
                           total, r, g)
    want = jax.tree.map(lambda p, t: p - 2 * t / (config.rho * 3), theta,
                        total)
    assert _max_diff(want, state.params) < 1e-12


def test_float32_rounds_agree_within_rounding():
  loss_fn, params, data = _problem("cnn", dtype=jnp.float32)
  config = _config()
  state_m, state_f = (augfl.init_state(params, 3),
                      factored.init_state(loss_fn, params, data))
  round_m, round_f = (augfl.make_round(loss_fn, config),
                      factored.make_round(loss_fn, config))
  for _ in range(5):
    state_m, _ = round_m(state_m, data)
    state_f, _ = round_f(state_f, data)
  assert jax.tree.leaves(state_f.params)[0].dtype == jnp.float32
  assert _max_diff(state_m.params, state_f.params) < 1e-4


def _clients(n, shape=(28, 28, 1), num=2):
  batch = {"x": jnp.zeros((num, n) + shape), "y": jnp.zeros((num, n),
                                                            jnp.int32),
           "mask": jnp.ones((num, n))}
  return ClientData(batch, batch, jnp.full((num,), 2.0 * n))


@pytest.mark.parametrize("model, n, hvp, mode, want", [
    ("cnn", 15, "finite_difference", "auto", "factored"),
    ("cnn", 15, "exact", "auto", "materialised"),
    ("cnn", 15, "finite_difference", "materialised", "materialised"),
    ("logreg", 15, "finite_difference", "auto", "materialised"),
    ("mlp", 15, "finite_difference", "auto", "factored"),
    ("mlp", 300, "finite_difference", "auto", "materialised"),
    ("logreg", 15, "finite_difference", "factored", "factored"),
])
def test_auto_factors_where_the_factored_kernels_hold_half_the_parameters(
    model, n, hvp, mode, want):
  net = models.create_model(model, 10)
  params = models.init_params(net, jax.random.PRNGKey(0), (28, 28, 1))
  config = augfl.AugFLConfig(hvp=hvp, dense_updates=mode)
  assert factored.choose(config, models.make_loss_fn(net), params,
                         _clients(n)) == want


def test_factored_without_the_finite_difference_hvp_or_the_data_is_refused():
  net = models.create_model("mlp", 10)
  params = models.init_params(net, jax.random.PRNGKey(0), (28, 28, 1))
  loss_fn = models.make_loss_fn(net)
  with pytest.raises(ValueError, match="finite-difference HVP"):
    factored.choose(augfl.AugFLConfig(hvp="exact", dense_updates="factored"),
                    loss_fn, params, _clients(5))
  with pytest.raises(ValueError, match="finite-difference HVP"):
    factored.make_round(loss_fn, augfl.AugFLConfig(hvp="exact"))
  algo = algorithms.build("augfl", net, augfl.AugFLConfig(
      dense_updates="factored"))
  with pytest.raises(ValueError, match=r"algo.start\(params, clients, key\)"):
    algo.init(params, 2, jax.random.key(0))
  with pytest.raises(ValueError, match="partial=True"):
    factored.make_round(loss_fn, augfl.AugFLConfig())(
        factored.init_state(loss_fn, params, _clients(5)), _clients(5),
        participants=jnp.asarray([0]))
  with pytest.raises(ValueError, match="participants"):
    factored.make_round(loss_fn, augfl.AugFLConfig())(
        factored.init_state(loss_fn, params, _clients(5), 0.7, True),
        _clients(5), participants=jnp.asarray([0, 0]))


@pytest.mark.parametrize("mode", ["auto", "factored", "materialised"])
def test_the_method_starts_the_state_its_setting_names(mode):
  with jax.enable_x64(True):
    loss_fn, params, data = _problem("mlp", clients=4)
    net = PROBLEMS["mlp"][0]()
    config = _config(dense_updates=mode)
    algo = algorithms.build("augfl", net, config)
    reference = algorithms.build("augfl", net,
                                 _config(dense_updates="materialised"))
    state = algo.start(params, data, jax.random.key(0))
    want = reference.init(params, 4, jax.random.key(0))
    assert isinstance(state.augfl, factored.FactoredState) == (
        mode != "materialised")
    for ids in (None, None, None):
      state, _ = algo.round(state, data, ids)
      want, _ = reference.round(want, data, ids)
    assert _max_diff(algo.global_params(want), algo.global_params(state)
                     ) < 1e-12
    partial = algo.start(params, data, jax.random.key(0), partial=True)
    if mode != "materialised":
      assert partial.augfl.terms is not None
    after, _ = algo.round(partial, data, jnp.asarray([1, 3]))
    assert jax.tree.map(jnp.shape, after) == jax.tree.map(jnp.shape, partial)


def test_state_bytes_per_client():
  """The cnn at n = 15, 2 clients: the materialised duals and theta_i;
  factored, the dual sum Y alone, or under partial participation each
  client's dual (two 45 x (3136 + 512) factors and the small leaves) and
  its s_j."""
  model = models.create_model("cnn", 10)
  params = models.init_params(model, jax.random.PRNGKey(0), (28, 28, 1))
  clients = _clients(15)
  num_params = sum(a.size for a in jax.tree.leaves(params))
  materialised = factored.state_bytes(jax.eval_shape(
      lambda p: augfl.init_state(p, 2), params))
  fact, fact_partial = (factored.state_bytes(jax.eval_shape(
      lambda p, partial=partial: factored.init_state(
          models.make_loss_fn(model), p, clients, 0.7, partial), params))
                        for partial in (False, True))
  kernel = 3136 * 512
  shared = 4 * num_params + 4 * 2 + 4  # params, client_rounds, round
  assert materialised == shared + 2 * 2 * 4 * num_params
  assert fact == shared + 4 * num_params
  assert fact_partial == shared + 2 * 4 * (
      num_params - kernel + 45 * (3136 + 512) + num_params)


@pytest.mark.slow
@pytest.mark.usefixtures("compile_cache")
def test_a_run_with_the_cnn_factors_resumes_and_matches_materialised(
    tmp_path):
  """digits with the cnn (its 256x512 kernel is factored by auto): 4
  rounds straight, 2 + a resume to 4, and 4 materialised rounds."""
  from augfl_jax import training  # pylint: disable=g-import-not-at-top
  from augfl_jax.core import fields  # pylint: disable=g-import-not-at-top
  from tests import run_files  # pylint: disable=g-import-not-at-top
  lines = []
  config = lambda **c: fields.replace(training.RunConfig(), **{
      "model": "cnn", "rounds": 4, "eval_every": 2,
      "eval.test_split": "off", "augfl.lam": 0.0, **c})
  quiet = lambda line: None
  training.run(config(), str(tmp_path / "straight"), log=lines.append)
  assert "dense updates: factored (auto)" in lines
  training.run(config(rounds=2), str(tmp_path / "resumed"), log=quiet,
               checkpoint_every=2)
  training.run(config(), str(tmp_path / "resumed"), log=quiet,
               checkpoint_every=2, resume=True)
  training.run(config(**{"augfl.dense_updates": "materialised"}),
               str(tmp_path / "materialised"), log=quiet)
  drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}
  straight, resumed, materialised = (
      [drop(r) for r in run_files.records(str(tmp_path / name))]
      for name in ("straight", "resumed", "materialised"))
  assert straight == resumed
  for a, b in zip(straight, materialised):
    assert a["round"] == b["round"]
    # float32 rounding, amplified by the finite-difference HVP's 1/delta
    # (benchmarks/RESULTS.md §15): 0.2% after 4 rounds
    np.testing.assert_allclose(a["mean_train_loss"], b["mean_train_loss"],
                               rtol=1e-2)
    assert abs(a["accuracy"] - b["accuracy"]) < 0.05


def test_a_config_saved_before_dense_updates_reads_as_materialised():
  """Runs saved before the field existed ran the materialised round: a
  resume or a reused cell reads them so, and --resume with auto names the
  field instead of failing to restore the state."""
  from augfl_jax import training  # pylint: disable=g-import-not-at-top
  from augfl_jax.core import fields  # pylint: disable=g-import-not-at-top
  from augfl_jax.training import resume  # pylint: disable=g-import-not-at-top
  saved = fields.to_dict(training.RunConfig())
  assert saved["augfl"].pop("dense_updates") == "auto"
  old = fields.from_dict(training.RunConfig, saved)
  assert old.augfl.dense_updates == "materialised"
  assert fields.from_dict(training.RunConfig, {
      "seed": 3}).augfl.dense_updates == "auto"  # no section: the default
  with pytest.raises(ValueError, match="augfl.dense_updates"):
    resume.check_resume_config(old, training.prepare(training.RunConfig()),
                               (), "step_2")
