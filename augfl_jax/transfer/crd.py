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
the gradient w.r.t. the client-model parameters, all at theta^t (the
paper's Eq. (13)), while the heads take one SGD step per minibatch (as they
would in the reference's distillation loop). The PM is frozen: its outputs
pass through ``stop_gradient``.

Where the authors' code does more than the paper states, :class:`CRDConfig`
has a field, its default the reference's where the paper is silent:
``head_lr`` 0.002 and ``reset_head_optimizer`` (a new SGD for the heads every
round), as the reference's launcher; ``student_lr`` (0, the paper's
theta^t, by default: the reference's copy of the client model moves by
weight decay alone, since it zeroes the copy's gradients before each step;
> 0 moves a copy along the KT gradients) and ``augment`` (the reference crops and flips the server images;
``"none"`` by default, so that a PM whose outputs do not depend on the batch
is run on the server split once per run instead of every round).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from augfl_jax.models import masked_mean
from augfl_jax.transfer.crd_config import CRDConfig
from augfl_jax.transfer.nce import (class_table, crd_loss, embed,
                                    init_arrays, kd_loss, sample_negatives,
                                    update_memory)
from augfl_jax.transfer.shared_negatives import (crd_loss_shared,
                                                 sample_shared)
from augfl_jax.transfer.server_data import (all_outputs, crop_flip,
                                            minibatch_positions,
                                            server_arrays)
from augfl_jax.core import jit
from augfl_jax.core.types import Batch, Params, PRNGKey

__all__ = [
    "CRDState", "default_loop", "make_crd_regularizer", "StudentApply",
    "TeacherApply"
]


# student_apply(params, x [B, ...], mask [B]) -> (features [B, d_s], logits)
StudentApply = Callable[[Params, jax.Array, jax.Array], tuple[jax.Array,
                                                               jax.Array]]
# teacher_apply(x, mask) -> (features [B, d_t], logits); PM params closed over.
TeacherApply = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def default_loop(student_apply: StudentApply, student_params: Params,
                 x: jax.Array) -> str:
  """The minibatch loop ``CRDConfig(loop="auto")`` runs for this client
  model on a minibatch like ``x [B, ...]``: ``"python"`` on CPU when its
  forward pass holds an XLA convolution (XLA:CPU runs ``lax.conv`` inside
  a ``lax.scan`` body about 10x slower than outside one), else ``"scan"``
  (faster: 1.35x for the cnn with patch convolutions,
  benchmarks/RESULTS.md §14)."""
  if jax.default_backend() != "cpu":
    return "scan"
  jaxpr = jax.make_jaxpr(student_apply)(
      student_params, x, jnp.ones(x.shape[:1], jnp.float32))
  return "python" if "conv_general_dilated" in str(jaxpr) else "scan"


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


# ---------------------------------------------------------------- regulariser


def make_crd_regularizer(student_apply: StudentApply,
                         teacher_apply: TeacherApply, server: Batch,
                         config: CRDConfig | None = None, *,
                         teacher_per_example: bool = False):
  """``(init_fn, grad_fn)`` of R_h = CE + KD + CRD on the server split.

  Args:
    student_apply: ``(params, x, mask) -> (features, logits)``, the client
      model.
    teacher_apply: ``(x, mask) -> (features, logits)``, the frozen PM with its
      parameters closed over.
    server: ``{"x": [n, ...], "y": [n], "mask": [n], ...}``; padded rows
      (mask 0) are dropped and bank row j is the j-th real example.
    config: :class:`CRDConfig` (default: the reference's).
    teacher_per_example: the PM's output for an example does not depend on
      the rest of its batch (running batch-norm statistics, GroupNorm, no
      norm). Then, without augmentation, the PM runs over the server split
      once, here, and every minibatch reads its rows.

  Returns:
    ``init_fn(key, student_params) -> CRDState`` and
    ``grad_fn(student_params, state) -> (reg_grad, state, metrics)``:
    ``reg_grad = (1/S) sum_b grad_theta R_h^b(theta_b)`` over S = kt_steps
    minibatches of round ``state.step``, drawn by
    ``minibatch_positions(jax.random.split(jax.random.fold_in(state.key,
    state.step))[0], n, batch_size, S)``, with ``theta_b = theta^t`` (or the
    moving copy of ``student_lr > 0``); metrics (means over minibatches):
    ``r_h``, ``ce``, ``crd`` and, when ``kd_weight > 0``, ``kd``.
    ``grad_fn`` runs jitted code (one jit, or one per minibatch with
    ``loop="python"``); the server data and the PM's parameters (hoisted from
    ``teacher_apply``'s closure) travel as jit arguments, not as compile-time
    constants.
  """
  config = config or CRDConfig()
  x_all, y_np = server_arrays(server)
  y_all = jnp.asarray(y_np)
  n = int(y_np.shape[0])
  table = class_table(y_np)
  batch_size = config.batch_size
  steps = config.kt_steps or -(-n // batch_size)
  tx = optax.chain(optax.add_decayed_weights(config.head_weight_decay),
                   optax.sgd(config.head_lr, config.head_momentum))
  student_tx = optax.chain(optax.add_decayed_weights(config.head_weight_decay),
                           optax.sgd(config.student_lr, config.head_momentum))
  moving = config.student_lr > 0
  shared = config.negative_sampling == "shared"
  teacher_fn, teacher_consts = jit.hoist(
      teacher_apply, jax.ShapeDtypeStruct((batch_size,) + x_all.shape[1:],
                                          x_all.dtype),
      jax.ShapeDtypeStruct((batch_size,), jnp.float32))
  cached = teacher_per_example and config.augment == "none"
  if cached:  # the PM's features and logits of every server example
    teacher_consts = all_outputs(teacher_fn, teacher_consts, x_all,
                                 batch_size)
  # The value of a black pixel, per channel, for the crop's padding.
  fill = jnp.min(x_all.reshape(-1, x_all.shape[-1]), axis=0)

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
    heads, memory_s, memory_t, k_root = init_arrays(key, d_s, d_t, n,
                                                     config.feat_dim)
    bank_dtype = jnp.dtype(config.bank_dtype)
    return CRDState(heads=heads, head_opt_state=tx.init(heads),
                    memory_s=memory_s.astype(bank_dtype),
                    memory_t=memory_t.astype(bank_dtype),
                    z_s=-jnp.ones(()), z_t=-jnp.ones(()), key=k_root,
                    step=jnp.zeros((), jnp.int32))

  def minibatch(student_params, carry, inputs, x_all, y_all, table,
                teacher_data):
    """One minibatch: grads, one head step (and one student step), bank
    updates."""
    (heads, opt_state, mem_s, mem_t, z_s, z_t, neg_key, order_key, student,
     student_opt) = carry
    step_idx, pos = inputs
    mask = (pos >= 0).astype(jnp.float32)
    index = jnp.maximum(pos, 0)
    x = x_all[index]
    if config.augment == "crop_flip":
      x = crop_flip(jax.vmap(jax.random.fold_in, (None, 0))(
          jax.random.fold_in(order_key, step_idx), index), x, fill)
    x = jnp.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)) > 0, x, 0)
    y = y_all[index]
    if cached:
      f_t, logits_t = jax.tree.map(lambda a: a[index], teacher_data)
    else:
      f_t, logits_t = teacher_fn(teacher_data, x, mask)
    f_t, logits_t = jax.lax.stop_gradient((f_t, logits_t))
    step_key = jax.random.fold_in(neg_key, step_idx)
    if shared:
      negatives = sample_shared(step_key, config.negatives, n)
    else:
      row_keys = jax.vmap(jax.random.fold_in, (None, 0))(step_key, index)
      negatives = sample_negatives(row_keys, y, table, config.negatives)

    def loss_fn(params, heads):
      f_s, logits_s = student_apply(params, x, mask)
      e_s = embed(heads["embed_s"], f_s, mask)
      e_t = embed(heads["embed_t"], f_t, mask)
      if shared:
        crd, zs = crd_loss_shared(e_s, e_t, index, y, negatives, table,
                                  y_all, mem_s, mem_t, z_s, z_t,
                                  temperature=config.nce_t, mask=mask)
      else:
        crd, zs = crd_loss(e_s, e_t, index, negatives, mem_s, mem_t, z_s,
                           z_t, temperature=config.nce_t, mask=mask)
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

    at = student if moving else student_params
    (_, (zs, e_s, e_t, metrics)), (g_params, g_heads) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(at, heads)
    updates, opt_state = tx.update(g_heads, opt_state, heads)
    heads = optax.apply_updates(heads, updates)
    if moving:
      updates, student_opt = student_tx.update(g_params, student_opt, student)
      student = optax.apply_updates(student, updates)
    mem_s = update_memory(mem_s, index, e_s, config.nce_m, mask)
    mem_t = update_memory(mem_t, index, e_t, config.nce_m, mask)
    carry = (heads, opt_state, mem_s, mem_t, zs[0], zs[1], neg_key,
             order_key, student, student_opt)
    return carry, (g_params, metrics)

  def start(student_params, state):
    order_key, neg_key = jax.random.split(
        jax.random.fold_in(state.key, state.step))
    opt_state = (tx.init(state.heads) if config.reset_head_optimizer
                 else state.head_opt_state)
    student = student_params if moving else None
    carry = (state.heads, opt_state, state.memory_s, state.memory_t,
             state.z_s, state.z_t, neg_key, order_key, student,
             student_tx.init(student_params) if moving else None)
    return ((carry, optax.tree.zeros_like(student_params)),
            minibatch_positions(order_key, n, batch_size, steps))

  def body(student_params, data, carry, inputs):
    carry, grads_sum = carry
    carry, (g, metrics) = minibatch(student_params, carry, inputs, *data)
    return (carry, optax.tree.add(grads_sum, g)), metrics

  def finish(state, carry, metrics):
    (heads, opt_state, mem_s, mem_t, z_s, z_t, *_), grads_sum = carry
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
  round_fns = {"scan": scan_round, "python": python_round}
  loop = [None if config.loop == "auto" else config.loop]

  def grad_fn(student_params: Params, state: CRDState
             ) -> tuple[Params, CRDState, dict[str, Any]]:
    if loop[0] is None:  # "auto", chosen on the first call
      loop[0] = default_loop(student_apply, student_params,
                             x_all[:batch_size])
    return round_fns[loop[0]](student_params, state, data)

  return init_fn, grad_fn
