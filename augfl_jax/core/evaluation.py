"""Fast adaptation on held-out clients (the paper's test protocol, Algorithm 1).

A test client, never trained on, starts from the global model, takes ``steps``
full-batch SGD steps of size ``alpha`` on its support set, and is scored on
its query set. Reported over test clients (``summarise``, the one summary
every evaluator of the library uses): the sample-weighted mean accuracy
(``sum_i correct_i / sum_i |D_i^q|``) and the standard deviation of the
per-client accuracies.

Personalised methods pass one model per client (``per_client_params=True``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from augfl_jax.core import checks
from augfl_jax.core import client_axis
from augfl_jax.core import intervals
from augfl_jax.core.types import Batch, ClientData, LossFn, Params

__all__ = [
    "EvalFn", "accuracy_interval", "check_eval_fn", "fast_adapt", "make_evaluator",
    "masked_correct", "query_counts", "score_in_chunks", "summarise",
    "with_interval"
]

# eval_fn(params, batch) -> (masked mean loss, number of correct real examples)
EvalFn = Callable[[Params, Batch], tuple[jax.Array, jax.Array]]


def fast_adapt(loss_fn: LossFn, params: Params, support: Batch, *,
               alpha: float, steps: int) -> Params:
  """``steps`` full-batch SGD steps of size ``alpha`` on ``support``."""

  def step(params, _):
    return optax.tree.add_scale(params, -alpha,
                                jax.grad(loss_fn)(params, support)), None

  params, _ = jax.lax.scan(step, params, None, length=steps)
  return params


def make_evaluator(loss_fn: LossFn, eval_fn: EvalFn, *, alpha: float,
                   steps: int = 1,
                   strategy: str | client_axis.ClientStrategy | None = None,
                   per_client_params: bool = False):
  """Jitted ``evaluate(params, clients) -> metrics`` over the client axis.

  Args:
    loss_fn: the training loss (used for the adaptation steps).
    eval_fn: ``(params, batch) -> (loss, num_correct)``, two scalars: the
      masked mean loss and the number of real examples predicted right.
    alpha: adaptation step size.
    steps: adaptation steps k (0 scores the model as it is).
    strategy: how to run the client axis (None: the backend's
      ``clients.default_strategy()``).
    per_client_params: ``params`` has a leading client axis (one model per
      client) instead of being shared.

  Returns:
    ``evaluate(params, clients)`` with metrics ``accuracy`` (sample-weighted
    mean over clients), ``accuracy_std`` (std of per-client accuracies),
    ``loss`` (sample-weighted query loss), ``client_accuracy``,
    ``client_correct`` and ``client_count`` (``[C]``: correct predictions
    and query examples per client, int32) and ``accuracy_interval`` (an
    ``intervals.Interval`` of ``accuracy``, its 95% interval across the
    clients, as a run's records give it). The jitted program computes the
    rest; the interval is computed on the host, and left out where the
    results are not there: under a trace (``evaluate`` called inside
    ``jax.jit``) or split over several processes
    (:func:`with_interval` adds it once they are gathered).
    ``evaluate.lower(params, clients)`` lowers the program, as a jitted
    function's does.

  Raises:
    ValueError: ``steps < 0``, or a concrete ``alpha`` that is negative, not
      finite, or 0 with ``steps > 0``; ``evaluate`` raises it for no
      clients (``C = 0``), for examples the loss cannot run on, and for an
      ``eval_fn`` that does not return two scalars
      (:func:`check_eval_fn`).
  """
  strategy = client_axis.as_strategy(strategy)
  if steps < 0:
    raise ValueError(f"steps must be >= 0, got {steps}")
  alpha_ = checks.concrete(alpha)
  if alpha_ is not None and not (math.isfinite(alpha_) and alpha_ >= 0 and
                                 (alpha_ > 0 or steps == 0)):
    raise ValueError(f"alpha, the adaptation step size, must be a finite "
                     f"number > 0 (0 only with steps=0), got {alpha}")

  def one_client(params, client):
    adapted = fast_adapt(loss_fn, params, client.support, alpha=alpha,
                         steps=steps)
    loss, correct = eval_fn(adapted, client.query)
    return loss, correct, jnp.sum(client.query["mask"])

  def evaluate(params, clients: ClientData):
    if clients.num_clients == 0:
      raise ValueError("no held-out clients to score (the client axis of "
                       "clients is 0)")
    one_params = (params if not per_client_params else
                  jax.tree.map(lambda p: p[0], params))
    checks.check_loss_runs(loss_fn, one_params,
                           jax.tree.map(lambda a: a[0], clients.support),
                           "the held-out clients' support sets")
    check_eval_fn(eval_fn, one_params,
                  jax.tree.map(lambda a: a[0], clients.query))
    if per_client_params:
      fn, per_client = (lambda c: one_client(c[0], c[1])), (params, clients)
    else:
      fn, per_client = (lambda c: one_client(params, c)), clients
    loss, correct, count = client_axis.map_clients(fn, per_client, strategy)
    as_int = lambda a: jnp.rint(a).astype(jnp.int32)
    return {**summarise(loss, correct, count),
            "client_correct": as_int(correct), "client_count": as_int(count)}

  jitted = jax.jit(evaluate)

  def evaluate_with_interval(params, clients: ClientData):
    metrics = jitted(params, clients)
    per_client = (metrics["client_correct"], metrics["client_count"])
    if not all(not isinstance(a, jax.core.Tracer) and isinstance(
        a, jax.Array) and a.is_fully_addressable for a in per_client):
      return metrics
    correct, count = jax.device_get(per_client)
    return {**metrics,
            "accuracy_interval": accuracy_interval(correct, count)}

  evaluate_with_interval.lower = jitted.lower  # the program, as jit's
  return evaluate_with_interval


def check_eval_fn(eval_fn: EvalFn, params: Params, batch: Batch) -> None:
  """Raises ``ValueError`` saying what is expected unless ``eval_fn(params,
  batch)`` returns two numeric scalars, ``(mean loss, number correct)``
  (one client's query set; shapes only, traced with ``jax.eval_shape``,
  nothing is computed)."""
  expected = ("eval_fn(params, batch) must return (mean loss, number "
              "correct), two scalars")
  try:
    out = jax.eval_shape(eval_fn, params, batch)
  except checks.ModelContractError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    raise ValueError(
        f"eval_fn cannot run on a held-out client's query set "
        f"({type(e).__name__}: {reason}); {expected}") from None
  ok = (isinstance(out, (tuple, list)) and len(out) == 2
        and all(hasattr(v, "shape") and v.shape == () and
                jnp.issubdtype(v.dtype, jnp.number) for v in out))
  if not ok:
    raise ValueError(f"{expected}; on a held-out client's query set it "
                     f"returned {checks.describe_value(out)}")


def summarise(loss: jax.Array | None, correct: jax.Array, count: jax.Array,
              *, suffix: str = "") -> dict[str, jax.Array]:
  """Per-client results -> the evaluation metrics every evaluator reports.

  Args:
    loss: ``[C]`` each client's mean loss (None: no ``loss`` metric).
    correct: ``[C]`` correct predictions per client.
    count: ``[C]`` examples scored per client (real query rows).
    suffix: appended to every metric name (e.g. ``"_head"``).

  Returns:
    ``accuracy = sum_i correct_i / sum_i count_i`` (the sample-weighted
    mean), ``accuracy_std`` (std over clients of ``correct_i / count_i``),
    ``loss = sum_i count_i loss_i / sum_i count_i`` and ``client_accuracy``
    (``[C]``). Zero counts: every division is by ``max(count, 1)``, so a
    client (or a set of clients) with nothing to score has accuracy and
    loss 0, never NaN.
  """
  safe = lambda n: jnp.maximum(n, 1.0)
  accuracy = correct / safe(count)
  total = safe(jnp.sum(count))
  metrics = {"accuracy": jnp.sum(correct) / total,
             "accuracy_std": jnp.std(accuracy),
             "client_accuracy": accuracy}
  if loss is not None:
    metrics["loss"] = jnp.sum(loss * count) / total
  return {name + suffix: value for name, value in metrics.items()}


def masked_correct(predictions: jax.Array, labels: jax.Array,
                   mask: jax.Array) -> jax.Array:
  """Number of real rows (``mask > 0``) with ``predictions == labels``
  (``[n]`` each; float32 scalar)."""
  return jnp.sum(jnp.where((mask > 0) & (predictions == labels), 1.0, 0.0))


def query_counts(clients: ClientData) -> np.ndarray:
  """``[C]`` real query examples per client (what an evaluation scores)."""
  return np.asarray(jax.device_get(jnp.sum(clients.query["mask"] > 0, -1)),
                    dtype=np.int64)


def accuracy_interval(correct: np.ndarray, counts: np.ndarray,
                      confidence: float = intervals.CONFIDENCE
                     ) -> intervals.Interval:
  """The sample-weighted accuracy ``sum(correct) / sum(counts)`` over
  ``[C]`` clients with its interval across them
  (``intervals.ratio_interval``), clipped to [0, 1]; accuracy 0 and no
  interval when no client has an example to score (as :func:`summarise`
  gives it)."""
  counts = np.asarray(counts, dtype=np.int64)
  if counts.sum() <= 0:
    return intervals.Interval(0.0, math.nan, math.nan, int(counts.size))
  return intervals.ratio_interval(correct, counts, confidence).clipped()


def with_interval(metrics: dict[str, Any], counts: np.ndarray,
                  confidence: float = intervals.CONFIDENCE
                 ) -> dict[str, Any]:
  """An evaluation's host metrics with the interval of its accuracy.

  Args:
    metrics: an evaluator's output (``accuracy``, ``client_accuracy``
      ``[C]``, ...), on the host.
    counts: ``[C]`` query examples per client (:func:`query_counts`).
    confidence: the interval's coverage.

  Returns:
    ``metrics`` plus ``client_correct`` (``[C]`` int64: correct
    predictions per client, ``round(client_accuracy * count)``),
    ``client_count`` and ``accuracy_interval`` (an ``intervals.Interval``:
    the sample-weighted mean across clients, clipped to [0, 1]).
  """
  counts = np.asarray(counts, dtype=np.int64)
  correct = np.rint(np.asarray(metrics["client_accuracy"], np.float64)
                    * counts).astype(np.int64)
  return {**metrics, "client_correct": correct, "client_count": counts,
          "accuracy_interval": accuracy_interval(correct, counts,
                                                 confidence)}


def score_in_chunks(evaluate: Callable[[Any, ClientData], dict[str, Any]],
                    state: Any, clients: ClientData, *,
                    chunk_size: int = 100) -> dict[str, Any]:
  """``evaluate(state, chunk)`` over consecutive chunks of at most
  ``chunk_size`` clients, of near-equal sizes (at most two shapes, so at
  most two compilations), so that many held-out clients need the memory of
  one chunk; the per-client results are joined on the host.

  Returns:
    :func:`with_interval`'s metrics over all ``C`` clients: ``accuracy``
    (sample-weighted), ``accuracy_std``, ``loss`` (sample-weighted),
    ``client_accuracy``, ``client_correct``, ``client_count`` ``[C]`` and
    ``accuracy_interval`` (``evaluate``'s other metrics are not kept).
  """
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
  total = clients.num_clients
  if total < 1:
    raise ValueError("there are no clients to score")
  counts = query_counts(clients)
  accuracy, loss_sum = [], 0.0
  for chunk in np.array_split(np.arange(total), -(-total // chunk_size)):
    ev = jax.device_get(evaluate(state, jax.tree.map(
        lambda a, c=chunk: a[c[0]:c[-1] + 1], clients)))
    accuracy.append(np.asarray(ev["client_accuracy"], np.float64))
    loss_sum += float(ev["loss"]) * counts[chunk].sum()
  client_accuracy = np.concatenate(accuracy)
  scored = with_interval({"client_accuracy": client_accuracy}, counts)
  return {**scored,
          "accuracy": float(scored["client_correct"].sum() / counts.sum()),
          "accuracy_std": float(np.std(client_accuracy)),
          "loss": loss_sum / float(counts.sum())}
