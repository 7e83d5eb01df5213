"""A run's plan: its configuration resolved, checked and located, once.

:func:`prepare` turns a :class:`RunConfig` (from flags, a sweep or Python)
into a :class:`Plan`: every default filled in (:mod:`.defaults`), every
check that can be made before anything is loaded or compiled (the models,
the PM, the sizes against the machine: :mod:`.limits`), the
algorithm's spec and the section it reads, the role of its PM, the
sections the run never reads, where the dataset's files are and how the
client axis runs. ``training.run`` and the commands take the plan; nothing
after it resolves, checks or searches again. Each refusal is one
``ValueError`` line naming the flag and what would be right.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from augfl_jax import algorithms, data, models
from augfl_jax.core import client_axis, fields
from augfl_jax.training import defaults, limits
from augfl_jax.training.config import (RunConfig, algorithm_config, pm_role,
                                       resume_changes, section_name,
                                       unread_sections, unused_sections)
from augfl_jax.training.stops import RunInterrupted

__all__ = ["Plan", "prepare", "validate"]


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a run will do, decided before anything is loaded or compiled.

  Attributes:
    config: the resolved configuration (every default filled in,
      ``data.data_dir`` where the files were found).
    spec: the algorithm's registry entry.
    section: the ``RunConfig`` section the algorithm reads.
    pm_role: what the run's PM does (``"none"``: the run has none).
    unread: the sections the run never reads.
    unused: the other algorithms' sections (among ``unread``): a run's
      configuration is the rest.
    location: where the dataset's files are.
    strategy: how the client axis runs, for the rounds and evaluations.
  """

  config: RunConfig
  spec: algorithms.AlgorithmSpec
  section: str
  pm_role: str
  unread: tuple[str, ...]
  unused: tuple[str, ...]
  location: data.Location
  strategy: client_axis.ClientStrategy

  @property
  def algorithm_config(self) -> Any:
    """The algorithm's config: the section it reads."""
    return getattr(self.config, self.section)

  @property
  def lower(self) -> tuple[str, ...]:
    """What a non-finite round advises to lower: the fields of the
    algorithm's section that a resume may change when named
    (``resume_changes``), but those at 0 (a weight switched off)."""
    head = self.section + "."
    return tuple(n for n in resume_changes(self.config)
                 if n.startswith(head) and fields.get(self.config, n) != 0)

  def keys(self) -> tuple[jax.Array, jax.Array]:
    """``(init_key, run_key)`` from the seed: the client model's
    initialisation, and the algorithm's and regulariser's state."""
    init_key, run_key = jax.random.split(jax.random.key(self.config.seed))
    return init_key, run_key


def _without_pm(config: RunConfig) -> str:
  """``", or use --<field>=0"``: a field of the algorithm's section that
  leaves the PM out at 0 (AugFL's lam), or ``""`` when there is none."""
  spec, section = algorithms.spec(config.algorithm), section_name(config)
  for name, _, _, value in fields.walk(algorithm_config(config),
                                       section + "."):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      try:
        off = algorithm_config(fields.replace(config, **{name: 0 * value}))
      except ValueError:
        continue
      if spec.active_role(off, config.regularizer) == "none":
        return f", or use --{name}=0"
  return ""


def _check_models(config: RunConfig, role: str) -> None:
  """Refuses (``ValueError``) an unknown client model, a PM without a
  server split to train it on, or an unknown PM or PM kwargs."""
  known_models, d = models.available_models(), config.data
  checks = [
      (config.model in known_models, f"unknown --model {config.model!r}; "
       f"choose one of {', '.join(known_models)}"),
      (role == "none" or d.server_size > 0,
       f"{config.algorithm} needs a pretrained model, trained on a server "
       "split, but --data.server_size is 0; give the server examples "
       "(--data.server_size=N)" + _without_pm(config)),
      (role == "none" or config.pm.model in known_models,
       f"unknown --pm.model {config.pm.model!r}; choose one of "
       f"{', '.join(known_models)}"),
  ]
  for ok, message in checks:
    if not ok:
      raise ValueError(message)
  if role != "none" and config.pm.kwargs:
    limits.check_pm_kwargs(config, defaults.model_kwargs(
        config.pm.model, config.norm, config.pm.kwargs, config.conv_impl))


def _locate(config: RunConfig) -> data.Location:
  """Where the dataset's files are (fetched first with ``data.download``),
  and its test split where ``--eval.test_split=on`` needs one."""
  if config.data.download:
    try:
      data.fetch(config.dataset, config.data.data_dir,
                 form=config.data.download_as)
    except data.DownloadInterrupted as e:
      raise RunInterrupted(str(e), e.signum, 0, None) from None
  location = data.locate(config.dataset, config.data.data_dir)
  if config.eval.test_split == "on":
    try:
      data.locate_test_split(config.dataset, location)
    except data.OfficialTestSplitUnavailable as e:
      raise ValueError(f"--eval.test_split=on: {e}; pass "
                       "--eval.test_split=auto or off to run without "
                       "it") from None
  return location


def prepare(config: RunConfig) -> Plan:
  """Resolves ``config``, checks it and locates its data (fetched first
  with ``data.download``, :func:`augfl_jax.data.fetch`): the run's plan.

  Raises:
    ValueError: one line saying what is wrong and what would be right.
    data.DatasetUnavailableError: the dataset's files are not on this
      machine (one line: the files, the places searched, how to get them),
      or ``data.download`` could not fetch them (``data.DownloadError``).
    RunInterrupted: SIGINT or SIGTERM while they were fetched (what
      arrived is kept; the same command continues).
  """
  spec = algorithms.spec(config.algorithm)
  config = defaults.resolve(config)
  role = pm_role(config)
  _check_models(config, role)
  section, unread = section_name(config), unread_sections(config)
  unused = unused_sections(config)
  limits.check(config, unread)
  name, _, inner = config.strategy.partition(":")  # "sharded:map"
  strategy = client_axis.ClientStrategy(name, config.chunk_size or None,
                                        inner=inner or "vmap")
  location = _locate(config)
  if location.kind != "embedded":  # record where the files are
    config = fields.replace(config, **{"data.data_dir": location.path})
  return Plan(config=config, spec=spec, section=section, pm_role=role,
              unread=unread, unused=unused, location=location,
              strategy=strategy)


def validate(config: RunConfig) -> RunConfig:
  """``prepare(config).config``: the resolved, checked configuration."""
  return prepare(config).config
