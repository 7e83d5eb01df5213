"""The rotated-domain protocol of ``experiments.ood`` and FedOA's personal
scoring.

* :class:`Protocol`: the domains' parameters; :func:`domains` draws them from
  the examples after the dataset's server split (``augfl_jax.data.rotated``);
* :func:`leave_out`: ``training.run``'s ``transform_data`` hook that trains
  on the other domains and tests on the held-out one;
* :func:`personal_accuracy`: FedOA's paper protocol, the training clients'
  personal adapters of a finished run on the whole held-out domain.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Sequence

from augfl_jax.core import fields
from augfl_jax import data, training
from augfl_jax.algorithms import fedoa
from augfl_jax.data import rotated
from augfl_jax.training import checkpoints, outputs


@dataclasses.dataclass(frozen=True)
class Protocol:
  """The rotated domains (``data.rotated.rotated_domains``'s arguments).

  Attributes:
    angles: one domain per angle, in degrees.
    clients_per_domain: clients of each domain.
    examples_per_client: examples of each client (support / query 50/50).
    shared_images: every domain rotates the same base images.
  """

  angles: tuple[float, ...] = tuple(float(a) for a in rotated.DEFAULT_ANGLES)
  clients_per_domain: int = 2
  examples_per_client: int = 100
  shared_images: bool = False

  def __post_init__(self):
    if len(self.angles) < 2 or len(set(self.angles)) != len(self.angles):
      raise ValueError(f"--angles must name at least 2 distinct domains, "
                       f"got {list(self.angles)}")
    if self.clients_per_domain < 1 or self.examples_per_client < 2:
      raise ValueError("--clients_per_domain must be >= 1 and "
                       "--examples_per_client >= 2, got "
                       f"{self.clients_per_domain} and "
                       f"{self.examples_per_client}")


def held_out_indices(protocol: Protocol,
                     held_out: Sequence[float] | None) -> list[int]:
  """Indices into ``protocol.angles`` of the held-out domains (``None``:
  all); raises ``ValueError`` for an angle that is not a domain."""
  if held_out is None:
    return list(range(len(protocol.angles)))
  unknown = [a for a in held_out if a not in protocol.angles]
  if unknown or not held_out:
    raise ValueError(f"--held_out must name domains among --angles "
                     f"{', '.join(f'{a:g}' for a in protocol.angles)}, got "
                     f"{', '.join(f'{a:g}' for a in held_out) or 'none'}")
  return [protocol.angles.index(a) for a in held_out]


@functools.lru_cache(maxsize=4)
def _dataset(name: str, data_dir: str | None, seed: int) -> data.Dataset:
  return data.load_dataset(name, data_dir=data_dir, seed=seed)


@functools.lru_cache(maxsize=8)
def domains(dataset: str, data_dir: str | None, seed: int, server_size: int,
            protocol: Protocol) -> list[rotated.RotatedDomain]:
  """The rotated domains of one seed, drawn from the examples after the
  dataset's server split (its first ``server_size``, which no client sees).

  Raises:
    ValueError: a dataset without images, or too few examples.
  """
  source = _dataset(dataset, data_dir, seed)
  if source.x.ndim not in (3, 4):
    raise ValueError(f"rotated domains need an image dataset; {dataset!r} "
                     f"holds {source.x.shape[1:]} vectors")
  pool = data.Dataset(name=dataset, x=source.x[server_size:],
                      y=source.y[server_size:],
                      num_classes=source.num_classes)
  return rotated.rotated_domains(
      pool, protocol.angles, clients_per_domain=protocol.clients_per_domain,
      examples_per_client=protocol.examples_per_client, seed=seed,
      shared_images=protocol.shared_images)


def describe(domains_: Sequence[rotated.RotatedDomain], held_out: int,
             server_size: int) -> str:
  """The partition summary of a leave-one-domain-out run."""
  d = domains_[held_out]
  sizes = [len(s) + len(q) for s, q in zip(d.support, d.query)]
  train = [f"{x.angle:g}" for i, x in enumerate(domains_) if i != held_out]
  return "\n".join([
      f"rotated domains: {', '.join(f'{x.angle:g}' for x in domains_)} "
      f"degrees, {d.num_clients} clients each of {sizes[0]} examples "
      f"(support {len(d.support[0])} / query {len(d.query[0])})",
      f"clients: {d.num_clients * len(train)} train (domains "
      f"{', '.join(train)}), {d.num_clients} test (held-out domain "
      f"{d.angle:g})",
      f"server split: {server_size} examples (unrotated, in no domain)"])


def leave_out(plan: training.Plan, protocol: Protocol, held_out: int
             ) -> Callable[[data.FederatedData],
                           tuple[data.FederatedData, str]]:
  """``training.run``'s ``transform_data`` for the run of ``plan``: the
  clients of the other domains train, the held-out domain's clients are
  the test clients."""
  config = plan.config

  def transform(fed: data.FederatedData):
    server_size = len(fed.partition.server)
    domains_ = domains(config.dataset, config.data.data_dir, config.seed,
                       server_size, protocol)
    train, test = rotated.leave_one_out(domains_, held_out)
    return (dataclasses.replace(fed, train=train, test=test),
            describe(domains_, held_out, server_size))

  return transform


def personal_accuracy(run_dir: str, plan: training.Plan,
                      transform: Callable[..., Any]) -> float:
  """FedOA's paper protocol: the training clients' personal adapters of the
  run's last checkpoint, as they are, on the whole held-out domain
  (``fedoa.make_evaluate_personal`` on ``rotated.pool_clients``), the run
  built from its ``plan`` (``training.build``, ``transform`` its
  ``transform_data``).

  The result is kept in ``run_dir/personal.json`` with the configuration it
  scores, and reused for that configuration and round.

  Raises:
    ValueError: the run has no readable checkpoint of its last round.
  """
  config = plan.config
  path = os.path.join(run_dir, "personal.json")
  resolved = fields.to_dict(config)
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get("round") == config.rounds and saved.get(
        "config") == resolved:
      return saved["accuracy"]
  experiment = training.build(plan, transform_data=transform)
  manager = checkpoints.RunCheckpoints(os.path.join(run_dir, "checkpoints"))
  try:
    step, state, _ = experiment.restore(manager)
  finally:
    manager.close()
  if step != config.rounds:
    raise ValueError(f"{manager.directory} has no readable checkpoint of "
                     f"round {config.rounds} (newest readable: {step}) to "
                     "score FedOA's personal adapters")
  evaluate = fedoa.make_evaluate_personal(
      experiment.model, plan.algorithm_config, strategy=plan.strategy)
  accuracy = float(evaluate(state, rotated.pool_clients(experiment.data.test))
                   ["accuracy"])
  outputs.write_json_atomic(path, {"round": step, "accuracy": accuracy,
                                   "config": resolved})
  return accuracy


def check_protocol(out: str, protocol: Protocol) -> None:
  """Writes ``out/protocol.json``, or refuses a directory of another one."""
  path = os.path.join(out, "protocol.json")
  want = json.loads(json.dumps(dataclasses.asdict(protocol)))
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved != want:
      raise ValueError(f"{out} holds runs of another domain protocol "
                       f"({saved}, now {want}); choose another --output_dir")
    return
  os.makedirs(out, exist_ok=True)
  outputs.write_json_atomic(path, want)
