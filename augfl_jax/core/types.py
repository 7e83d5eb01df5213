"""Type aliases and the small dataclasses every module shares.

Conventions (the library's public contract):

* ``Batch`` is a mapping ``{"x": [n, ...] float32, "y": [n] int32,
  "mask": [n] float32}``. ``mask`` is 1.0 for a real example and 0.0 for
  padding; every loss, gradient, statistic and metric is a masked mean, so
  padded rows change nothing. A batch without ``mask`` is taken to have no
  padding: every row counts. ``y`` lies in ``[0, K)`` for ``K`` classes
  (checked where data are built, not under jit).
* Per-client quantities carry a leading client axis ``C``: a stacked batch is
  ``{"x": [C, n, ...], "y": [C, n], "mask": [C, n]}``; per-client state (duals,
  round counters, personal models, ...) is one pytree whose leaves all start
  with ``C``.
* ``LossFn(params, batch) -> scalar`` is the masked mean loss of one client's
  batch. Algorithms only ever see the model through such functions.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.struct
import jax

__all__ = ["Batch", "ClientData", "LossFn", "Params", "PRNGKey"]

Params = Any  # a pytree of arrays
PRNGKey = jax.Array
Batch = Mapping[str, jax.Array]
LossFn = Callable[[Params, Batch], jax.Array]


@flax.struct.dataclass
class ClientData:
  """The local data of one client, or of ``C`` clients stacked.

  Attributes:
    support: the support set D_i^s, a ``Batch`` of ``[S, ...]`` leaves
      (``[C, S, ...]`` when stacked).
    query: the query set D_i^q, ``[Q, ...]`` (``[C, Q, ...]``).
    num_examples: ``|D_i| = |D_i^s| + |D_i^q|`` counted from the masks,
      float32 scalar (``[C]``).
  """

  support: Batch
  query: Batch
  num_examples: jax.Array

  @property
  def num_clients(self) -> int:
    """Size of the leading client axis (only meaningful when stacked)."""
    return self.num_examples.shape[0]
