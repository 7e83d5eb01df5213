"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020).

Each client takes ``local_steps`` steps on the MAML objective
``F_i(w) = f_i(w - alpha grad f_i(w))`` from the server model, with three
independent minibatches per step: D from the support set, D' from the query
set and D'' from the support set.

* first order (``variant="fo"``): ``w <- w - beta grad f(w - alpha grad f(w, D), D')``
* Hessian-free (``variant="hf"``):
  ``w <- w - beta (I - alpha H(w, D'')) grad f(w - alpha grad f(w, D), D')``
  with the Hessian-vector product by central differences (step ``hf_delta``,
  as in the paper) or exactly (``hvp="exact"``).

The default is first order, the variant the AugFL authors' code runs as
its Per-FedAvg baseline. Hessian-free is unstable on Fashion-MNIST's
batch-norm cnn at the defaults: its round-1 training loss is 6.1e4 with the
finite-difference product (non-finite at round 2) and 14.0 with the exact
one, against 2.7 first order (seed 0, the fashion_mnist.flags preset).

The server averages the client models with sample weights, as FedAvg does.
Held-out clients: fast adaptation of the global model.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from augfl_jax.core import client_axis
from augfl_jax.core import hvp as hvp_lib
from augfl_jax.core import local
from augfl_jax.algorithms import averaging, base
from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.core.types import ClientData, LossFn, Params, PRNGKey

__all__ = [
    "init_state", "local_update", "make_round", "meta_step", "per_fedavg",
    "PerFedAvgConfig", "SPECS", "VARIANTS"
]

VARIANTS = ("fo", "hf")


@dataclasses.dataclass(frozen=True)
class PerFedAvgConfig(fields.Config):
  """Hyper-parameters of Per-FedAvg (Fallah et al. 2020)."""

  alpha: float = field(0.03, "inner step size alpha (also the held-out "
      "clients' adaptation step)", gt=0, resume="named")
  beta: float = field(0.05, "outer step size beta", gt=0, resume="named")
  local_steps: int = field(5, "local meta steps tau per round", ge=1)
  batch_size: int = field(10, "minibatch size of each of D, D', D''", ge=1)
  variant: str = field("fo", "fo (first order, as the AugFL authors' code "
      "runs it) or hf (Hessian-free: a finite-difference Hessian-vector "
      "product; non-finite by round 2 on Fashion-MNIST's cnn)",
      choices=VARIANTS)
  hvp: str = field("finite_difference", "hf's Hessian-vector product: "
      "finite_difference or exact", choices=hvp_lib.HVP_METHODS)
  hf_delta: float = field(1e-3, "hf's finite-difference step", gt=0)


def meta_step(loss_fn: LossFn, config: PerFedAvgConfig, params: Params,
              d: dict, d_prime: dict, d_second: dict):
  """One Per-FedAvg step on batches (D, D', D''); returns (params, loss at D')."""
  adapted = optax.tree.add_scale(params, -config.alpha,
                                 jax.grad(loss_fn)(params, d))
  loss, outer = jax.value_and_grad(loss_fn)(adapted, d_prime)
  if config.variant == "hf":
    correction = hvp_lib.hvp(lambda p: jax.grad(loss_fn)(p, d_second), params,
                             outer, delta=config.hf_delta, method=config.hvp)
    outer = optax.tree.add_scale(outer, -config.alpha, correction)
  return optax.tree.add_scale(params, -config.beta, outer), loss


def local_update(loss_fn: LossFn, config: PerFedAvgConfig, params: Params,
                 client: ClientData, key: PRNGKey):
  """``local_steps`` meta steps on one client; returns (params, mean loss)."""

  def step(params, step_key):
    k1, k2, k3 = jax.random.split(step_key, 3)
    bs = config.batch_size
    return meta_step(loss_fn, config, params,
                     local.sample_batch(k1, client.support, bs),
                     local.sample_batch(k2, client.query, bs),
                     local.sample_batch(k3, client.support, bs))

  params, losses = jax.lax.scan(step, params,
                                jax.random.split(key, config.local_steps))
  return params, jnp.mean(losses)


init_state = averaging.init_state


def make_round(loss_fn: LossFn, config: PerFedAvgConfig,
               strategy: str | client_axis.ClientStrategy | None = None,
               server_optimizer: optax.GradientTransformation | None = None):
  """Jitted Per-FedAvg ``round_fn(state, clients, participants=None)``;
  with a ``server_optimizer``, the server steps with it on the mean update
  (``averaging.make_averaging_round``)."""
  strategy = client_axis.as_strategy(strategy)
  return averaging.make_averaging_round(
      lambda p, c, k: local_update(loss_fn, config, p, c, k), strategy,
      server_optimizer)


per_fedavg = averaging.constructor("per_fedavg", make_round)


SPECS = (base.AlgorithmSpec("per_fedavg", PerFedAvgConfig, "none",
                            per_fedavg, label="Per-FedAvg",
                            eval_alpha=lambda config: config.alpha),)
