"""A user's own eval_fn: ``eval_fn(params, batch) -> (mean loss, number
correct)``, two scalars, checked where the evaluator is first traced, with
a message that says what is expected."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax.core import evaluation, intervals
from tests import tiny

EXPECTED = (r"eval_fn\(params, batch\) must return \(mean loss, number "
            r"correct\), two scalars")


def _correct(params, batch):
  return jnp.sum((jnp.argmax(tiny.logits(params, batch["x"]), -1) ==
                  batch["y"]) * batch["mask"])


def _good(params, batch):
  return tiny.loss_fn(params, batch), _correct(params, batch)


def _three(params, batch):  # the count too
  return (tiny.loss_fn(params, batch), _correct(params, batch),
          jnp.sum(batch["mask"]))


def _per_example(params, batch):  # correct per example, not summed
  right = jnp.argmax(tiny.logits(params, batch["x"]), -1) == batch["y"]
  return tiny.loss_fn(params, batch), right * batch["mask"]


def _accuracy_only(params, batch):
  return _correct(params, batch) / jnp.sum(batch["mask"])


def _unpacks_the_model(params, batch):  # a (features, logits) model's
  _, logits = tiny.logits(params, batch["x"])
  return jnp.mean(logits), jnp.sum(logits)


def _evaluate(eval_fn, per_client_params=False):
  evaluate = evaluation.make_evaluator(
      tiny.loss_fn, eval_fn, alpha=0.1, strategy="vmap",
      per_client_params=per_client_params)
  params = tiny.init(jax.random.key(0))
  clients = tiny.client_data(num_clients=4)
  if per_client_params:
    params = jax.tree.map(lambda p: jnp.stack([p] * 4), params)
  return evaluate(params, clients)


@pytest.mark.parametrize("eval_fn,returned", [
    (_three, "a tuple of 3 (float32[], float32[], float32[])"),
    (_per_example, "a tuple of 2 (float32[], float32[12])"),
    (_accuracy_only, "float32[]"),
])
@pytest.mark.parametrize("per_client_params", [False, True])
def test_an_eval_fn_of_the_wrong_shape_is_named_with_the_contract(
    eval_fn, returned, per_client_params):
  with pytest.raises(ValueError, match=rf"^{EXPECTED}; on a held-out "
                     r"client's query set it returned "
                     + re.escape(returned)) as e:
    _evaluate(eval_fn, per_client_params)
  assert str(e.value).endswith(returned) and "\n" not in str(e.value)


def test_an_eval_fn_that_cannot_run_is_named_with_the_contract():
  with pytest.raises(ValueError, match=r"^eval_fn cannot run on a held-out "
                     r"client's query set \(ValueError: .*\); " + EXPECTED):
    _evaluate(_unpacks_the_model)


def test_an_eval_fn_of_two_scalars_is_accepted():
  metrics = jax.device_get(_evaluate(_good))
  assert 0.0 <= float(metrics["accuracy"]) <= 1.0
  assert metrics["client_accuracy"].shape == (4,)
  list_of_two = lambda p, b: list(_good(p, b))
  assert float(_evaluate(list_of_two)["accuracy"]) == float(
      metrics["accuracy"])
  evaluation.check_eval_fn(_good, tiny.init(jax.random.key(0)),
                           jax.tree.map(lambda a: a[0],
                                        tiny.client_data().query))


def test_the_evaluator_returns_per_client_counts_and_the_interval():
  """As a run's records give them: correct predictions and query examples
  per client, and the 95% interval across clients of the accuracy, with
  the keys it returned before."""
  metrics = _evaluate(_good)
  for key in ("accuracy", "accuracy_std", "loss", "client_accuracy"):
    assert key in metrics
  correct = np.asarray(metrics["client_correct"])
  count = np.asarray(metrics["client_count"])
  assert correct.dtype == count.dtype == np.int32 and count.shape == (4,)
  clients = tiny.client_data(num_clients=4)
  np.testing.assert_array_equal(count, evaluation.query_counts(clients))
  np.testing.assert_allclose(correct / count, metrics["client_accuracy"],
                             rtol=1e-6)
  interval = metrics["accuracy_interval"]
  expected = intervals.ratio_interval(correct, count).clipped()
  assert interval == expected and interval.n == 4
  assert interval.mean == pytest.approx(float(metrics["accuracy"]))
  # The run's own scoring of the same state gives the same interval.
  assert evaluation.with_interval(
      jax.device_get(metrics), count)["accuracy_interval"] == interval
  # Inside a trace the interval waits for the host.
  params = tiny.init(jax.random.key(0))
  evaluate = evaluation.make_evaluator(tiny.loss_fn, _good, alpha=0.1,
                                       strategy="vmap")
  traced = jax.jit(lambda p, c: evaluate(p, c))(params, clients)
  assert "accuracy_interval" not in traced
  np.testing.assert_array_equal(traced["client_count"], count)
