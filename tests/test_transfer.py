"""Tests of the server regularisers (augfl_jax.transfer): CRD, L2, none.

The CRD loss is checked against a numpy transcription of RepDistiller's
ContrastMemory / ContrastLoss written here; gradients against per-batch
gradients computed by hand on the real rows.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import transfer
from augfl_jax.transfer import crd, nce
from tests import tiny

N_SRV, NUM_CLASSES = 12, 3


def apply_fn(params, x, mask=None):
  """tiny.py's model returning (features, logits)."""
  del mask
  features = jnp.tanh(x @ params["w1"] + params["b1"])
  return features, features @ params["w2"] + params["b2"]


def server_split(seed=0, n=N_SRV):
  rng = np.random.default_rng(seed)
  y = rng.permutation(np.arange(n) % NUM_CLASSES).astype(np.int32)
  x = rng.normal(size=(n, tiny.D)).astype(np.float32)
  return {"x": jnp.asarray(x), "y": jnp.asarray(y),
          "mask": jnp.ones((n,), jnp.float32),
          "index": jnp.arange(n, dtype=jnp.int32)}


STUDENT = tiny.init(jax.random.PRNGKey(0))
TEACHER = tiny.init(jax.random.PRNGKey(1), h=6)
SERVER = server_split()


def build(config, teacher=TEACHER, server=SERVER):
  return transfer.make_crd_regularizer(
      apply_fn, lambda x, mask: apply_fn(teacher, x, mask), server, config)


# ------------------------------------------------------------- numpy reference


def np_unit(v):
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def np_scores(bank, e, contrast_idx, tau):
  """exp(<bank[j], e> / tau) for j in contrast_idx, row by row."""
  out = np.zeros(contrast_idx.shape)
  for b in range(contrast_idx.shape[0]):
    for k in range(contrast_idx.shape[1]):
      out[b, k] = np.exp(np.dot(bank[contrast_idx[b, k]], e[b]) / tau)
  return out


def np_nce(p, n):
  k = p.shape[1] - 1
  pn = 1.0 / n
  log_d1 = np.log(p[:, 0] / (p[:, 0] + k * pn + 1e-7))
  log_d0 = np.log(k * pn / (p[:, 1:] + k * pn + 1e-7))
  return -(log_d1.sum() + log_d0.sum()) / p.shape[0]


def np_update(bank, idx, e, m):
  bank = bank.copy()
  for row, i in enumerate(idx):
    v = bank[i] * m + e[row] * (1 - m)
    bank[i] = v / np.linalg.norm(v)
  return bank


def test_crd_loss_matches_numpy_over_two_batches():
  rng = np.random.default_rng(1)
  n, f, k, tau, m = N_SRV, 4, 5, 0.07, 0.5
  stdv = 1 / np.sqrt(f / 3)
  mem_s = rng.uniform(-stdv, stdv, (n, f))
  mem_t = rng.uniform(-stdv, stdv, (n, f))
  batches = [  # (index, real rows); the second batch has a padded last row
      (np.array([3, 0, 7, 10]), 4), (np.array([1, 5, 11, 0]), 3)]
  z_s = z_t = -1.0
  jz_s = jz_t = -jnp.ones(())
  jmem_s, jmem_t = jnp.asarray(mem_s, jnp.float32), jnp.asarray(mem_t,
                                                                 jnp.float32)
  loss_fn = jax.jit(transfer.crd_loss, static_argnames="temperature")
  update = jax.jit(nce.update_memory, static_argnames="momentum")
  for step, (idx, real) in enumerate(batches):
    e_s = np_unit(rng.normal(size=(4, f)))
    e_t = np_unit(rng.normal(size=(4, f)))
    neg = rng.integers(0, n, (4, k))
    mask = (np.arange(4) < real).astype(np.float32)
    # numpy: only the real rows exist
    c_idx = np.concatenate([idx[:real, None], neg[:real]], axis=1)
    out_s = np_scores(mem_t, e_s[:real], c_idx, tau)  # PM bank, student emb
    out_t = np_scores(mem_s, e_t[:real], c_idx, tau)  # student bank, PM emb
    if z_s < 0:
      z_s, z_t = out_s.mean() * n, out_t.mean() * n
    want = np_nce(out_s / z_s, n) + np_nce(out_t / z_t, n)
    mem_s = np_update(mem_s, idx[:real], e_s[:real], m)
    mem_t = np_update(mem_t, idx[:real], e_t[:real], m)
    # jax
    args = [jnp.asarray(a, jnp.float32) for a in (e_s, e_t)]
    loss, (jz_s, jz_t) = loss_fn(
        *args, jnp.asarray(idx), jnp.asarray(neg), jmem_s, jmem_t, jz_s,
        jz_t, temperature=tau, mask=jnp.asarray(mask))
    jmem_s = update(jmem_s, jnp.asarray(idx), args[0], momentum=m,
                    mask=jnp.asarray(mask))
    jmem_t = update(jmem_t, jnp.asarray(idx), args[1], momentum=m,
                    mask=jnp.asarray(mask))
    np.testing.assert_allclose(loss, want, rtol=2e-5, err_msg=f"step {step}")
    np.testing.assert_allclose([jz_s, jz_t], [z_s, z_t], rtol=2e-5)
    np.testing.assert_allclose(jmem_s, mem_s, atol=1e-6)
    np.testing.assert_allclose(jmem_t, mem_t, atol=1e-6)


def test_contrast_scores_gather_and_matmul_paths_agree():
  rng = np.random.default_rng(2)
  bank = jnp.asarray(rng.normal(size=(50, 4)), jnp.float32)
  e = jnp.asarray(np_unit(rng.normal(size=(3, 4))), jnp.float32)
  few = jnp.asarray(rng.integers(0, 50, (3, 4)))      # 12 < 50: gather path
  many = jnp.asarray(rng.integers(0, 50, (3, 20)))    # 60 >= 50: matmul path
  for idx in (few, many):
    np.testing.assert_allclose(
        nce.contrast_scores(bank, e, idx, 0.5),
        np_scores(np.asarray(bank), np.asarray(e), np.asarray(idx), 0.5),
        rtol=1e-5)


def test_kd_loss_matches_numpy():
  rng = np.random.default_rng(3)
  s_logits, t_logits = rng.normal(size=(2, 4, 3)) * 3
  mask = np.array([1.0, 1.0, 1.0, 0.0])
  temp = 4.0

  def softmax(v):
    v = np.exp(v - v.max(-1, keepdims=True))
    return v / v.sum(-1, keepdims=True)

  p_s, p_t = softmax(s_logits[:3] / temp), softmax(t_logits[:3] / temp)
  want = (p_t * np.log(p_t / p_s)).sum() / 3 * temp**2
  got = jax.jit(nce.kd_loss, static_argnums=2)(
      jnp.asarray(s_logits, jnp.float32), jnp.asarray(t_logits, jnp.float32),
      temp, jnp.asarray(mask))
  np.testing.assert_allclose(got, want, rtol=1e-5)


# ------------------------------------------------------------- negatives, banks


def test_negatives_are_other_classes_uniform_and_cover_them():
  # unequal class sizes 5, 4, 3, interleaved
  y = np.asarray([0, 0, 1, 0, 2, 1, 0, 2, 1, 0, 1, 2], np.int32)
  table = nce.class_table(y)
  keys = jax.random.split(jax.random.PRNGKey(3), N_SRV)
  k = 4000
  neg = np.asarray(nce.sample_negatives(keys, jnp.asarray(y), table, k))
  assert neg.shape == (N_SRV, k)
  for i in range(N_SRV):
    others = np.flatnonzero(y != y[i])
    assert np.all(y[neg[i]] != y[i])
    counts = np.bincount(neg[i], minlength=N_SRV)[others]
    assert np.all(counts > 0), f"example {i} misses negatives"
    expected = k / len(others)
    assert np.all(np.abs(counts - expected) < 0.2 * expected), counts


def test_update_memory_unit_norm_and_padding_untouched():
  rng = np.random.default_rng(4)
  memory = jnp.asarray(rng.uniform(-1, 1, (8, 3)), jnp.float32)
  e = jnp.asarray(rng.normal(size=(3, 3)), jnp.float32)
  new = nce.update_memory(memory, jnp.array([6, 2, 0]), e, 0.5,
                          jnp.array([1.0, 1.0, 0.0]))
  np.testing.assert_allclose(np.linalg.norm(np.asarray(new)[[6, 2]], axis=1),
                             1.0,
                             rtol=1e-6)
  untouched = [0, 1, 3, 4, 5, 7]
  np.testing.assert_array_equal(np.asarray(new)[untouched],
                                np.asarray(memory)[untouched])


def test_minibatch_positions_are_shuffled_passes():
  pos = np.asarray(crd.minibatch_positions(jax.random.PRNGKey(0), 12, 5, 7))
  assert pos.shape == (7, 5)
  first, second = pos[:3].ravel(), pos[3:6].ravel()
  for one_pass in (first, second):
    assert sorted(one_pass[one_pass >= 0]) == list(range(12))
    np.testing.assert_array_equal(one_pass[12:], -1)  # padding at the end
  assert not np.array_equal(first, second)
  assert np.all(pos[6] >= 0)


# ------------------------------------------------------------- grad R_h


def real_rows(server, rows):
  x, y = np.asarray(server["x"])[rows], np.asarray(server["y"])[rows]
  return {"x": x, "y": y, "mask": np.ones((len(rows),), np.float32)}


ce_value_and_grad = jax.jit(jax.value_and_grad(tiny.loss_fn))


@jax.jit
def round_positions(key, step):
  """The documented minibatches of a round: batch_size 5, 3 steps."""
  order_key = jax.random.split(jax.random.fold_in(key, step))[0]
  return crd.minibatch_positions(order_key, N_SRV, 5, 3)


FULL = dict(feat_dim=4, nce_k=7, kd_weight=0.3)  # CE + KD + CRD


def padded_server():
  """SERVER plus two padded rows full of garbage."""
  server = {k: jnp.concatenate([v, v[:2]]) for k, v in SERVER.items()}
  server["x"] = server["x"].at[N_SRV:].set(1e4)
  server["mask"] = server["mask"].at[N_SRV:].set(0.0)
  return server


@functools.lru_cache(maxsize=None)
def padded_rounds():
  """Two rounds on the padded split, batch_size 16 (12 real rows + 4 padded),
  differentiated w.r.t. the PM's parameters (which R_h must not see).

  Returns ``(state0, (reg_grad, state1, metrics), state2, pm_grad)``.
  """
  config = transfer.CRDConfig(batch_size=16, **FULL)
  state0 = build(config, server=padded_server())[0](
      jax.random.PRNGKey(8), STUDENT)

  def r_h_of_teacher(teacher):
    _, grad_fn = build(config, teacher=teacher, server=padded_server())
    first = grad_fn(STUDENT, state0)
    second = grad_fn(STUDENT, first[1])
    return first[2]["r_h"] + second[2]["r_h"], (first, second[1])

  pm_grad, (first, state2) = jax.grad(r_h_of_teacher, has_aux=True)(TEACHER)
  return state0, first, state2, pm_grad


def test_crd_round_gradient_heads_banks_and_frozen_pm():
  teacher_before = jax.tree.map(np.array, TEACHER)
  state, (reg_grad, new_state, metrics), third, pm_grad = padded_rounds()
  assert state.memory_s.shape == (N_SRV, 4)
  assert state.heads["embed_s"]["kernel"].shape == (tiny.H, 4)
  assert state.heads["embed_t"]["kernel"].shape == (6, 4)
  assert np.all(np.abs(state.memory_t) <= 1 / np.sqrt(4 / 3))
  for name, leaf in reg_grad.items():
    assert np.abs(leaf).max() > 0, name
  for head in ("embed_s", "embed_t"):
    assert not np.allclose(new_state.heads[head]["kernel"],
                           state.heads[head]["kernel"])
  assert new_state.z_s > 0 and new_state.z_t > 0 and int(new_state.step) == 1
  for memory in (new_state.memory_s, new_state.memory_t):  # all rows seen
    np.testing.assert_allclose(np.linalg.norm(memory, axis=1), 1.0,
                               rtol=1e-5)
  assert set(metrics) == {"r_h", "ce", "crd", "kd"}
  assert all(np.isfinite(v) for v in metrics.values())
  np.testing.assert_allclose(
      metrics["r_h"],
      metrics["ce"] + 0.3 * metrics["kd"] + 0.8 * metrics["crd"], rtol=1e-6)
  # the Z's stay fixed in later rounds
  assert third.z_s == new_state.z_s and third.z_t == new_state.z_t
  assert int(third.step) == 2
  # PM: untouched, and no gradient reaches it through R_h
  jax.tree.map(np.testing.assert_array_equal, TEACHER, teacher_before)
  for leaf in jax.tree.leaves(pm_grad):
    np.testing.assert_array_equal(leaf, 0.0)


def test_padding_and_the_loop_change_nothing():
  # 12 real rows as exactly one batch of 12 (Python loop), vs one batch of 16
  # (4 padded rows, lax.scan) drawn from a server split with two padded
  # garbage rows.
  init_fn, grad_fn = build(transfer.CRDConfig(batch_size=12, loop="python",
                                              **FULL))
  state = init_fn(jax.random.PRNGKey(8), STUDENT)
  state0, padded, _, _ = padded_rounds()
  jax.tree.map(np.testing.assert_array_equal, state, state0)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
      grad_fn(STUDENT, state), padded)


@pytest.mark.parametrize("conv_impl", ["patches", "xla"])
def test_auto_loop_is_python_only_for_xla_convolutions_on_cpu(conv_impl):
  from augfl_jax import models  # pylint: disable=g-import-not-at-top
  model = models.create_model("cnn", 10, conv_impl=conv_impl)
  x = jnp.zeros((4, 28, 28, 1))
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  loop = crd.default_loop(models.make_features_fn(model), params, x)
  on_cpu = jax.default_backend() == "cpu"
  assert loop == ("python" if on_cpu and conv_impl == "xla" else "scan")
  # no convolution at all: the scan
  assert crd.default_loop(apply_fn, STUDENT, SERVER["x"][:4]) == "scan"


def test_gradient_is_the_mean_of_per_batch_gradients():
  # CE only: a deterministic R_h; 12 examples in batches of 5, 5 and 2 (the
  # last one padded), computed by hand on the real rows of each batch.
  config = transfer.CRDConfig(feat_dim=4, nce_k=5, batch_size=5,
                              crd_weight=0.0)
  init_fn, grad_fn = build(config)
  state = init_fn(jax.random.PRNGKey(6), STUDENT)
  orders = []
  for _ in range(2):  # two rounds, two different shuffles
    pos = np.asarray(round_positions(state.key, state.step))
    orders.append(pos)
    rows = [p[p >= 0] for p in pos]
    assert sorted(np.concatenate(rows)) == list(range(N_SRV))
    losses, grads = zip(*[ce_value_and_grad(STUDENT, real_rows(SERVER, r))
                          for r in rows])
    want = jax.tree.map(lambda *g: sum(g) / 3, *grads)
    reg_grad, state, metrics = grad_fn(STUDENT, state)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                 reg_grad, want)
    np.testing.assert_allclose(metrics["r_h"], np.mean(losses), rtol=1e-5)
    np.testing.assert_allclose(metrics["ce"], np.mean(losses), rtol=1e-5)
  assert not np.array_equal(orders[0], orders[1])


# ------------------------------------------------------------- L2, none, config


def test_l2_gradient_and_value():
  theta_p = tiny.init(jax.random.PRNGKey(9))
  init_fn, grad_fn = transfer.make_regularizer("l2", pm_params=theta_p)
  assert init_fn(jax.random.PRNGKey(0), STUDENT) is None
  reg_grad, state, metrics = grad_fn(STUDENT, None)
  assert state is None
  diff = {k: np.asarray(STUDENT[k]) - np.asarray(theta_p[k]) for k in STUDENT}
  for k in STUDENT:
    np.testing.assert_allclose(reg_grad[k], 2 * diff[k], rtol=1e-6)
  np.testing.assert_allclose(
      metrics["r_h"], sum((d**2).sum() for d in diff.values()), rtol=1e-5)


@pytest.mark.parametrize("pm", [tiny.init(jax.random.PRNGKey(0), h=6),
                                {"w1": jnp.zeros((tiny.D, tiny.H))}])
def test_l2_rejects_other_architectures(pm):
  init_fn, grad_fn = transfer.make_l2_regularizer(pm)
  for call in (lambda: init_fn(jax.random.PRNGKey(0), STUDENT),
               lambda: grad_fn(STUDENT, None)):
    with pytest.raises(ValueError, match="client model's architecture.*"
                       "use --regularizer=crd"):
      call()


def test_none_and_registry():
  init_fn, grad_fn = transfer.make_regularizer("none")
  reg_grad, state, metrics = grad_fn(STUDENT, init_fn(None, STUDENT))
  assert state is None and float(metrics["r_h"]) == 0.0
  for leaf in jax.tree.leaves(reg_grad):
    np.testing.assert_array_equal(leaf, 0.0)
  assert transfer.REGULARIZERS == ("crd", "l2", "none")
  with pytest.raises(ValueError, match="Unknown regularizer"):
    transfer.make_regularizer("kd")
  with pytest.raises(ValueError, match="teacher_apply"):
    transfer.make_regularizer("crd", student_apply=apply_fn, server=SERVER)
  with pytest.raises(ValueError, match="pm_params"):
    transfer.make_regularizer("l2")


@pytest.mark.parametrize("bad", [dict(nce_k=0), dict(nce_t=0.0),
                                 dict(nce_m=1.5), dict(kt_steps=0),
                                 dict(crd_weight=-1.0), dict(batch_size=0),
                                 dict(head_momentum=1.0), dict(loop="vmap")])
def test_config_validation(bad):
  with pytest.raises(ValueError):
    transfer.CRDConfig(**bad)


def test_kd_needs_matching_classes():
  teacher = tiny.init(jax.random.PRNGKey(1), h=6, k=5)
  init_fn, _ = build(transfer.CRDConfig(feat_dim=4, nce_k=5, kd_weight=1.0),
                     teacher=teacher)
  with pytest.raises(ValueError, match="same classes"):
    init_fn(jax.random.PRNGKey(0), STUDENT)


def test_server_with_one_class_is_rejected():
  server = dict(SERVER, y=jnp.zeros((N_SRV,), jnp.int32))
  with pytest.raises(ValueError, match="two classes"):
    build(transfer.CRDConfig(feat_dim=4, nce_k=5), server=server)
