"""A run built from its plan: :func:`build` is the one way from a
:class:`~augfl_jax.training.plan.Plan` to the run's data, its algorithm
and where that starts.

``training.run`` builds its run with it, and so do the commands that
score a finished run again (``experiments.ood_domains``), the benchmarks
and the tests::

  plan = training.prepare(config)
  experiment = training.build(plan)
  state = experiment.start()                 # the run's initial state
  state, metrics = experiment.algorithm.round(state, experiment.data.train)
  evaluations = experiment.evaluations()     # what the run scores

The state starts from the run's key (``plan.keys()``: the client model's
initialisation from the first, the algorithm's state from the second),
whoever builds it. The PM takes the role its algorithm declares
(:mod:`.pm_roles`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from augfl_jax import algorithms, data, models, processes
from augfl_jax.core import tree
from augfl_jax.training import defaults, pm_roles, scoring
from augfl_jax.training.checkpoints import RunCheckpoints
from augfl_jax.training.phases import Phases
from augfl_jax.training.plan import Plan

__all__ = ["Experiment", "Loaded", "build", "load", "load_federated",
           "sample_participants"]

Log = Callable[[str], None]
TransformData = Callable[[data.FederatedData],
                         data.FederatedData | tuple[data.FederatedData, str]]


def _quiet(line: str) -> None:
  del line


def load_federated(plan: Plan) -> data.FederatedData:
  """The run's federated data (``data.load_federated`` at the plan's
  location): ``describe()`` names the files read, the partition, the
  server split's class histogram, the test-split clients or why there are
  none."""
  config = plan.config
  d, test_split = config.data, config.eval.test_split
  try:
    fed = data.load_federated(
        config.dataset, num_clients=d.num_clients, M=d.M,
        classes_per_client=d.classes_per_client, server_size=d.server_size,
        partition=d.partition, dirichlet_alpha=d.dirichlet_alpha,
        support_fraction=d.support_fraction, seed=config.seed,
        location=plan.location,
        test_clients=0 if test_split == "off" else config.eval.test_clients,
        test_split="on" if test_split == "on" else "auto",
        server_overlap=d.server_overlap)
  except data.OfficialTestSplitUnavailable as e:
    raise ValueError(f"--eval.test_split=on: {e}") from None
  if test_split == "off":
    fed = dataclasses.replace(fed, test_split_off="--eval.test_split=off")
  return fed


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A run's data as it trains on them.

  Attributes:
    data: the federated data (``transform_data`` applied).
    description: ``partition.txt``: the files read, the partition, ...
  """

  data: data.FederatedData
  description: str

  @functools.cached_property
  def digest(self) -> str:
    """SHA-256 (hex) of every array the run reads: the training, held-out
    and test-split clients' examples, labels and masks, and the server
    split (shapes and dtypes included; ``core.tree.digest``); every
    checkpoint records it."""
    fed = self.data
    return tree.digest((fed.train, fed.test, fed.server,
                        None if fed.test_split is None
                        else fed.test_split.clients))


def load(plan: Plan, transform_data: TransformData | None = None) -> Loaded:
  """The run's data (:func:`load_federated`), ``transform_data`` applied:
  it returns the data, or ``(data, description)`` (tests put a NaN into a
  client; ``experiments.ood`` swaps in rotated domains)."""
  fed = load_federated(plan)
  description = fed.describe()
  if transform_data is not None:
    fed = transform_data(fed)
    if isinstance(fed, tuple):
      fed, description = fed
  return Loaded(fed, description)


def partial(clients_per_round: int, num_clients: int) -> bool:
  """Whether rounds take a subset of the ``num_clients`` clients."""
  return clients_per_round not in (0, num_clients)


def sample_participants(seed: int, round_: int, num_clients: int,
                        clients_per_round: int) -> np.ndarray | None:
  """The clients taking part in ``round_``: ``clients_per_round`` of them,
  uniformly without replacement, reproducible from (seed, round); ``None``
  (everyone) when all take part (``clients_per_round`` 0 or ``C``)."""
  if not partial(clients_per_round, num_clients):
    return None
  rng = np.random.default_rng([seed, round_])
  return np.sort(rng.choice(num_clients, clients_per_round, replace=False))


def _committed(state: Any) -> Any:
  """On one device, ``state`` committed to it: a round's outputs are, and
  jit compiles again for committed inputs after uncommitted ones."""
  if jax.device_count() != 1:
    return state
  return jax.device_put(state, jax.devices()[0])


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A run built from its plan (:func:`build`).

  Attributes:
    plan: the run's plan.
    loaded: its data (:class:`Loaded`: ``data``, ``description``,
      ``digest``).
    algorithm: the built ``FederatedAlgorithm``.
    params: the initial parameters of the model it trains.
    model: that model (the PM for a ``backbone`` method, the spec's head
      on the encoder's features for an ``encoder`` one).
  """

  plan: Plan
  loaded: Loaded
  algorithm: algorithms.FederatedAlgorithm
  params: Any
  model: nn.Module

  @property
  def data(self) -> data.FederatedData:
    """The run's federated data."""
    return self.loaded.data

  def participants(self, round_: int) -> np.ndarray | None:
    """The training clients taking part in ``round_`` (None: all):
    :func:`sample_participants` of the run's seed."""
    config = self.plan.config
    return sample_participants(config.seed, round_,
                               self.data.train.num_clients,
                               config.clients_per_round)

  def start(self) -> Any:
    """The state the run starts from: ``algorithm.start`` from the run's
    key (``plan.keys()[1]``) on the training clients, placed where the
    processes keep it (``processes.start``) and committed to its
    device."""
    config, train = self.plan.config, self.data.train
    key = self.plan.keys()[1]
    some = partial(config.clients_per_round, train.num_clients)
    return _committed(processes.start(
        lambda p, c: self.algorithm.start(p, c, key, some),
        (self.params, train), train.num_clients, self.plan.strategy))

  def restore(self, checkpoints: RunCheckpoints, log: Log = _quiet
             ) -> tuple[int, Any, dict[str, Any]]:
    """``(round, state, meta)`` of the newest checkpoint in
    ``checkpoints`` that reads back whole, into the structure and
    placement of :meth:`start`'s state (``CheckpointError`` when none
    does)."""
    round_, state, meta = checkpoints.restore(self.start(), log)
    return round_, _committed(state), meta

  def evaluations(self) -> dict[str, scoring.Evaluation]:
    """What a run of the plan scores (``scoring.Evaluation``s by name,
    the headline first): its held-out clients every ``eval_every`` rounds
    and after the last, and its test-split clients after the last round
    and every ``eval.test_split_every`` (or, where the data have none,
    why not)."""
    config, fed = self.plan.config, self.data
    evaluate = self.algorithm.evaluate
    split = fed.test_split
    return {
        "heldout": scoring.heldout(evaluate, fed.test, config.eval_every),
        "test_split": scoring.not_scored(
            fed.test_split_off or "not scored",
            config.eval.test_split_every) if split is None else
        scoring.test_split(evaluate, split, config.eval.test_split_every)}


def build(plan: Plan, loaded: Loaded | None = None, *,
          transform_data: TransformData | None = None, log: Log = _quiet,
          should_stop: Callable[[], bool] | None = None,
          phases: Phases | None = None) -> Experiment:
  """The run of ``plan``: its data (``loaded``, else :func:`load` with
  ``transform_data``), the client model, the PM in its role
  (:func:`pm_roles.wire`: loaded, or pretrained on the server split, first,
  so that a mismatched PM fails before anything compiles; ``should_stop``
  is asked meanwhile, ``pretrain.Stopped``), the initial parameters (from
  ``plan.keys()[0]`` where the PM gives none) and the algorithm.
  ``log`` gets the PM's, the model's and the algorithm's lines; given
  ``phases`` (``training.run``'s), the PM's part is timed as its ``pm``."""
  loaded = loaded or load(plan, transform_data)
  config, fed = plan.config, loaded.data
  client = models.create_model(
      config.model, fed.num_classes,
      **defaults.model_kwargs(config.model, config.norm,
                              conv_impl=config.conv_impl))
  with (phases.timed("pm") if phases and plan.pm_role != "none"
        else contextlib.nullcontext()):
    wired = pm_roles.wire(plan, client, fed, log, should_stop)
  params = wired.params
  if params is None:
    params = models.init_params(wired.model, plan.keys()[0],
                                wired.input_shape)
  log(f"model {wired.name}: {models.num_params(params):,} parameters; "
      f"algorithm {config.algorithm}; {fed.train.num_clients} train / "
      f"{fed.test.num_clients} test clients")
  if plan.spec.describe_start is not None:
    line = plan.spec.describe_start(
        plan.algorithm_config, models.make_loss_fn(wired.model), params,
        fed.train)
    if line:
      log(line)
  algorithm = algorithms.build(
      config.algorithm, wired.model, plan.algorithm_config,
      strategy=plan.strategy, eval_alpha=config.eval.alpha,
      eval_steps=config.eval.steps, regularizer=wired.regularizer,
      encoder_apply=wired.encoder_apply)
  return Experiment(plan, loaded, algorithm, params, wired.model)
