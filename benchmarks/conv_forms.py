r"""The cnn's minibatch gradient under each form of its convolutions.

  python -m benchmarks.conv_forms --batch=128 --scan=8 \
    --xla_flags=",--xla_cpu_experimental_xnn_fusion_type=+individual_convolution"

The client rounds of the cnn and AugFL's CRD step spend most of their time
in the cnn's forward and backward passes (``benchmarks/RESULTS.md`` §20,
§21). This command times the gradient of the cross-entropy of ``--model``
on ``--batch`` examples (``benchmarks.cells.MODELS``' inputs: 28x28x1 for
the cnn) with respect to its parameters, two ways: one jitted call, and
``--scan`` minibatches in one ``lax.scan`` (the time a minibatch), the way
the CRD step and ``lax.map`` over clients run it. It does so for each form
of the convolutions:

* ``patches``: ``models.conv.conv_patches``, im2col and a matmul (the CPU
  default);
* ``xla``: ``lax.conv_general_dilated``, forward and backward;
* ``xla_forward``: ``lax.conv_general_dilated`` forward and the patches'
  backward (a ``jax.custom_vjp``), which no model offers: it is timed here
  to see whether it would pay.

Within a process the forms are timed round-robin, ``--repeats`` times after
a compiling call, and each form's gradient is compared with the patches'
(largest difference over the largest entry). A form's rate is the patches'
matrix FLOPs (``fedoa_cost.matmul_flops`` on its jaxpr) over its time.
Each ``--xla_flags`` item (``""``: none) is a process of its own with that
``XLA_FLAGS``, one after another; every time comes with its ratio to the
patches' scan under the first item.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any
from unittest import mock

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from augfl_jax import models
from augfl_jax.models import conv
from benchmarks import cells
from benchmarks import command
from benchmarks import fedoa_cost
from benchmarks import seed_population

FLAGS = flags.FLAGS
FORMS = ("patches", "xla", "xla_forward")
CONV_MODELS = [name for name in cells.MODELS if name not in ("mlp",
                                                             "logreg")]
PATCHES = conv.conv_patches


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_enum("model", "cnn", CONV_MODELS,
                    "Client model (benchmarks.cells.MODELS, one with "
                    "convolutions).")
  flags.DEFINE_integer("batch", 128, "Examples a minibatch (the CRD step's "
                       "128; a client's 20-40).", lower_bound=1)
  flags.DEFINE_integer("scan", 8, "Minibatches in the lax.scan.",
                       lower_bound=1)
  flags.DEFINE_integer("repeats", 5, "Timed repeats of each form.",
                       lower_bound=1)
  flags.DEFINE_list("xla_flags", [""], "XLA_FLAGS of each process, one "
                    "item each ('' for none); items hold no commas.")
  flags.DEFINE_string("output", "", "JSON results path (none if empty).")
  command.each("xla_flags", "'' or XLA flags, each starting with --",
               lambda item: item == "" or item.startswith("--"))
  command.output()


def xla_forward_conv(x: jax.Array, kernel: jax.Array, strides, pads
                    ) -> jax.Array:
  """``conv.conv_patches``'s values from ``lax.conv_general_dilated``; its
  backward is the patches' (``jax.vjp`` of ``conv_patches``)."""
  return _xla_forward(x, kernel, tuple(strides),
                      tuple(tuple(p) for p in pads))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _xla_forward(x, kernel, strides, pads):
  return jax.lax.conv_general_dilated(
      x, kernel, strides, pads, dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _xla_forward_fwd(x, kernel, strides, pads):
  return _xla_forward(x, kernel, strides, pads), (x, kernel)


def _xla_forward_bwd(strides, pads, residuals, cotangent):
  _, vjp = jax.vjp(lambda x, k: PATCHES(x, k, strides, pads), *residuals)
  return vjp(cotangent)


_xla_forward.defvjp(_xla_forward_fwd, _xla_forward_bwd)


def gradient_fns(model_name: str, form: str, batch: int):
  """``(one, scanned, params)``: jitted ``one(params, x [B, ...], y [B])``
  -> the gradient, and ``scanned(params, xs [S, B, ...], ys [S, B])`` -> the
  sum of the S minibatches' gradients."""
  name, shape, num_classes, kwargs = cells.MODELS[model_name]
  model = models.create_model(
      name, num_classes, **kwargs,
      conv_impl="xla" if form == "xla" else "patches")
  params = models.init_params(model, jax.random.key(0), shape)
  apply = models.make_features_fn(model)
  mask = jnp.ones((batch,), jnp.float32)

  def grad(p, x, y):
    def loss(p):
      _, logits = apply(p, x, mask)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
          logits, y))
    if form != "xla_forward":
      return jax.grad(loss)(p)
    # conv_patches is looked up when the model is traced.
    with mock.patch.object(conv, "conv_patches", xla_forward_conv):
      return jax.grad(loss)(p)

  def scanned(p, xs, ys):
    def body(total, xy):
      return jax.tree.map(jnp.add, total, grad(p, *xy)), None
    return jax.lax.scan(body, jax.tree.map(jnp.zeros_like, p), (xs, ys))[0]

  return jax.jit(grad), jax.jit(scanned), params


def measure(model_name: str, batch: int, scan: int, repeats: int
           ) -> dict[str, Any]:
  """Times every form in this process (its ``XLA_FLAGS``); seconds."""
  _, shape, num_classes, _ = cells.MODELS[model_name]
  rng = np.random.default_rng(0)
  xs = jnp.asarray(rng.standard_normal((scan, batch) + shape, np.float32))
  ys = jnp.asarray(rng.integers(0, num_classes, (scan, batch)), jnp.int32)
  calls, grads = {}, {}
  for form in FORMS:
    one, scanned, params = gradient_fns(model_name, form, batch)
    if form == "patches":
      flops = fedoa_cost.matmul_flops(jax.make_jaxpr(one)(params, xs[0],
                                                           ys[0]))
    calls[f"{form}/one"] = functools.partial(one, params, xs[0], ys[0])
    calls[f"{form}/scan"] = functools.partial(scanned, params, xs, ys)
  times: dict[str, list[float]] = {name: [] for name in calls}
  for i in range(1 + repeats):  # the first pass compiles
    for name, fn in calls.items():
      seconds, result = command.timed_call(fn)
      if i:
        times[name].append(seconds / (scan if name.endswith("scan") else 1))
      elif name.endswith("one"):
        grads[name.split("/")[0]] = result
  scale = max(float(jnp.max(jnp.abs(a)))
              for a in jax.tree.leaves(grads["patches"]))
  return {"xla_flags": os.environ.get("XLA_FLAGS", ""),
          "matmul_gflop": flops / 1e9,
          "median_s": {name: statistics.median(v)
                       for name, v in times.items()},
          "gradient_difference": {
              form: seed_population.max_difference(
                  grads[form], grads["patches"]) / scale
              for form in FORMS}}


def run(f: Any = None) -> dict[str, Any]:
  """Measures each ``--xla_flags`` item in a process of its own; prints and
  returns the table."""
  f = f or FLAGS
  load_before, processes = os.getloadavg(), []
  for xla_flags in f.xla_flags:
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "process.json")
      code = (f"import json; from benchmarks import conv_forms; "
              f"json.dump(conv_forms.measure({f.model!r}, {f.batch}, "
              f"{f.scan}, {f.repeats}), open({path!r}, 'w'))")
      done = subprocess.run(
          [sys.executable, "-c", code], check=False,
          env={**os.environ, "XLA_FLAGS": xla_flags,
               "PYTHONPATH": os.pathsep.join(
                   filter(None, [fedoa_cost.ROOT, os.environ.get("PYTHONPATH")]))})
      if done.returncode:
        raise ValueError(f"the process with XLA_FLAGS={xla_flags!r} ended "
                         f"with code {done.returncode}")
      with open(path) as fh:
        processes.append(json.load(fh))
  base = processes[0]["median_s"]["patches/scan"]
  out = {"flags": {"model": f.model, "batch": f.batch, "scan": f.scan,
                   "repeats": f.repeats},
         "jax": jax.__version__,
         "load_average": {"before": load_before, "after": os.getloadavg()},
         "processes": processes,
         "base": "patches/scan under the first --xla_flags item"}
  gflop = processes[0]["matmul_gflop"]
  print(f"the {f.model}'s gradient on {f.batch} examples ({gflop:.2f} matrix "
        "GFLOP): time a minibatch (its ratio to the first line's "
        "patches/scan, GFLOP/s)")
  for p in processes:
    cells = "  ".join(
        f"{name} {1e3 * s:7.1f} ms ({s / base:4.2f}, {gflop / s:3.0f})"
        for name, s in p["median_s"].items())
    print(f"  XLA_FLAGS={p['xla_flags']!r}: {cells}")
  print("gradient difference to the patches' (relative to its largest "
        "entry): " + ", ".join(
            f"{form} {d:.1e}"
            for form, d in processes[0]["gradient_difference"].items()))
  if f.output:
    command.write_json(f.output, out)
  return out


def main(argv: list[str]) -> None:
  del argv
  run()


if __name__ == "__main__":
  command.run(define_flags, main)
