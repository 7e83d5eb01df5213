"""Class prototypes and local-training bits shared by FedProto, FedPCL, FedCP.

Prototype of class k on client i (FedProto, Tan et al. 2022, Eq. 3): the mean
feature of the client's REAL examples of class k,

  ``C_i^(k) = sum_j m_j [y_j = k] f(x_j) / n_ik``,
  ``n_ik = sum_j m_j [y_j = k]`` (m_j the mask),

zero with count 0 for a class the client does not hold. The server's global
prototype of class k over the clients that hold it:

  ``"count"``:   ``Cbar^(k) = sum_i n_ik C_i^(k) / sum_i n_ik``   (each client
                 weighted by its number of examples of class k; the FedProto
                 paper's weights ``|D_ik| / N_k``, whose extra ``1/|N_k|``
                 factor in Eq. 4 we read as a typo: it would shrink every
                 prototype);
  ``"uniform"``: ``Cbar^(k) = mean_{i: n_ik > 0} C_i^(k)`` (the public code of
                 FedProto and FedPCL, ``proto_aggregation``).

Also here: the state of a prototype method and its initialisation, the
server side of its round, nearest-prototype prediction and the classifier
head of a library model (FedProto, FedPCL, FedCP).
"""

from __future__ import annotations

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from augfl_jax.core import tree
from augfl_jax.algorithms import averaging
from augfl_jax.core.types import Params, PRNGKey

__all__ = [
    "aggregate_prototypes", "class_counts", "class_prototypes", "head_name",
    "head_shape", "init_state", "nearest_prototype", "PrototypeState",
    "server_step", "squared_distances", "WEIGHTINGS"
]

WEIGHTINGS = ("count", "uniform")


def class_counts(labels: jax.Array, mask: jax.Array,
                 num_classes: int) -> jax.Array:
  """``[K]`` number of real examples (``mask > 0``) of each class."""
  real = mask > 0
  onehot = jax.nn.one_hot(jnp.where(real, labels, 0), num_classes)
  return jnp.sum(onehot * real[:, None], axis=0)


def class_prototypes(features: jax.Array, labels: jax.Array, mask: jax.Array,
                     num_classes: int) -> tuple[jax.Array, jax.Array]:
  """Per-class masked mean features of one client.

  Args:
    features: ``[n, d]``.
    labels: ``[n]`` int (anything on padded rows).
    mask: ``[n]``, 1 = real example, 0 = padding.
    num_classes: K.

  Returns:
    ``(prototypes [K, d], counts [K])``: row k is the mean of the real rows of
    class k (zeros where ``counts[k] == 0``).
  """
  real = mask > 0
  onehot = jax.nn.one_hot(jnp.where(real, labels, 0), num_classes,
                          dtype=features.dtype) * real[:, None]
  safe = jnp.where(real[:, None], features, 0.0)  # padding may hold anything
  counts = jnp.sum(onehot, axis=0)
  sums = onehot.T @ safe
  return sums / jnp.maximum(counts, 1.0)[:, None], counts


def aggregate_prototypes(local_protos: jax.Array, local_counts: jax.Array,
                         weighting: str = "count"
                        ) -> tuple[jax.Array, jax.Array]:
  """Global prototypes from every client's local ones (module docstring).

  Args:
    local_protos: ``[C, K, d]``.
    local_counts: ``[C, K]``, n_ik (0: client i does not hold class k).
    weighting: ``"count"`` or ``"uniform"``.

  Returns:
    ``(global_protos [K, d], global_counts [K])`` with ``global_counts[k] =
    N_k = sum_i n_ik``; a class nobody holds has a zero row and count 0.
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got "
                     f"{weighting!r}")
  held = local_counts > 0
  w = local_counts if weighting == "count" else held.astype(local_counts.dtype)
  w = jnp.where(held, w, 0.0)
  total = jnp.sum(w, axis=0)
  protos = jnp.einsum("ck,ckd->kd", w,
                      jnp.where(held[..., None], local_protos, 0.0))
  return (protos / jnp.where(total > 0, total, 1.0)[:, None],
          jnp.sum(local_counts, axis=0))


@flax.struct.dataclass
class PrototypeState:
  """The state of a prototype method (FedProto, FedPCL).

  Attributes:
    client_params: the personal models (FedPCL: projectors), leaves
      ``[C, ...]``.
    local_protos: ``[C, K, d]``, the latest prototypes each client sent.
    local_counts: ``[C, K]``, their example counts n_ik (0: not held / not
      reported yet).
    global_protos: ``[K, d]``, Cbar.
    global_counts: ``[K]``, N_k (0: no global prototype for class k).
    init_params: theta^0, where a new client starts.
    key: the root PRNG key.
    round: scalar int32, rounds completed.
  """

  client_params: Params
  local_protos: jax.Array
  local_counts: jax.Array
  global_protos: jax.Array
  global_counts: jax.Array
  init_params: Params
  key: PRNGKey
  round: jax.Array


def init_state(params: Params, num_clients: int, key: PRNGKey, *,
               num_classes: int | None = None,
               feature_dim: int | None = None) -> PrototypeState:
  """Every client starts from ``params``; no prototypes yet.

  ``num_classes`` and ``feature_dim`` default to the shape of the model's
  classifier kernel ``[d, K]`` (``params["head"]`` or ``params["fc"]``).
  """
  if num_classes is None or feature_dim is None:
    d, k = head_shape(params)
    num_classes = k if num_classes is None else num_classes
    feature_dim = d if feature_dim is None else feature_dim
  return PrototypeState(
      client_params=tree.broadcast_to_clients(params, num_clients),
      local_protos=jnp.zeros((num_clients, num_classes, feature_dim)),
      local_counts=jnp.zeros((num_clients, num_classes)),
      global_protos=jnp.zeros((num_classes, feature_dim)),
      global_counts=jnp.zeros((num_classes,)),
      init_params=params, key=key, round=jnp.zeros((), jnp.int32))


def server_step(state: PrototypeState, merge: Callable, params: Params,
                protos: jax.Array, counts: jax.Array, losses: jax.Array,
                weights: jax.Array, weighting: str):
  """The server side of a prototype round (FedProto, FedPCL).

  Writes the participants' personal models, prototypes ``[K_p, K, d]`` and
  counts ``[K_p, K]`` into the stacked state with ``merge`` (see
  ``augfl_jax.core.tree.client_subset``), aggregates every client's latest
  prototypes into the global ones and counts the round.

  Returns:
    ``(new_state, metrics)``: ``loss`` (participants' training loss,
    ``weights``-weighted) and ``client_loss`` (``[K_p]``).
  """
  local_protos = merge(state.local_protos, protos)
  local_counts = merge(state.local_counts, counts)
  global_protos, global_counts = aggregate_prototypes(
      local_protos, local_counts, weighting)
  new_state = state.replace(
      client_params=merge(state.client_params, params),
      local_protos=local_protos, local_counts=local_counts,
      global_protos=global_protos, global_counts=global_counts,
      round=state.round + 1)
  return new_state, averaging.loss_metrics(losses, weights)


def squared_distances(features: jax.Array, protos: jax.Array) -> jax.Array:
  """``||f_j - p_k||^2`` for every pair: ``[n, d] x [K, d] -> [n, K]``."""
  return jnp.sum((features[:, None, :] - protos[None, :, :]) ** 2, axis=-1)


def nearest_prototype(features: jax.Array, protos: jax.Array,
                      valid: jax.Array) -> jax.Array:
  """``argmin_{k valid} ||f_j - p_k||^2`` per row (``[n]`` int32).

  Args:
    features: ``[n, d]``.
    protos: ``[K, d]``.
    valid: ``[K]`` bool, the classes that may be predicted.
  """
  dist = jnp.where(valid[None, :], squared_distances(features, protos),
                   jnp.inf)
  return jnp.argmin(dist, axis=-1).astype(jnp.int32)


def head_name(params: Params) -> str:
  """The name of the final ``Dense`` of a library model (``"head"`` or
  ``"fc"``), whose kernel ``[d, K]`` maps the features to the logits."""
  for name in ("head", "fc"):
    if name in params and "kernel" in params[name]:
      return name
  raise ValueError(
      "expected the model's classifier under params['head'] or params['fc'] "
      f"(a Dense with a 'kernel'), found top-level keys {sorted(params)}")


def head_shape(params: Params) -> tuple[int, int]:
  """``(feature_dim d, num_classes K)`` read from the classifier's kernel."""
  d, k = params[head_name(params)]["kernel"].shape
  return int(d), int(k)
