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
* ``intervals``: 95% confidence intervals across clients (the
  sample-weighted accuracy and paired differences) and across seeds.
* ``algorithms``: every method under one interface (``algorithms.REGISTRY``
  of ``AlgorithmSpec``: config class, PM role, constructor; ``build``).
* ``transfer``: the server's regulariser R_h (CRD, L2, none) from the PM.
* ``pretrain``, ``pm``: pretraining the PM on the server split; its
  checkpoint, reused only when it was trained for the run.
* ``models``: Flax models returning ``(features, logits)``.
* ``data``: datasets (IDX files, tfds copies, embedded), partitions and
  padded client arrays.
* ``training``: the experiment loop, ``training.run(config, output_dir)``,
  and its ``RunConfig``; ``fields``: dotted access to nested configs.
* ``local``, ``tree``, ``checks``, ``types``, ``progress``: local training (one
  minibatch loop on optax), pytree helpers, the client step's input
  checks, type aliases, time left.
"""

from augfl_jax import algorithms
from augfl_jax.algorithms import augfl
from augfl_jax.core import client_axis as clients
from augfl_jax import data
from augfl_jax.core import distributed
from augfl_jax.core import evaluation
from augfl_jax.core import fields
from augfl_jax.core import hvp
from augfl_jax.core import intervals
from augfl_jax.core import local
from augfl_jax import models
from augfl_jax import pm
from augfl_jax.pm import pretrain
from augfl_jax.core import progress
from augfl_jax import training
from augfl_jax import transfer
from augfl_jax.core import tree
from augfl_jax.core import types
from augfl_jax.core.types import Batch, ClientData, LossFn, Params, PRNGKey

__version__ = "0.1.0"
