"""augfl_jax: pretrained-model-aided personalised federated learning in JAX.

The public API, by module:

* ``augfl``: ``client_update``, ``server_update``, ``make_round``,
  ``AugFLConfig``, ``AugFLState`` (Eqs. (7), (10)-(13)).
* ``hvp``: finite-difference and exact Hessian-vector products.
* ``clients``: how the client axis runs (``map_clients``, strategies).
* ``distributed``: a round's inputs as global arrays, for the ``"sharded"``
  strategy across processes (``jax.distributed``).
* ``evaluation``: fast adaptation on held-out clients; ``summarise``, the
  accuracy summary of every evaluator.
* ``algorithms``: every method under one interface (``algorithms.REGISTRY``
  of ``AlgorithmSpec``: config class, PM role, constructor; ``build``).
* ``models``: Flax models returning ``(features, logits)``.
* ``data``: datasets, partitions and padded client arrays.
* ``local``, ``tree``, ``types``: local training (one minibatch loop on
  optax), pytree helpers, type aliases.
"""

from augfl_jax import algorithms
from augfl_jax import augfl
from augfl_jax import clients
from augfl_jax import data
from augfl_jax import distributed
from augfl_jax import evaluation
from augfl_jax import hvp
from augfl_jax import local
from augfl_jax import models
from augfl_jax import tree
from augfl_jax import types
from augfl_jax.types import Batch, ClientData, LossFn, Params, PRNGKey

__version__ = "0.1.0"
