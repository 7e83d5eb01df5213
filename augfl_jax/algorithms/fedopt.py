"""FedAvgM, FedAdam and FedYogi: FedAvg's clients, a server optimizer.

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2;
FedAvgM after Hsu et al. (2019). Every round the participants run FedAvg's
local SGD from the server model ``x`` (``fedavg.local_update``) and the
server treats the mean update as a gradient: with
``Delta = x - sum_i |D_i| x_i / sum_i |D_i|`` (the paper's ``Delta_t`` with
its sign flipped, as optax minimises), ``x <- x + opt.update(Delta)``
(:func:`augfl_jax.algorithms.averaging.server_step`), where ``opt`` is

* FedAvgM: ``optax.sgd(server_lr, server_momentum)``, ``m <- beta m +
  Delta``, ``x <- x - eta m``;
* FedAdam: ``optax.adam(server_lr, beta1, beta2, eps=tau)``;
* FedYogi: ``optax.yogi(server_lr, beta1, beta2, eps=tau)``.

The server optimizer's state rides in the algorithm's state
(``averaging.ServerOptState``), so a resumed run continues its moments.

Where this differs from Algorithm 2 (optax 0.2.8):

* ``Delta`` is the sample-weighted mean update (``|D_i|`` weights, as this
  library's FedAvg); Algorithm 2 averages the participants' updates
  unweighted.
* Adam's and Yogi's moments are bias-corrected, ``m / (1 - beta1^t)`` and
  ``v / (1 - beta2^t)`` (Kingma and Ba's Adam; the authors' code ran
  Keras's Adam, which corrects them too); Algorithm 2 uses ``m_t`` and
  ``v_t`` as they are.
* ``tau`` sits outside the square root, ``m / (sqrt(v) + tau)``, as in
  Algorithm 2 (optax's ``eps``; its ``eps_root``, inside, stays 0).
* Yogi's second moment is Algorithm 2's, ``v <- v - (1 - beta2) Delta^2
  sign(v - Delta^2)``, but ``optax.yogi`` starts both moments at its
  ``initial_accumulator_value`` 1e-6 (``optax.yogi`` does not take it),
  where Algorithm 2 starts ``m`` at 0 and asks ``v_{-1} >= tau^2``: the
  same ``v`` at the default tau 1e-3, not for a larger tau.
  ``optax.adam`` starts both moments at 0.

Defaults, and where they come from (the paper's hyper-parameter tables are
also in the authors' repository, google-research/federated,
``optimization/docs/hyperparameters.md``):

* FedAvgM: server momentum 0.9 (the paper's for FedAvgM) at server step 1.0
  (its tuned step on CIFAR-100; 10^-0.5 on EMNIST CR).
* FedAdam, FedYogi: beta1 0.9, beta2 0.99 (the paper's, as Flower's
  FedAdam and FedYogi take them from its arXiv v5; the authors' repository
  notes that its runs kept Keras's beta2 0.999), tau 1e-3 (the adaptivity
  the authors recommend as the default), server step 10^-2.5 (about 0.0032): the best
  server learning rate of both on EMNIST character recognition, the
  paper's image task nearest to Fashion-MNIST (on CIFAR-100 it is 10^0,
  with tau 10^-1).
* Their clients are FedAvg's (``lr`` 0.05, one epoch, batches of 10), so a
  comparison with FedAvg differs on the server alone; the paper's best
  client step for all three on EMNIST CR is 10^-1.5.

A library user passes any other optax ``GradientTransformation``:
``averaging.constructor("fedadagrad", fedavg.make_round,
server_optimizer=optax.adagrad(0.1))`` is a FedAdagrad's ``build``.
"""

from __future__ import annotations

import dataclasses

import optax

from augfl_jax.algorithms import averaging, base, fedavg
from augfl_jax.core.fields import field

__all__ = [
    "AdaptiveConfig", "fedadam", "FedAdamConfig", "fedavgm",
    "FedAvgMConfig", "fedyogi", "FedYogiConfig", "server_optimizer", "SPECS"
]


@dataclasses.dataclass(frozen=True)
class FedAvgMConfig(fedavg.LocalSGDConfig):
  """FedAvgM: FedAvg's clients, server SGD with momentum."""

  server_lr: float = field(1.0, "server step size eta (Reddi et al. 2021's "
                           "tuned FedAvgM step on CIFAR-100)", gt=0,
                           resume="named")
  server_momentum: float = field(0.9, "server momentum beta: m <- beta m + "
                                 "Delta (Reddi et al. 2021's)", ge=0, lt=1)

  def optimizer(self) -> optax.GradientTransformation:
    """``optax.sgd(server_lr, server_momentum)``."""
    return optax.sgd(self.server_lr, self.server_momentum)


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig(fedavg.LocalSGDConfig):
  """FedAvg's clients and an adaptive server optimizer's fields (Reddi et
  al. 2021, Algorithm 2)."""

  server_lr: float = field(
      10 ** -2.5, "server step size eta (10^-2.5: Reddi et al. "
      "2021's best FedAdam and FedYogi step on EMNIST CR)", gt=0,
      resume="named")
  beta1: float = field(0.9, "decay of the server's first moment m (Reddi "
                       "et al. 2021's)", ge=0, lt=1)
  beta2: float = field(0.99, "decay of the server's second moment v (Reddi "
                       "et al. 2021's, as Flower takes it)", ge=0, lt=1)
  tau: float = field(1e-3, "adaptivity tau, added to sqrt(v) (the "
                     "authors' recommended default)", gt=0)


@dataclasses.dataclass(frozen=True)
class FedAdamConfig(AdaptiveConfig):
  """FedAdam: FedAvg's clients, Adam on the server."""

  def optimizer(self) -> optax.GradientTransformation:
    """``optax.adam(server_lr, beta1, beta2, eps=tau)``."""
    return optax.adam(self.server_lr, b1=self.beta1, b2=self.beta2,
                      eps=self.tau)


@dataclasses.dataclass(frozen=True)
class FedYogiConfig(AdaptiveConfig):
  """FedYogi: FedAvg's clients, Yogi on the server."""

  def optimizer(self) -> optax.GradientTransformation:
    """``optax.yogi(server_lr, beta1, beta2, eps=tau)``."""
    return optax.yogi(self.server_lr, b1=self.beta1, b2=self.beta2,
                      eps=self.tau)


def server_optimizer(config: FedAvgMConfig | FedAdamConfig | FedYogiConfig
                    ) -> optax.GradientTransformation:
  """The optax server optimizer of a FedAvgM, FedAdam or FedYogi config
  (its ``optimizer()``)."""
  return config.optimizer()


# The constructors (``base.AlgorithmSpec.build``).
fedavgm = averaging.constructor("fedavgm", fedavg.make_round,
                                server_optimizer)
fedadam = averaging.constructor("fedadam", fedavg.make_round,
                                server_optimizer)
fedyogi = averaging.constructor("fedyogi", fedavg.make_round,
                                server_optimizer)


SPECS = (base.AlgorithmSpec("fedavgm", FedAvgMConfig, "none", fedavgm,
                            label="FedAvgM"),
         base.AlgorithmSpec("fedadam", FedAdamConfig, "none", fedadam,
                            label="FedAdam"),
         base.AlgorithmSpec("fedyogi", FedYogiConfig, "none", fedyogi,
                            label="FedYogi"))
