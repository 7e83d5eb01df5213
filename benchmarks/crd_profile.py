r"""Where one CRD minibatch's time goes (the server's R_h step, Section V).

  python -m benchmarks.crd_profile --server=10000 --crd.nce_k=16384

One minibatch of the cached-PM CRD step (``transfer.make_crd_regularizer``
with ``teacher_per_example=True``: the PM's outputs are read, not computed)
split into its parts, each jitted on its own and timed round-robin in one
process with the whole minibatch step (the ``loop="python"`` body the server
runs ``ceil(n / batch_size)`` times a round):

* ``student``: the client model's forward and backward on the minibatch
  (``value_and_grad`` of the cross-entropy with respect to its parameters);
* ``negatives``: drawing K negatives of other classes per example;
* ``nce``: the heads, both NCE directions and their backward with respect
  to the heads and the student's features (the student itself excluded);
* ``banks``: the two memory-bank updates;
* ``step``: the whole minibatch (all of the above, the head's SGD step and
  the gradient sum).

Each part's median is reported with its share of the step's median, and the
round's estimate (the step times ``ceil(n / batch_size)``). The client model
is ``--student`` (the cnn by default) on 28x28x1 inputs; the PM's features
are of the PM's width (``--pm_features``) and cost nothing: a cached PM is
only rows to read.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from augfl_jax import models
from augfl_jax import transfer
from augfl_jax.transfer import nce
from augfl_jax.transfer import shared_negatives
from benchmarks import command
from benchmarks import crd_cost

FLAGS = flags.FLAGS
INPUT_SHAPE = (28, 28, 1)


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_integer("server", 10000, "Server-split examples n.",
                       lower_bound=1)
  flags.DEFINE_enum("student", "cnn", models.available_models(),
                    "Client model.")
  flags.DEFINE_integer("num_classes", 10, "Classes of the server split.",
                       lower_bound=2)
  flags.DEFINE_integer("pm_features", 512, "Width of the PM's penultimate "
                       "features (the cnn's 512; at most 784).",
                       lower_bound=1, upper_bound=784)
  flags.DEFINE_integer("crd.batch_size", 128, "CRD minibatch size.")
  flags.DEFINE_integer("crd.nce_k", 16384, "CRD negatives per example.")
  flags.DEFINE_string("crd.negative_sampling", "per_example",
                      "CRDConfig.negative_sampling: per_example or shared.")
  flags.DEFINE_string("crd.bank_dtype", "float32", "CRDConfig.bank_dtype.")
  flags.DEFINE_integer("repeats", 10, "Timed repeats of each part.",
                       lower_bound=1)
  flags.DEFINE_integer("seed", 0, "Seed of the synthetic data and weights.",
                       lower_bound=0)
  flags.DEFINE_string("output", "", "JSON results path (none if empty).")
  for name in ("crd.batch_size", "crd.nce_k", "crd.negative_sampling",
               "crd.bank_dtype"):
    command.config_rule(name)
  command.output()


def make_parts(f: Any) -> tuple[dict[str, Callable[[], Any]], int]:
  """The parts of one minibatch as zero-argument jitted calls, and the
  minibatches of a round."""
  rng = np.random.default_rng(f.seed)
  n = f.server
  b, k = crd_cost.flag(f, "crd.batch_size"), crd_cost.flag(f, "crd.nce_k")
  negative_sampling = crd_cost.flag(f, "crd.negative_sampling")
  labels = rng.integers(0, f.num_classes, n).astype(np.int32)
  x_all = jnp.asarray(rng.standard_normal((n,) + INPUT_SHAPE, np.float32))
  model = models.create_model(f.student, f.num_classes)
  params = models.init_params(model, jax.random.key(f.seed), INPUT_SHAPE)
  student_apply = models.make_features_fn(model)
  config = transfer.CRDConfig(batch_size=b, nce_k=k, kt_steps=1,
                              negative_sampling=negative_sampling,
                              bank_dtype=crd_cost.flag(f, "crd.bank_dtype"))
  server = {"x": x_all, "y": jnp.asarray(labels),
            "mask": jnp.ones((n,), jnp.float32)}
  # A cached PM is rows to read, whatever it computed: here its features
  # are the image's first pm_features pixels.
  def teacher(x, mask):
    del mask
    return (x.reshape(x.shape[0], -1)[:, :f.pm_features],
            jnp.zeros((x.shape[0], f.num_classes)))
  init_fn, step_fn = transfer.make_crd_regularizer(
      student_apply, teacher, server, config, teacher_per_example=True)
  state = init_fn(jax.random.key(f.seed + 1), params)
  shared = negative_sampling == "shared"

  index = jnp.asarray(rng.permutation(n)[:b].astype(np.int32))
  mask = jnp.ones((b,), jnp.float32)
  x, y = x_all[index], jnp.asarray(labels)[index]
  f_t, _ = teacher(x, None)
  table = nce.class_table(labels)
  y_all = jnp.asarray(labels)
  keys = jax.random.split(jax.random.key(f.seed + 2), b)
  heads, mem_s, mem_t = state.heads, state.memory_s, state.memory_t

  @jax.jit
  def student(params):
    def ce(p):
      _, logits = student_apply(p, x, mask)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
          logits, y))
    return jax.value_and_grad(ce)(params)

  f_s, _ = jax.jit(student_apply)(params, x, mask)

  @jax.jit
  def draw(keys):
    if shared:
      return shared_negatives.sample_shared(keys[0], k, n)
    return nce.sample_negatives(keys, y, table, k)

  negatives = draw(keys)

  @jax.jit
  def nce_part(heads, f_s, mem_s, mem_t):
    def loss(heads, f_s):
      e_s = nce.embed(heads["embed_s"], f_s)
      e_t = nce.embed(heads["embed_t"], f_t)
      z = -jnp.ones(())
      if shared:
        value, _ = shared_negatives.crd_loss_shared(
            e_s, e_t, index, y, negatives, table, y_all, mem_s, mem_t, z, z,
            temperature=0.07)
      else:
        value, _ = nce.crd_loss(e_s, e_t, index, negatives, mem_s, mem_t, z,
                                z, temperature=0.07)
      return value
    return jax.value_and_grad(loss, argnums=(0, 1))(heads, f_s)

  e = nce.embed(heads["embed_s"], f_s)

  @jax.jit
  def banks(mem_s, mem_t):
    return (nce.update_memory(mem_s, index, e, 0.5),
            nce.update_memory(mem_t, index, e, 0.5))

  parts = {"step": lambda: step_fn(params, state),
           "student": lambda: student(params),
           "negatives": lambda: draw(keys),
           "nce": lambda: nce_part(heads, f_s, mem_s, mem_t),
           "banks": lambda: banks(mem_s, mem_t)}
  return parts, -(-n // b)


def run(f: Any = None) -> dict[str, Any]:
  """Times the parts; prints and returns the table."""
  f = f or FLAGS
  parts, steps = make_parts(f)
  times: dict[str, list[float]] = {name: [] for name in parts}
  for i in range(1 + f.repeats):  # the first pass compiles
    for name, fn in parts.items():
      t = command.timed(fn)
      if i:
        times[name].append(t)
  med = {name: statistics.median(v) for name, v in times.items()}
  fl = {name: crd_cost.flag(f, name) for name in (
      "server", "student", "num_classes", "pm_features", "crd.batch_size",
      "crd.nce_k", "crd.negative_sampling", "crd.bank_dtype", "repeats",
      "seed")}
  out = {"flags": fl,
         "jax": jax.__version__, "minibatches_per_round": steps,
         "median_s": med,
         "share_of_step": {name: med[name] / med["step"] for name in med},
         "round_estimate_s": med["step"] * steps}
  print(f"one CRD minibatch: {f.student} student, n = {f.server}, "
        f"B = {fl['crd.batch_size']}, K = {fl['crd.nce_k']}, negatives "
        f"{fl['crd.negative_sampling']}, bank {fl['crd.bank_dtype']}")
  for name in parts:
    print(f"  {name:<10} {1e3 * med[name]:8.1f} ms  "
          f"{100 * out['share_of_step'][name]:5.1f}% of the step")
  print(f"  round ({steps} minibatches): about {out['round_estimate_s']:.2f} s")
  if f.output:
    command.write_json(f.output, out)
  return out


def main(argv: list[str]) -> None:
  del argv
  run()


if __name__ == "__main__":
  command.run(define_flags, main)
