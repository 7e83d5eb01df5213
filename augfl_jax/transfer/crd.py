"""Contrastive representation distillation (CRD) as AugFL's server R_h.

AugFL Section V; Tian et al., "Contrastive Representation
Distillation", ICLR 2020 (reference: HobbitLong/RepDistiller, ``crd/``).

On server examples x with dataset index i and label y:

* ``e_s = normalize(embed_s(s(x)))``, ``e_t = normalize(embed_t(c(x)))``: the
  penultimate features of the client model (s) and of the frozen PM (c) through
  two trainable linear heads, each row L2-normalised.
* Two memory banks ``memory_s``, ``memory_t`` of shape ``[n, feat_dim]`` (n the
  number of server examples), K negatives per example from other classes,
  the normalisation constants Z fixed on the first batch, the NCE loss in both
  directions and the momentum update of the banks: ``augfl_jax.transfer.nce``.

``R_h = ce_weight CE(student logits, y) + kd_weight KD + crd_weight CRD`` per
minibatch; ``grad R_h(theta^t)`` is the mean over ``kt_steps`` minibatches of
the gradient w.r.t. the client-model parameters, all at theta^t, while the
heads take one SGD step per minibatch (as they would in the reference's
distillation loop). The PM is frozen: its outputs pass through
``stop_gradient``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from augfl_jax.fields import field
from augfl_jax.models import masked_mean
from augfl_jax.transfer.nce import (HIGHEST, class_table, crd_loss, kd_loss,
                                    sample_negatives, update_memory)
from augfl_jax.types import Batch, Params, PRNGKey

LOOPS = ("scan", "python")
REFERENCE_NCE_K = 16384

# student_apply(params, x [B, ...], mask [B]) -> (features [B, d_s], logits)
StudentApply = Callable[[Params, jax.Array, jax.Array], tuple[jax.Array,
                                                               jax.Array]]
# teacher_apply(x, mask) -> (features [B, d_t], logits); PM params closed over.
TeacherApply = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class CRDConfig:
  """Hyper-parameters of the CRD regulariser (RepDistiller's defaults).

  ``loop``: how the minibatches run: ``"scan"`` (one jitted ``lax.scan``),
  ``"python"`` (a Python loop over a jitted minibatch step; same numbers) or
  ``"auto"`` (``"python"`` on CPU, ``"scan"`` elsewhere). XLA:CPU runs
  ``lax.conv`` inside a loop body roughly 10x slower than outside one (a
  CNN round: 14 s vs 1 s of CPU time).
  """

  feat_dim: int = field(128, "embedding size of the two heads and the banks")
  nce_k: int | None = field(
      None, "K, negatives per example, drawn with replacement from other "
      "classes (may exceed the server size; default the reference's 16384; "
      "digits 1024)")
  nce_t: float = field(0.07, "NCE temperature tau")
  nce_m: float = field(0.5, "momentum m of the memory banks")
  ce_weight: float = field(1.0, "weight of CE(student, server labels) in "
                           "R_h (the reference's 1.0)")
  kd_weight: float = field(0.0, "weight of KD(student, PM) in R_h (the "
                           "reference's 0)")
  crd_weight: float = field(0.8, "weight of CRD in R_h (the reference's "
                            "0.8)")
  kd_temperature: float = field(4.0, "temperature T of the KD term")
  batch_size: int = field(128, "server minibatch size")
  kt_steps: int | None = field(
      None, "minibatches per round (default one pass over the server "
      "split, ceil(n / batch_size), the last one partial)")
  head_lr: float = field(0.05, "SGD learning rate of the two embedding "
                         "heads")
  head_momentum: float = field(0.9, "SGD momentum of the embedding heads")
  head_weight_decay: float = field(5e-4, "weight decay of the embedding "
                                   "heads")
  loop: str = field("auto", "how the minibatches run: scan, python (same "
                    "numbers) or auto (python on CPU, scan elsewhere)",
                    choices=LOOPS + ("auto",))

  def __post_init__(self):
    if self.loop not in LOOPS + ("auto",):
      raise ValueError(
          f"loop must be one of {LOOPS + ('auto',)}, got {self.loop!r}")
    for name in ("feat_dim", "nce_k", "batch_size"):
      value = getattr(self, name)
      if value is not None and int(value) < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    if self.kt_steps is not None and self.kt_steps < 1:
      raise ValueError(
          f"kt_steps must be >= 1 or None (one pass), got {self.kt_steps}")
    if not self.nce_t > 0:
      raise ValueError(f"nce_t must be > 0, got {self.nce_t}")
    if not 0.0 <= self.nce_m <= 1.0:
      raise ValueError(f"nce_m must be in [0, 1], got {self.nce_m}")
    if not self.kd_temperature > 0:
      raise ValueError(
          f"kd_temperature must be > 0, got {self.kd_temperature}")
    for name in ("ce_weight", "kd_weight", "crd_weight", "head_lr",
                 "head_weight_decay"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
    if not 0.0 <= self.head_momentum < 1.0:
      raise ValueError(
          f"head_momentum must be in [0, 1), got {self.head_momentum}")

  @property
  def negatives(self) -> int:
    """K: ``nce_k``, or the reference's 16384 when it is None."""
    return REFERENCE_NCE_K if self.nce_k is None else self.nce_k

  @property
  def resolved_loop(self) -> str:
    """``loop`` with ``"auto"`` replaced by the backend's choice."""
    if self.loop != "auto":
      return self.loop
    return "python" if jax.default_backend() == "cpu" else "scan"


@flax.struct.dataclass
class CRDState:
  """Server-side CRD state, one pytree carried across rounds.

  Attributes:
    heads: ``{"embed_s": {"kernel": [d_s, F], "bias": [F]}, "embed_t":
      {"kernel": [d_t, F], "bias": [F]}}`` (F = feat_dim).
    head_opt_state: optax state of the heads' SGD.
    memory_s: ``[n, F]`` bank of student embeddings (row j: server example j).
    memory_t: ``[n, F]`` bank of PM embeddings.
    z_s: scalar Z of the scores of e_s (against ``memory_t``); < 0 until set.
    z_t: scalar Z of the scores of e_t (against ``memory_s``); < 0 until set.
    key: root PRNG key of the knowledge transfer.
    step: scalar int32, rounds (``grad_fn`` calls) done.
  """

  heads: Params
  head_opt_state: optax.OptState
  memory_s: jax.Array
  memory_t: jax.Array
  z_s: jax.Array
  z_t: jax.Array
  key: PRNGKey
  step: jax.Array


# ---------------------------------------------------------------- heads


def init_head(key: PRNGKey, dim_in: int, dim_out: int) -> Params:
  """``nn.Linear(dim_in, dim_out)`` params as PyTorch initialises them.

  Kernel and bias uniform in ``[-1/sqrt(dim_in), 1/sqrt(dim_in)]``.
  """
  bound = 1.0 / math.sqrt(dim_in)
  k_w, k_b = jax.random.split(key)
  return {"kernel": jax.random.uniform(k_w, (dim_in, dim_out), jnp.float32,
                                       -bound, bound),
          "bias": jax.random.uniform(k_b, (dim_out,), jnp.float32,
                                     -bound, bound)}


def embed(head: Params, features: jax.Array,
          mask: jax.Array | None = None) -> jax.Array:
  """``normalize(flatten(features) @ kernel + bias)``: ``[B, ...] -> [B, F]``.

  Padded rows (mask 0) are replaced before normalising so that they can never
  produce a NaN, not even in a gradient.
  """
  x = features.reshape(features.shape[0], -1).astype(jnp.float32)
  z = jnp.dot(x, head["kernel"], precision=HIGHEST) + head["bias"]
  if mask is not None:
    z = jnp.where(mask[:, None] > 0, z, 1.0)
  return z / jnp.sqrt(jnp.sum(z * z, axis=-1, keepdims=True))


# ---------------------------------------------------------------- minibatches


def minibatch_positions(key: PRNGKey, n: int, batch_size: int,
                        steps: int) -> jax.Array:
  """``[steps, batch_size]`` int32 server positions, -1 for padding.

  Shuffled passes over ``0..n-1``, each cut into ``ceil(n / batch_size)``
  minibatches, the last one padded (DataLoader with ``drop_last=False``);
  the first ``steps`` minibatches are kept. Pass p is the argsort of
  ``jax.random.bits(key, (passes, n))[p]`` (ties, probability ~ n^2 / 2^33,
  keep index order).
  """
  per_pass = -(-n // batch_size)
  passes = -(-steps // per_pass)
  order = jnp.argsort(jax.random.bits(key, (passes, n), jnp.uint32),
                      axis=-1).astype(jnp.int32)
  order = jnp.pad(order, ((0, 0), (0, per_pass * batch_size - n)),
                  constant_values=-1)
  return order.reshape(passes * per_pass, batch_size)[:steps]


# ---------------------------------------------------------------- regulariser


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _init_arrays(key: PRNGKey, d_s: int, d_t: int, n: int, feat_dim: int):
  """Heads (PyTorch init), banks U[-1/sqrt(F/3), 1/sqrt(F/3)], root key."""
  k_s, k_t, k_ms, k_mt, k_root = jax.random.split(key, 5)
  heads = {"embed_s": init_head(k_s, d_s, feat_dim),
           "embed_t": init_head(k_t, d_t, feat_dim)}
  stdv = 1.0 / math.sqrt(feat_dim / 3)
  bank = lambda k: jax.random.uniform(k, (n, feat_dim), jnp.float32, -stdv,
                                      stdv)
  return heads, bank(k_ms), bank(k_mt), k_root


def _server_arrays(server: Batch) -> tuple[jax.Array, np.ndarray]:
  """The real rows of the server split: ``(x [n, ...], y [n] numpy)``."""
  if "x" not in server or "y" not in server:
    raise ValueError("server must be a Batch with 'x' and 'y' (and 'mask')")
  y = np.asarray(server["y"])
  mask = np.asarray(server.get("mask", np.ones(y.shape[0])))
  if y.ndim != 1 or mask.shape != y.shape:
    raise ValueError(f"server 'y' and 'mask' must be [n]; got {y.shape} "
                     f"and {mask.shape}")
  real = mask > 0
  x = server["x"] if real.all() else jnp.asarray(np.asarray(server["x"])[real])
  y = y[real]
  if y.size < 2 or np.unique(y).size < 2:
    raise ValueError(
        "CRD needs a server split with at least two classes (negatives come "
        f"from other classes); got {y.size} examples of classes "
        f"{np.unique(y).tolist()}")
  if y.min() < 0:
    raise ValueError(f"server labels must be >= 0, got min {y.min()}")
  return jnp.asarray(x), y.astype(np.int32)


def _hoist_constants(fn: Callable[..., Any], *specs: jax.ShapeDtypeStruct):
  """``(fn2, consts)`` with ``fn2(consts, *args) == fn(*args)``.

  ``fn`` (the PM, parameters closed over) is traced once for arguments of
  the shapes ``specs``; the arrays it closes over become ``consts``, so a jit
  of ``fn2`` takes them as arguments instead of baking megabytes of PM
  weights into the compiled program as constants.
  """
  closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*specs)
  out_tree = jax.tree.structure(out_shape)

  def fn2(consts, *args):
    flat = jax.core.eval_jaxpr(closed.jaxpr, consts, *args)
    return jax.tree.unflatten(out_tree, flat)

  return fn2, list(closed.consts)


def make_crd_regularizer(student_apply: StudentApply,
                         teacher_apply: TeacherApply, server: Batch,
                         config: CRDConfig | None = None):
  """``(init_fn, grad_fn)`` of R_h = CE + KD + CRD on the server split.

  Args:
    student_apply: ``(params, x, mask) -> (features, logits)``, the client
      model.
    teacher_apply: ``(x, mask) -> (features, logits)``, the frozen PM with its
      parameters closed over.
    server: ``{"x": [n, ...], "y": [n], "mask": [n], ...}``; padded rows
      (mask 0) are dropped and bank row j is the j-th real example.
    config: :class:`CRDConfig` (default: the reference's).

  Returns:
    ``init_fn(key, student_params) -> CRDState`` and
    ``grad_fn(student_params, state) -> (reg_grad, state, metrics)``:
    ``reg_grad = (1/S) sum_b grad_theta R_h^b(theta^t)`` over S = kt_steps
    minibatches of round ``state.step``, drawn by
    ``minibatch_positions(jax.random.split(jax.random.fold_in(state.key,
    state.step))[0], n, batch_size, S)``; metrics (means over minibatches):
    ``r_h``, ``ce``, ``crd`` and, when ``kd_weight > 0``, ``kd``.
    ``grad_fn`` runs jitted code (one jit, or one per minibatch with
    ``loop="python"``); the server data and the PM's parameters (hoisted from
    ``teacher_apply``'s closure) travel as jit arguments, not as compile-time
    constants, so do not wrap ``grad_fn`` in another ``jax.jit``.
  """
  config = config or CRDConfig()
  x_all, y_np = _server_arrays(server)
  y_all = jnp.asarray(y_np)
  n = int(y_np.shape[0])
  table = class_table(y_np)
  batch_size = config.batch_size
  steps = config.kt_steps or -(-n // batch_size)
  tx = optax.chain(optax.add_decayed_weights(config.head_weight_decay),
                   optax.sgd(config.head_lr, config.head_momentum))
  teacher_fn, teacher_consts = _hoist_constants(
      teacher_apply, jax.ShapeDtypeStruct((batch_size,) + x_all.shape[1:],
                                          x_all.dtype),
      jax.ShapeDtypeStruct((batch_size,), jnp.float32))

  def init_fn(key: PRNGKey, student_params: Params) -> CRDState:
    x = jax.ShapeDtypeStruct((2,) + x_all.shape[1:], x_all.dtype)
    mask = jax.ShapeDtypeStruct((2,), jnp.float32)
    f_s, logits_s = jax.eval_shape(student_apply, student_params, x, mask)
    f_t, logits_t = jax.eval_shape(teacher_apply, x, mask)
    if config.kd_weight > 0 and logits_s.shape != logits_t.shape:
      raise ValueError(
          "kd_weight > 0 needs the PM and the client model to have the same "
          f"classes; got logits {logits_t.shape} and {logits_s.shape}")
    d_s, d_t = math.prod(f_s.shape[1:]), math.prod(f_t.shape[1:])
    heads, memory_s, memory_t, k_root = _init_arrays(key, d_s, d_t, n,
                                                     config.feat_dim)
    return CRDState(heads=heads, head_opt_state=tx.init(heads),
                    memory_s=memory_s, memory_t=memory_t,
                    z_s=-jnp.ones(()), z_t=-jnp.ones(()), key=k_root,
                    step=jnp.zeros((), jnp.int32))

  def minibatch(student_params, carry, inputs, x_all, y_all, table,
                teacher_consts):
    """One minibatch: grads at theta^t, one head step, bank updates."""
    heads, opt_state, mem_s, mem_t, z_s, z_t, neg_key = carry
    step_idx, pos = inputs
    mask = (pos >= 0).astype(jnp.float32)
    index = jnp.maximum(pos, 0)
    x = x_all[index]
    x = jnp.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)) > 0, x, 0)
    y = y_all[index]
    f_t, logits_t = jax.lax.stop_gradient(teacher_fn(teacher_consts, x, mask))
    row_keys = jax.vmap(jax.random.fold_in, (None, 0))(
        jax.random.fold_in(neg_key, step_idx), index)
    negatives = sample_negatives(row_keys, y, table, config.negatives)

    def loss_fn(params, heads):
      f_s, logits_s = student_apply(params, x, mask)
      e_s = embed(heads["embed_s"], f_s, mask)
      e_t = embed(heads["embed_t"], f_t, mask)
      crd, zs = crd_loss(e_s, e_t, index, negatives, mem_s, mem_t, z_s, z_t,
                         temperature=config.nce_t, mask=mask)
      ce = masked_mean(optax.softmax_cross_entropy_with_integer_labels(
          logits_s.astype(jnp.float32), y), mask)
      metrics = {"ce": ce, "crd": crd}
      total = config.ce_weight * ce + config.crd_weight * crd
      if config.kd_weight > 0:
        metrics["kd"] = kd_loss(logits_s, logits_t, config.kd_temperature,
                                mask)
        total = total + config.kd_weight * metrics["kd"]
      metrics["r_h"] = total
      return total, (zs, e_s, e_t, metrics)

    (_, (zs, e_s, e_t, metrics)), (g_params, g_heads) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(student_params, heads)
    updates, opt_state = tx.update(g_heads, opt_state, heads)
    heads = optax.apply_updates(heads, updates)
    mem_s = update_memory(mem_s, index, e_s, config.nce_m, mask)
    mem_t = update_memory(mem_t, index, e_t, config.nce_m, mask)
    carry = (heads, opt_state, mem_s, mem_t, zs[0], zs[1], neg_key)
    return carry, (g_params, metrics)

  def start(student_params, state):
    order_key, neg_key = jax.random.split(
        jax.random.fold_in(state.key, state.step))
    carry = (state.heads, state.head_opt_state, state.memory_s,
             state.memory_t, state.z_s, state.z_t, neg_key)
    return ((carry, optax.tree.zeros_like(student_params)),
            minibatch_positions(order_key, n, batch_size, steps))

  def body(student_params, data, carry, inputs):
    carry, grads_sum = carry
    carry, (g, metrics) = minibatch(student_params, carry, inputs, *data)
    return (carry, optax.tree.add(grads_sum, g)), metrics

  def finish(state, carry, metrics):
    (heads, opt_state, mem_s, mem_t, z_s, z_t, _), grads_sum = carry
    new_state = state.replace(heads=heads, head_opt_state=opt_state,
                              memory_s=mem_s, memory_t=mem_t, z_s=z_s,
                              z_t=z_t, step=state.step + 1)
    reg_grad = optax.tree.scale(1.0 / steps, grads_sum)
    return reg_grad, new_state, jax.tree.map(jnp.mean, metrics)

  @jax.jit
  def scan_round(student_params, state, data):
    carry, positions = start(student_params, state)
    carry, metrics = jax.lax.scan(
        functools.partial(body, student_params, data), carry,
        (jnp.arange(steps), positions))
    return finish(state, carry, metrics)

  jit_start, jit_body, jit_finish = map(jax.jit, (start, body, finish))

  def python_round(student_params, state, data):
    carry, positions = jit_start(student_params, state)
    positions, metrics = np.asarray(positions), []
    for i in range(steps):
      carry, step_metrics = jit_body(student_params, data, carry,
                                     (np.int32(i), positions[i]))
      metrics.append(step_metrics)
    return jit_finish(state, carry,
                      jax.tree.map(lambda *m: jnp.stack(m), *metrics))

  data = (x_all, y_all, table, teacher_consts)
  round_fn = scan_round if config.resolved_loop == "scan" else python_round

  def grad_fn(student_params: Params, state: CRDState
             ) -> tuple[Params, CRDState, dict[str, Any]]:
    return round_fn(student_params, state, data)

  return init_fn, grad_fn
