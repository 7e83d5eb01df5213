"""The non-finite guard keeps the interface: ``guard.keep_finite`` turns a
``FederatedAlgorithm`` into one whose round keeps the last finite state and
says in its metrics which clients and leaves were not finite; it compiles
nothing itself (the rounds loop jits it: ``rounds.compiled_round``)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import algorithms, models
from augfl_jax.algorithms import base, fedavg, fedbc
from augfl_jax.training import guard, rounds
from tests import tiny

METHODS = {"fedavg": fedavg.FedAvgConfig(), "fedbc": fedbc.FedBCConfig()}


def _start(name):
  """``(algorithm, state, clients)``: ``name`` on 4 tiny clients."""
  model = models.MLP(num_classes=tiny.K, hidden=(4,))
  algo = algorithms.build(name, model, METHODS[name], strategy="vmap")
  params = models.init_params(model, jax.random.key(0), (tiny.D,))
  return (algo, algo.init(params, 4, jax.random.key(1)),
          tiny.client_data(num_clients=4))


def _with_nan(clients, client):
  """``clients`` with a NaN in the examples of ``client``."""
  x = clients.support["x"].at[client].set(jnp.nan)
  return dataclasses.replace(clients, support={**clients.support, "x": x})


def _leaves(tree):
  return [np.asarray(jax.random.key_data(a) if jax.dtypes.issubdtype(
      a.dtype, jax.dtypes.prng_key) else a) for a in jax.tree.leaves(tree)]


def _same(a, b):
  for x, y in zip(_leaves(a), _leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def test_a_finite_round_is_the_algorithms_own():
  algo, state, clients = _start("fedavg")
  guarded = guard.keep_finite(algo)
  assert isinstance(guarded, base.FederatedAlgorithm)
  assert (guarded.name, guarded.init, guarded.evaluate,
          guarded.global_params, guarded.traceable) == (
              algo.name, algo.init, algo.evaluate, algo.global_params,
              algo.traceable)
  want, want_metrics = jax.jit(algo.round)(state, clients)
  got, metrics = jax.jit(guarded.round)(state, clients)
  for x, y in zip(_leaves(got), _leaves(want), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
  metrics, ok, (state_flags, metric_flags) = guard.split(metrics)
  assert bool(ok) and set(metrics) == set(want_metrics)
  assert not any(np.any(f) for f in jax.tree.leaves(
      (state_flags, metric_flags)))


@pytest.mark.parametrize("traceable", [True, False])
def test_a_non_finite_round_keeps_the_state_and_names_the_client(traceable):
  """Client 2's NaN: the state handed in comes back, and the metrics name
  client 2 by its loss and the client-stacked leaves (the server's mean
  carries the NaN to every client's row); jitted at the edge where the
  round can be traced, run as it is where it cannot."""
  algo, state, clients = _start("fedbc")
  algo = dataclasses.replace(algo, traceable=traceable)
  step = rounds.compiled_round(algo)
  assert (step.__name__ == "finite_round") != traceable  # jitted or not
  kept = jax.tree.map(jnp.copy, state)  # the jitted round donates state
  new, metrics = step(state, _with_nan(clients, 2))
  _same(new, kept)
  metrics, ok, flags = guard.split(metrics)
  assert not bool(ok)
  sentence = guard.describe(flags, None, metrics)
  assert sentence.startswith("client_loss of training client 2 (nan)")
  assert sentence.endswith("(rows of training clients 0, 1, 2 and 3)")
  state_flags, metric_flags = flags
  assert np.asarray(metric_flags["client_loss"]).tolist() == [
      False, False, True, False]
  rows = [np.asarray(f) for f in jax.tree.leaves(state_flags.client_params)]
  assert all(r.shape == (4,) for r in rows) and any(r[2] for r in rows)
