"""What one benchmark cell runs: synthetic clients, round functions, references.

A cell is (algorithm, model, conv_impl, number of clients C, examples per
support/query set n, client strategy). Every client has exactly n real
support and n real query examples (no padding), so the PyTorch reference,
which has no masks, computes the same round.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.algorithms.augfl import factored
from augfl_jax.algorithms import augfl
from augfl_jax import models
from augfl_jax.algorithms import fedavg
from augfl_jax.algorithms import per_fedavg
from augfl_jax.core.types import ClientData

ALGORITHMS = ("augfl", "fedavg", "per_fedavg")
# benchmark model -> (registry name, input shape, number of classes, kwargs);
# "tiny_cnn" is for the harness's own test.
MODELS = {
    "cnn": ("cnn", (28, 28, 1), 26, {}),
    "resnet8x4": ("resnet8x4", (32, 32, 3), 10, {}),
    # the same CNN on digits-sized inputs (8x8x1, 10 classes): 155,626 params
    "cnn_digits": ("cnn", (8, 8, 1), 10, {}),
    # the cnn with its 3136x512 dense layer cut to 16 units: what a round
    # costs without that kernel (a bound for factoring it)
    "cnn_dense16": ("cnn", (28, 28, 1), 26, {"dense": 16}),
    "tiny_cnn": ("cnn", (8, 8, 1), 5, {"widths": (4,), "dense": 8}),
    # models without convolutions (conv_impl does not apply), for the rule
    # of AugFL's dense_updates="auto"
    "mlp": ("mlp", (28, 28, 1), 26, {}),
    "logreg": ("logreg", (28, 28, 1), 26, {}),
}
AUGFL_CONFIG = augfl.AugFLConfig()  # the paper's: alpha 0.03, rho 0.7, lam 0
FEDAVG_CONFIG = fedavg.FedAvgConfig()  # lr 0.05, 1 epoch, batch 10
PER_FEDAVG_CONFIG = per_fedavg.PerFedAvgConfig()  # hf, 5 steps, batch 10
_TORCH_DEFAULT_THREADS: dict[str, int] = {}


@dataclasses.dataclass
class Problem:
  """One (model, C, n) setting: model, parameters and stacked client data."""

  model_name: str
  model: Any
  params: Any
  loss_fn: Callable
  clients: ClientData
  input_shape: tuple[int, ...]
  num_classes: int


def make_problem(model_name: str, conv_impl: str, num_clients: int,
                 examples: int, seed: int = 0) -> Problem:
  """Synthetic clients: x ~ N(0, 1), uniform labels, all rows real."""
  if model_name not in MODELS:
    raise ValueError(f"unknown benchmark model {model_name!r}; choose one of "
                     f"{sorted(MODELS)}")
  name, shape, num_classes, kwargs = MODELS[model_name]
  if name not in ("mlp", "logreg"):
    kwargs = {**kwargs, "conv_impl": conv_impl}
  model = models.create_model(name, num_classes, **kwargs)
  params = models.init_params(model, jax.random.PRNGKey(seed), shape)
  rng = np.random.default_rng(seed)

  def batch():
    return {
        "x": jnp.asarray(rng.standard_normal(
            (num_clients, examples) + shape, dtype=np.float32)),
        "y": jnp.asarray(rng.integers(0, num_classes,
                                      (num_clients, examples), np.int32)),
        "mask": jnp.ones((num_clients, examples), jnp.float32),
    }

  clients = ClientData(support=batch(), query=batch(),
                       num_examples=jnp.full((num_clients,), 2.0 * examples))
  return Problem(model_name, model, params, models.make_loss_fn(model),
                 clients, shape, num_classes)


DENSE_UPDATES = ("materialised", "factored")


def initial_state(algorithm: str, problem: Problem,
                  dense_updates: str = "materialised") -> Any:
  """The round's first state; AugFL's duals materialised or, with
  ``dense_updates="factored"``, as factors (``augfl.factored``)."""
  if algorithm == "augfl":
    if dense_updates == "factored":
      return factored.init_state(problem.loss_fn, problem.params,
                                 problem.clients)
    return augfl.init_state(problem.params, problem.clients.num_clients)
  return fedavg.init_state(problem.params, jax.random.PRNGKey(1))


def make_round_fn(algorithm: str, problem: Problem, strategy: Any,
                  dense_updates: str = "materialised") -> Callable:
  """The library's jitted round for ``algorithm`` under ``strategy`` (AugFL:
  the factored round with ``dense_updates="factored"``)."""
  if dense_updates not in DENSE_UPDATES:
    raise ValueError(f"dense_updates must be one of {DENSE_UPDATES}, got "
                     f"{dense_updates!r}")
  if algorithm == "augfl":
    if dense_updates == "factored":
      return factored.make_round(problem.loss_fn, AUGFL_CONFIG, strategy)
    return augfl.make_round(problem.loss_fn, AUGFL_CONFIG, strategy)
  if algorithm == "fedavg":
    return fedavg.make_round(problem.loss_fn, FEDAVG_CONFIG, strategy)
  if algorithm == "per_fedavg":
    return per_fedavg.make_round(problem.loss_fn, PER_FEDAVG_CONFIG, strategy)
  raise ValueError(f"unknown algorithm {algorithm!r}; choose one of "
                   f"{ALGORITHMS}")


def gradients_per_client(algorithm: str, examples: int
                         ) -> list[tuple[int, int]]:
  """``[(batch size, number of gradient evaluations)]`` of one client's round.

  AugFL: 4 gradients on n examples (Eqs. (7), (10)). FedAvg: E epochs of
  ``ceil(2n / B)`` minibatches. Per-FedAvg (hf): 3 gradients per local step
  (2 for "fo").
  """
  if algorithm == "augfl":
    return [(examples, 4)]
  if algorithm == "fedavg":
    c = FEDAVG_CONFIG
    steps = -(-2 * examples // c.batch_size)
    return [(c.batch_size, c.local_epochs * steps)]
  c = PER_FEDAVG_CONFIG
  per_step = 3 if c.variant == "hf" else 2
  return [(c.batch_size, c.local_steps * per_step)]


def gradient_flops(problem: Problem, batch_size: int) -> float:
  """XLA cost-analysis FLOPs of one ``grad(loss_fn)`` on ``batch_size`` rows."""
  batch = {
      "x": jax.ShapeDtypeStruct((batch_size,) + problem.input_shape,
                                jnp.float32),
      "y": jax.ShapeDtypeStruct((batch_size,), jnp.int32),
      "mask": jax.ShapeDtypeStruct((batch_size,), jnp.float32),
  }
  compiled = jax.jit(jax.grad(problem.loss_fn)).lower(
      problem.params, batch).compile()
  return float(cost_flops(compiled))


def cost_flops(compiled: Any) -> float:
  """``compiled.cost_analysis()["flops"]`` (a dict, or a list of them)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  return float((analysis or {}).get("flops", 0.0))


def round_flops(algorithm: str, problem: Problem) -> float:
  """Gradient FLOPs of one round: C x sum over the client's gradients.

  XLA's cost analysis counts a while loop's body once (not times its trip
  count), so the whole-program count of a ``lax.map`` round is useless; the
  gradients, counted one by one, are the round's arithmetic (the server's
  O(C |theta|) sums are not included).
  """
  per_client = sum(
      count * gradient_flops(problem, batch)
      for batch, count in gradients_per_client(
          algorithm, problem.clients.support["y"].shape[1]))
  return problem.clients.num_clients * per_client


def python_loop_reference(problem: Problem) -> Callable[[], Any]:
  """AugFL as FedJAX's default backend runs it: a Python loop over clients.

  Each client calls the jitted single-client ``augfl.client_update``; the
  server sums ``y_i + rho theta_i`` as the clients return (a jitted add)
  and applies Eq. (13). Client data are sliced beforehand (not timed).
  """
  cfg = AUGFL_CONFIG
  num = problem.clients.num_clients
  client_fn = jax.jit(
      lambda theta, dual, s, q, w, delta: augfl.client_update(
          problem.loss_fn, theta, dual, s, q, weight=w, alpha=cfg.alpha,
          rho=cfg.rho, delta=delta, hvp=cfg.hvp)[:2])
  accumulate = jax.jit(lambda acc, t, y: jax.tree.map(
      lambda a, ti, yi: a + yi + cfg.rho * ti, acc, t, y))
  finish = jax.jit(lambda acc: jax.tree.map(
      lambda a: a / (cfg.rho * num), acc))
  support = [jax.tree.map(lambda a, i=i: a[i], problem.clients.support)
             for i in range(num)]
  query = [jax.tree.map(lambda a, i=i: a[i], problem.clients.query)
           for i in range(num)]
  weights = augfl.client_weights(problem.clients.num_examples, False)
  weights = [weights[i] for i in range(num)]
  delta = augfl.delta_schedule(jnp.float32(1.0), cfg)
  zeros = jax.tree.map(jnp.zeros_like, problem.params)
  duals = [zeros] * num
  theta = problem.params

  def run():
    acc = zeros
    new_duals = []
    for i in range(num):
      theta_i, y_i = client_fn(theta, duals[i], support[i], query[i],
                               weights[i], delta)
      acc = accumulate(acc, theta_i, y_i)
      new_duals.append(y_i)
    return finish(acc), new_duals

  return run


def torch_device() -> str:
  """Where the PyTorch references run: ``"cuda"`` when PyTorch sees a CUDA
  device, else ``"cpu"``. Raises ImportError without torch."""
  import torch  # pylint: disable=g-import-not-at-top
  return "cuda" if torch.cuda.is_available() else "cpu"


def torch_reference(problem: Problem, threads: int = 0, vmap: bool = False,
                    device: str | None = None
                    ) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
  """The PyTorch round on the same weights and data.

  ``vmap=False``: the per-client loop (``torch_reference.augfl_round``,
  ``torch.autograd.grad``, the authors' way); ``vmap=True``: one client's
  step with ``torch.func.grad`` under ``torch.func.vmap`` over clients
  (``torch_reference.augfl_round_vmap``).

  ``threads``: ``torch.set_num_threads`` for this reference (0: PyTorch's
  default at first use); ignored on CUDA. ``device``: ``"cpu"``, ``"cuda"``,
  or None for ``torch_device()`` (CUDA when present). A CUDA round ends with
  ``torch.cuda.synchronize()``, so that timing it times the work.

  Returns ``(run, to_jax)``: ``run()`` is one round, ``to_jax(result)`` its
  theta^{t+1} in the JAX tree layout. Raises ImportError without torch.
  """
  import torch  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from benchmarks import torch_reference as tr
  device = device or torch_device()
  threads = threads if threads > 0 else _TORCH_DEFAULT_THREADS.setdefault(
      "n", torch.get_num_threads())
  cfg = AUGFL_CONFIG
  num = problem.clients.num_clients
  theta, forward = tr.from_jax(problem.model_name, problem.params)
  theta = [t.to(device) for t in theta]
  as_t = lambda a, dt=np.float32: torch.from_numpy(
      np.array(a, dtype=dt)).to(device)
  s, q = problem.clients.support, problem.clients.query
  weights = np.asarray(augfl.client_weights(problem.clients.num_examples,
                                            False))
  delta = float(augfl.delta_schedule(1.0, cfg))
  sync = torch.cuda.synchronize if device.startswith("cuda") else (
      lambda: None)
  if vmap:
    stacked = (as_t(s["x"]), as_t(s["y"], np.int64), as_t(q["x"]),
               as_t(q["y"], np.int64))
    duals = [torch.zeros((num,) + tuple(t.shape), device=device)
             for t in theta]
    weights_t = as_t(weights)

    def round_once():
      return tr.augfl_round_vmap(forward, theta, duals, stacked,
                                 weights=weights_t, alpha=cfg.alpha,
                                 rho=cfg.rho, delta=delta)
  else:
    data = [((as_t(s["x"][i]), as_t(s["y"][i], np.int64)),
             (as_t(q["x"][i]), as_t(q["y"][i], np.int64)))
            for i in range(num)]
    duals = [[torch.zeros_like(t) for t in theta] for _ in range(num)]

    def round_once():
      return tr.augfl_round(forward, theta, duals, data,
                            weights=weights.tolist(), alpha=cfg.alpha,
                            rho=cfg.rho, delta=delta)

  def run():
    torch.set_num_threads(threads)  # process-wide: set before every round
    out = round_once()
    sync()
    return out

  def to_jax(result):
    return tr.to_jax_tree(problem.model_name, result[0], problem.params)

  return run, to_jax
