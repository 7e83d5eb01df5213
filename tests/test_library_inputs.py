"""The library's functions refuse empty, out-of-range and mismatched inputs
with a ValueError in their own words, where the values (or shapes, which
are known under jit too) allow it.
"""

from __future__ import annotations

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from augfl_jax.algorithms import augfl
from augfl_jax.core import checks, evaluation, tree
from augfl_jax import models
from augfl_jax.core.types import ClientData
from tests import tiny

STRATEGY = "map"


def _tiny_eval(params, batch):
  correct = jnp.sum((jnp.argmax(tiny.logits(params, batch["x"]), -1) ==
                     batch["y"]) * batch["mask"])
  return tiny.loss_fn(params, batch), correct


def _clients(num_clients=4):
  return tiny.client_data(num_clients=num_clients)


def _none_of(clients):
  return jax.tree.map(lambda a: a[:0], clients)


def _round():
  return augfl.make_round(tiny.loss_fn, augfl.AugFLConfig(), STRATEGY)


def test_a_round_over_no_clients_is_refused():
  params = tiny.init(jax.random.key(0))
  with pytest.raises(ValueError, match="num_clients must be an int >= 1"):
    augfl.init_state(params, 0)
  state = augfl.init_state(params, 4)
  with pytest.raises(ValueError, match="disagree on the number of clients"):
    _round()(state, _none_of(_clients()))


def test_an_evaluation_over_no_clients_is_refused():
  evaluate = evaluation.make_evaluator(tiny.loss_fn, _tiny_eval, alpha=0.1,
                                       strategy=STRATEGY)
  with pytest.raises(ValueError, match="no held-out clients to score"):
    evaluate(tiny.init(jax.random.key(0)), _none_of(_clients()))


@pytest.mark.parametrize("indices", [100, -1, [0, 4], jnp.asarray([7])])
def test_take_refuses_concrete_indices_out_of_range(indices):
  with pytest.raises(ValueError, match="out of range: the 4 clients are "
                     "0..3"):
    tree.take(_clients(), indices)


def test_take_of_valid_indices_and_under_jit_is_unchanged():
  clients = _clients()
  one = tree.take(clients, 2)
  assert one.num_examples == clients.num_examples[2]
  rows = jax.jit(tree.take)(clients, jnp.asarray([3, 0]))
  assert rows.num_examples.tolist() == clients.num_examples[
      jnp.asarray([3, 0])].tolist()


@pytest.mark.parametrize("alpha,steps", [(-1.0, 1), (float("nan"), 1),
                                         (0.0, 1), (-1.0, 0)])
def test_make_evaluator_refuses_a_bad_step_size(alpha, steps):
  with pytest.raises(ValueError, match="alpha, the adaptation step size"):
    evaluation.make_evaluator(tiny.loss_fn, _tiny_eval, alpha=alpha,
                              steps=steps)
  evaluation.make_evaluator(tiny.loss_fn, _tiny_eval, alpha=0.0, steps=0)


@pytest.mark.parametrize("num_clients", [-1, 0, 2.5])
def test_init_state_refuses_a_count_that_is_not_positive(num_clients):
  with pytest.raises(ValueError, match="num_clients must be an int >= 1"):
    augfl.init_state(tiny.init(jax.random.key(0)), num_clients)


def test_duals_of_another_tree_are_named():
  params = tiny.init(jax.random.key(0))
  other = {**params, "w1": params["w1"][:, :2]}
  state = augfl.init_state(params, 4).replace(
      duals=tree.broadcast_to_clients(other, 4))
  with pytest.raises(ValueError, match=r"dual must have theta's tree and "
                     r"dtypes, and its shapes .*\['w1'\] \(5, 2\)"):
    _round()(state, _clients())


def test_a_state_of_other_clients_is_named():
  state = augfl.init_state(tiny.init(jax.random.key(0)), 3)
  with pytest.raises(ValueError, match=r"disagree on the number of clients "
                     r"\(their leading axis: .*: 3, .*: 4"):
    _round()(state, _clients(4))


def test_examples_of_another_shape_are_named_by_round_and_evaluation():
  params = tiny.init(jax.random.key(0))
  clients = _clients()
  narrow = dataclasses.replace(clients, support={
      **clients.support, "x": clients.support["x"][..., :3]})
  message = r"the loss cannot run on .* \(examples x of shape \(12, 3\)\)"
  with pytest.raises(ValueError, match=message):
    _round()(augfl.init_state(params, 4), narrow)
  evaluate = evaluation.make_evaluator(tiny.loss_fn, _tiny_eval, alpha=0.1,
                                       strategy=STRATEGY)
  with pytest.raises(ValueError, match=message):
    evaluate(params, narrow)


def test_a_flax_model_on_images_of_another_size_is_named():
  model = models.create_model("mlp", 10, norm="group")
  params = models.init_params(model, jax.random.key(0), (8, 8, 1))
  evaluate = evaluation.make_evaluator(
      models.make_loss_fn(model), models.make_eval_fn(model), alpha=0.1,
      strategy=STRATEGY)
  batch = {"x": jnp.zeros((3, 5, 28, 28, 1)),
           "y": jnp.zeros((3, 5), jnp.int32), "mask": jnp.ones((3, 5))}
  with pytest.raises(ValueError, match=r"the loss cannot run on the "
                     r"held-out clients' support sets \(examples x of shape "
                     r"\(5, 28, 28, 1\)\)"):
    evaluate(params, ClientData(support=batch, query=batch,
                                num_examples=jnp.ones(3)))


class _LogitsOnly(nn.Module):
  """Breaks the contract: the logits alone."""

  @nn.compact
  def __call__(self, x, mask=None):
    return nn.Dense(4)(x.reshape((x.shape[0], -1)))


class _NoMask(nn.Module):
  """Breaks the contract: no ``mask=``."""

  @nn.compact
  def __call__(self, x):
    features = x.reshape((x.shape[0], -1))
    return features, nn.Dense(4)(features)


CONTRACT = re.escape(
    "a client model returns (features [n, d], logits [n, K]) from "
    "__call__(x, mask=None) and takes mask= (1 = a real example, 0 = "
    "padding); ")


@pytest.mark.parametrize("model,broken", [
    (_LogitsOnly(), "_LogitsOnly returned float32[2,4]"),
    (_NoMask(), "_NoMask takes no mask= (TypeError: "),
])
def test_a_model_that_breaks_the_contract_is_named_with_it(model, broken):
  """Where it is first initialised (``init_params``, a run's and a PM's
  path) and where it is first applied (the loss, the evaluator, the
  features) with parameters made elsewhere."""
  message = CONTRACT + re.escape(broken)
  with pytest.raises(checks.ModelContractError, match=message) as e:
    models.init_params(model, jax.random.key(0), (3,))
  assert "\n" not in str(e.value) and "unpack" not in str(e.value)
  with pytest.raises(checks.ModelContractError, match=message):
    models.init_batch_stats(model, (3,))
  params = model.init(jax.random.key(0), jnp.zeros((2, 3)))["params"]
  batch = {"x": jnp.zeros((5, 3)), "y": jnp.zeros((5,), jnp.int32),
           "mask": jnp.ones((5,))}
  with pytest.raises(checks.ModelContractError, match=message.replace(
      "2,4", "5,4")):
    jax.jit(models.make_loss_fn(model))(params, batch)
  with pytest.raises(checks.ModelContractError, match=message.replace(
      "2,4", "5,4")):
    models.make_features_fn(model)(params, batch["x"], batch["mask"])
  clients = ClientData(
      support=jax.tree.map(lambda a: jnp.stack([a] * 3), batch),
      query=jax.tree.map(lambda a: jnp.stack([a] * 3), batch),
      num_examples=jnp.ones(3))
  evaluate = evaluation.make_evaluator(
      models.make_loss_fn(model), models.make_eval_fn(model), alpha=0.1,
      strategy=STRATEGY)
  with pytest.raises(checks.ModelContractError, match=CONTRACT) as e:
    evaluate(params, clients)
  assert "shape the model was initialised for" not in str(e.value)


def test_server_update_refuses_rhos_and_duals_that_do_not_fit():
  params = tiny.init(jax.random.key(0))
  stacked = tree.broadcast_to_clients(params, 4)
  with pytest.raises(ValueError, match=r"rhos must hold one rho per client, "
                     r"shape \(4,\), got shape \(3,\)"):
    augfl.server_update(stacked, stacked, jnp.ones(3))
  with pytest.raises(ValueError, match="duals must have client_params' "
                     "tree and shapes"):
    augfl.server_update(stacked, tree.broadcast_to_clients(params, 3),
                        jnp.ones(4))
