"""Tests of augfl_jax.core.client_axis (strategies, sharding) and models.conv."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax.core import client_axis as clients
from augfl_jax.models import conv

STRATEGIES = ("vmap", "map", "chunked:3", "sharded", "sharded:map",
              "sharded:chunked:2")


def _per_client(num: int = 7):
  rng = np.random.default_rng(0)
  return {"a": rng.normal(size=(num, 4)).astype(np.float32),
          "b": rng.normal(size=(num, 4, 3)).astype(np.float32)}


@pytest.mark.parametrize("name", STRATEGIES)
def test_map_clients_matches_numpy(name):
  data = _per_client()
  shared = np.float32(0.5)
  fn = lambda c: (jnp.tanh(c["a"]) @ c["b"] * shared, jnp.sum(c["a"]))
  out = jax.jit(lambda d: clients.map_clients(fn, d, name))(data)
  want = (np.einsum("ci,cij->cj", np.tanh(data["a"]), data["b"]) * shared,
          data["a"].sum(axis=1))
  chex.assert_trees_all_close(out, want, rtol=1e-5, atol=1e-6)


def test_as_strategy_parses_and_validates():
  assert clients.as_strategy("chunked:4") == clients.ClientStrategy(
      "chunked", 4)
  s = clients.as_strategy("sharded:chunked:2")
  assert (s.name, s.inner, s.chunk_size) == ("sharded", "chunked", 2)
  assert clients.ClientStrategy("map", None).name == "map"  # positional API
  with pytest.raises(ValueError, match="chunk_size"):
    clients.ClientStrategy("chunked")
  with pytest.raises(ValueError, match="unknown client strategy"):
    clients.as_strategy("pmap")
  with pytest.raises(ValueError, match="inner"):
    clients.ClientStrategy("sharded", inner="sharded")


def test_default_strategy_per_backend():
  assert clients.default_strategy("cpu").name == "map"
  assert clients.default_strategy("gpu").name == "vmap"
  assert clients.default_strategy("tpu").name == "vmap"
  # None and "auto" are the backend's default; explicit names are kept.
  assert clients.as_strategy(None) == clients.default_strategy()
  assert clients.as_strategy("auto") == clients.default_strategy()
  assert clients.as_strategy("vmap").name == "vmap"


def test_rounds_default_to_the_backend_strategy():
  """``make_round`` / evaluators without a strategy run
  ``default_strategy()``: the same program as naming it."""
  from augfl_jax.algorithms import augfl
  from augfl_jax.core import evaluation
  from tests import tiny
  data = tiny.client_data(seed=0, num_clients=3, pad_to=6)
  params = tiny.init(jax.random.PRNGKey(0))
  state = augfl.init_state(params, 3)
  cfg = augfl.AugFLConfig()
  default = clients.default_strategy().name
  lower = lambda fn: fn.lower(state, data).as_text()
  assert lower(augfl.make_round(tiny.loss_fn, cfg)) == lower(
      augfl.make_round(tiny.loss_fn, cfg, default))
  eval_fn = lambda p, b: (tiny.loss_fn(p, b), jnp.sum(b["mask"]))
  evaluate = lambda s=None: evaluation.make_evaluator(
      tiny.loss_fn, eval_fn, alpha=0.1, strategy=s).lower(
          params, data).as_text()
  assert evaluate() == evaluate(default)
  other = "vmap" if default == "map" else "map"
  assert lower(augfl.make_round(tiny.loss_fn, cfg)) != lower(
      augfl.make_round(tiny.loss_fn, cfg, other))


def test_chunk_size_for_budget_grows_with_budget():
  # A gradient keeps per-client activations alive: [512, 64] per layer.
  def fn(c):
    def loss(w):
      h = c["x"]
      for _ in range(3):
        h = jnp.tanh(h @ w)
      return jnp.sum(h ** 2)
    return jax.grad(loss)(c["w"])

  one = {"x": jax.ShapeDtypeStruct((512, 64), jnp.float32),
         "w": jax.ShapeDtypeStruct((64, 64), jnp.float32)}
  budgets = (1e3, 1e7, 2e7, 4e7, 1e12)
  sizes = [clients.chunk_size_for_budget(fn, one, b, 200) for b in budgets]
  assert sizes[0] == 1 and sizes[-1] == 200
  assert sizes == sorted(sizes) and len(set(sizes)) >= 3, sizes


def _numpy_conv(x, k, stride, pads):
  """Loops: y[n,h,w,o] = sum_ijc xp[n, s h + i, s w + j, c] k[i,j,c,o]."""
  xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
  kh, kw, _, cout = k.shape
  ho = (xp.shape[1] - kh) // stride + 1
  wo = (xp.shape[2] - kw) // stride + 1
  y = np.zeros((x.shape[0], ho, wo, cout))
  for h in range(ho):
    for w in range(wo):
      win = xp[:, h * stride:h * stride + kh, w * stride:w * stride + kw, :]
      y[:, h, w, :] = np.einsum("nijc,ijco->no", win, k)
  return y


@pytest.mark.parametrize("kernel,stride,pads", [
    ((3, 3), 1, ((1, 1), (1, 1))), ((3, 3), 2, ((1, 1), (1, 1))),
    ((1, 1), 2, ((0, 0), (0, 0))), ((3, 3), 1, ((0, 0), (0, 0)))])
def test_conv_patches_matches_direct_sum(kernel, stride, pads):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 7, 6, 3)).astype(np.float32)
  k = rng.normal(size=kernel + (3, 4)).astype(np.float32)
  got = conv.conv_patches(jnp.asarray(x), jnp.asarray(k), (stride, stride),
                          pads)
  np.testing.assert_allclose(got, _numpy_conv(x, k, stride, pads),
                             rtol=1e-4, atol=1e-4)


def test_conv_module_same_params_and_grads_as_nn_conv():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 9, 9, 2))
  ref = nn.Conv(5, (3, 3), strides=(2, 2), padding="SAME")
  params = ref.init(jax.random.PRNGKey(1), x)
  for impl in conv.CONV_IMPLS:
    mine = conv.Conv(5, (3, 3), strides=(2, 2), padding="SAME", impl=impl)
    chex.assert_trees_all_equal(mine.init(jax.random.PRNGKey(1), x), params)
    loss = lambda p, m: jnp.sum(jnp.sin(m.apply(p, x)))
    chex.assert_trees_all_close(jax.grad(loss)(params, mine),
                                jax.grad(loss)(params, ref),
                                rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="conv_impl"):
    conv.Conv(5, (3, 3), impl="fft").init(jax.random.PRNGKey(1), x)


def test_max_pool_patches_matches_numpy_and_routes_gradient():
  x = np.random.default_rng(2).permutation(2 * 5 * 4 * 3).reshape(
      2, 5, 4, 3).astype(np.float32)  # distinct values: no ties
  want = x[:, :4].reshape(2, 2, 2, 2, 2, 3).max(axis=(2, 4))
  for impl in conv.CONV_IMPLS:
    np.testing.assert_array_equal(conv.max_pool(jnp.asarray(x), (2, 2), impl),
                                  want)
  g = jax.grad(lambda v: jnp.sum(conv.max_pool(v, (2, 2), "patches")))(
      jnp.asarray(x))
  mask = np.zeros_like(x)  # gradient 1 at each window's argmax, 0 elsewhere
  for n in range(2):
    for h in range(2):
      for w in range(2):
        for c in range(3):
          win = x[n, 2 * h:2 * h + 2, 2 * w:2 * w + 2, c]
          i, j = np.unravel_index(np.argmax(win), (2, 2))
          mask[n, 2 * h + i, 2 * w + j, c] = 1.0
  np.testing.assert_array_equal(g, mask)


_SHARDED_SCRIPT = textwrap.dedent("""
    import os
    # 8 fake devices of the CPU platform, also on a machine with a GPU.
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from augfl_jax.algorithms import augfl
    from augfl_jax.core import client_axis as clients
    from augfl_jax.core.types import ClientData
    from tests import tiny
    assert jax.device_count() == 8, jax.devices()
    C = 10   # 10 clients on 8 devices: exercises the padding
    data = tiny.client_data(seed=0, num_clients=C, pad_to=6)
    params = tiny.init(jax.random.PRNGKey(0))
    cfg = augfl.AugFLConfig()
    out = {}
    for name in ("vmap", "sharded", "sharded:map"):
      state = augfl.init_state(params, C)
      round_fn = augfl.make_round(tiny.loss_fn, cfg, name)
      for _ in range(2):
        state, _ = round_fn(state, data)
      out[name] = state
    hlo = augfl.make_round(tiny.loss_fn, cfg, "sharded").lower(
        augfl.init_state(params, C), data).compile().as_text()
    assert "all-reduce" in hlo or "all-gather" in hlo, "no collective"
    for name in ("sharded", "sharded:map"):
      for a, b in zip(jax.tree.leaves(out["vmap"]), jax.tree.leaves(out[name])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                   rtol=1e-5, atol=1e-6)
    print("SHARDED_OK")
""")


@pytest.mark.slow
def test_sharded_on_8_fake_devices_matches_single_device():
  """Two AugFL rounds: sharded over 8 CPU devices == vmap on one (1e-5).

  The subprocess asks for 8 fake devices of the CPU platform (and only that
  platform), so it runs the same on a machine with or without a GPU;
  ``test_sharded_on_the_real_devices`` runs on the machine's own devices.
  """
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root)
  proc = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], cwd=root,
                        env=env, capture_output=True, text=True, timeout=300)
  assert "SHARDED_OK" in proc.stdout, proc.stdout + proc.stderr


def test_sharded_on_the_real_devices():
  """One AugFL round sharded over this process's real devices == vmap."""
  from augfl_jax.algorithms import augfl  # pylint: disable=g-import-not-at-top
  from tests import tiny  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  if len(devices) < 2:
    pytest.skip(f"needs >= 2 devices of the default backend, this process "
                f"has {len(devices)} ({devices[0].platform}); sharding is "
                "tested on 8 fake CPU devices by "
                "test_sharded_on_8_fake_devices_matches_single_device")
  num = len(devices) + 1  # not a multiple of the mesh: exercises the padding
  data = tiny.client_data(seed=1, num_clients=num, pad_to=6)
  params = tiny.init(jax.random.PRNGKey(1))
  cfg = augfl.AugFLConfig()
  out = {}
  for name in ("vmap", "sharded", "sharded:map"):
    round_fn = augfl.make_round(tiny.loss_fn, cfg, name)
    out[name], _ = round_fn(augfl.init_state(params, num), data)
  for name in ("sharded", "sharded:map"):
    chex.assert_trees_all_close(out[name], out["vmap"], rtol=1e-5, atol=1e-6)
