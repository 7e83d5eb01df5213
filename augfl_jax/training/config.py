"""The configuration of one run: nested, typed, each field with its help.

``RunConfig`` holds every choice a run makes. Its top-level fields are what
almost every run sets (``algorithm``, ``dataset``, ``rounds``, ...); the rest
sits in sections: ``data``, ``pm`` (the pretrained model), ``crd`` (AugFL's
R_h, :class:`augfl_jax.transfer.CRDConfig`), ``eval`` (fast adaptation of
held-out clients) and one section per algorithm, which IS that algorithm's
own config class (``augfl``: :class:`augfl_jax.algorithms.augfl.AugFLConfig`,
``fedavg``: ``FedAvgConfig``, ...), so a method's hyper-parameters never
leak into another's and a renamed field breaks loudly. An algorithm reads
the section whose type is its spec's config class (:func:`section_name`):
``kt_only`` reads ``augfl``, ``per_fedbc`` reads ``fedbc`` and ``fedlp``
reads ``fedavg``. A method registered from outside the package whose config
class has no section here gets one named after it in :func:`config_class`,
the ``RunConfig`` that commands build their flags from.

A field left ``None`` (or ``"auto"``) takes the dataset's preset, then the
paper's value (§VI-A), then the backend's measured choice:
:func:`augfl_jax.training.defaults.resolve` fills them in, and ``config.json``
records the resolved configuration, with the sections its run read
(:data:`READ_SECTIONS`: :func:`to_config_json`, :func:`from_config_json`).
Flags, sweeps and ``config.json`` name a field by its dotted path
(``augfl.rho``, ``data.server_size``).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from augfl_jax import algorithms, data, models
from augfl_jax.algorithms import (augfl, fedavg, fedbc, fedcp, fedit, fedoa,
                                  fedopt, fedpcl, fedproto, per_fedavg)
from augfl_jax.core import client_axis, fields
from augfl_jax.core.fields import field
from augfl_jax.transfer import crd

__all__ = [
    "algorithm_config", "AUTO", "config_class", "DataConfig", "EvalConfig",
    "from_config_json", "pm_role", "PMConfig", "READ_SECTIONS",
    "resumable_fields", "resume_changes", "RunConfig", "section_name",
    "to_config_json", "unread_sections", "unused_sections"
]

AUTO = "auto"  # strategy, conv_impl: the backend's measured choice


def _algorithm_help() -> str:
  """``--algorithm``'s help: the registered methods, in the registry's
  order."""
  return ("the method (augfl_jax.algorithms.REGISTRY): "
          + ", ".join(algorithms.REGISTRY))


def _dataset_help() -> str:
  """``--dataset``'s help: the catalog's datasets (``data.DATASETS``),
  grouped by what they are read from, and their other names."""
  groups: dict[str, list[str]] = {}
  for spec in data.DATASETS.values():
    forms = (["embedded: no files"] if spec.embedded else
             ["IDX files"] * bool(spec.idx_files) +
             ["CIFAR binary files"] * bool(spec.cifar_files) +
             ["a tfds prepared copy"] * bool(spec.tfds_name))
    groups.setdefault(" or ".join(forms), []).append(spec.name)
  return "; ".join([f"{', '.join(names)} ({form})"
                    for form, names in groups.items()] +
                   [f"{alias} = {name}"
                    for alias, name in data.ALIASES.items()])


@dataclasses.dataclass(frozen=True)
class DataConfig(fields.Config):
  """Which examples each client and the server hold (§VI-A)."""

  data_dir: str | None = field(
      None, "searched first for the dataset's files (its IDX or CIFAR "
      "binary files, or a tfds prepared copy); then $AUGFL_JAX_DATA_DIR, "
      "the user data directory, the Debian package's directory "
      "(fashion_mnist) and the tfds default directory",
      resume="free")
  download: bool = field(
      False, "fetch the dataset's official files (SHA-256 checked against "
      "the catalog) when they are not on this machine, into "
      "--data.data_dir, else $AUGFL_JAX_DATA_DIR, else the user data "
      "directory (~/.cache/augfl_jax), where later runs find them; off, "
      "nothing is ever fetched", resume="free")
  download_as: str = field(
      "files", "what --data.download makes: files (the official IDX or "
      "CIFAR binary files) or tfds (a tfds prepared copy, prepared by tfds; "
      "the tfds extra)", choices=("files", "tfds"), resume="free")
  num_clients: int | None = field(
      None, "clients N, 80% train / 20% held out (default: the dataset's, "
      "the paper's: 50, or 100 for EMNIST and CIFAR-100; digits 40)", ge=2)
  M: int = field(20, "client sizes are uniform on {M, ..., 2M}",  # pylint: disable=invalid-name
                 ge=1)
  classes_per_client: int = field(
      2, "classes per client (pathological partition)")
  server_size: int | None = field(
      None, "the server split: the first n training examples (default "
      "10000; digits 400); synthetic: n examples drawn from its clients "
      "(default none, 500 for a method with a PM)", ge=0)
  partition: str = field(
      "pathological", "how labels are split: pathological (the paper's), "
      "dirichlet, or authors (the authors' code's division of the train and "
      "test files joined, z-scored per pixel: fixed cyclic class pairs, "
      "sizes from Python's random seeded per user, fixed held-out users; "
      "augfl_jax.data.authors)",
      choices=("pathological", "dirichlet", "authors"))
  dirichlet_alpha: float = field(
      0.5, "concentration of the Dirichlet label skew")
  support_fraction: float = field(
      0.5, "fraction of a client's examples in its support set (the "
      "paper's 50/50; the reference code's 0.2 for Fashion-MNIST, EMNIST)")
  server_overlap: bool = field(
      False, "clients may hold examples of the server split, on which the "
      "PM is pretrained: false keeps them disjoint (the paper's: the PM's "
      "data do not overlap the clients'); true lets clients draw from the "
      "start of the data, as the authors' code, whose every Fashion-MNIST "
      "client image lies inside its server's first 10,000")


@dataclasses.dataclass(frozen=True)
class PMConfig(fields.Config):
  """The server's pretrained model (PM), trained on the server split only."""

  model: str | None = field(
      None, "PM architecture (default resnet32x4; digits cnn; synthetic "
      "mlp; the client model for a method whose PM starts or encodes the "
      "clients, PM role initialization or encoder)")
  epochs: int | None = field(
      None, "pretraining epochs when no matching PM is saved (default 240, "
      "the reference's; digits 30)", ge=1)
  kwargs: str = field("", "JSON keyword arguments of the PM model, e.g. "
                      "'{\"hidden\": [512, 256]}'")
  lr: float = field(0.05, "pretraining's initial learning rate, x0.1 at "
                    "62.5%, 75% and 87.5% of the epochs (the reference's)",
                    gt=0)
  batch_size: int = field(64, "pretraining's minibatch size (the "
                          "reference's)", ge=1)
  holdout_fraction: float = field(
      0.1, "the last fraction of the server split held out to report the "
      "PM's accuracy (not trained on)", ge=0, lt=1)
  dir: str | None = field(
      None, "the PM's checkpoint directory (default runs/pm/<dataset>_"
      "<model>..._e<epochs>_srv<n>); reused when it was trained for the "
      "run (dataset, architecture, split, recipe), pretrained when missing, "
      "refused otherwise")
  checkpoint_every_steps: int = field(
      0, "while the PM is pretrained, save its state every this many steps "
      "(0: at the end of every epoch) in <pm.dir>.pretraining, from which "
      "the same command continues an interrupted pretraining", ge=0,
      resume="free")
  statistics: str = field(
      "running", "how a batch-norm PM normalises when it teaches (CRD) or "
      "encodes (FedPCL): running (eval mode, the statistics kept while it "
      "trained, as the reference's teacher) or batch (the statistics of "
      "each server minibatch)", choices=("running", "batch"))


@dataclasses.dataclass(frozen=True)
class EvalConfig(fields.Config):
  """How held-out clients are scored: fast adaptation (Algorithm 1)."""

  alpha: float | None = field(
      None, "step size of the adaptation SGD steps (default: the "
      "algorithm's own alpha where it has one, AugFL and Per-FedAvg, else "
      "0.03, the paper's)", gt=0, resume="named")
  steps: int = field(
      1, "SGD steps on a held-out client's support set before it is scored "
      "on its query set", ge=0)
  test_split: str = field(
      "auto", "also score the run on many held-out clients drawn from the "
      "dataset's official test split under the run's partition protocol "
      "(digits: from the examples the partition left unused): auto (where "
      "there is one, saying so where there is none), on (a run without one "
      "stops before any work) or off", choices=("auto", "on", "off"))
  test_clients: int = field(
      1000, "how many test-split clients (the same for every method and "
      "configuration of a seed)", ge=0)
  test_split_every: int = field(
      0, "also score the test-split clients every this many rounds (0: only "
      "after the last round)", ge=0, resume="free")

  def __post_init__(self):
    super().__post_init__()
    if self.test_clients < 1 and self.test_split != "off":
      raise ValueError(f"test_clients must be >= 1, got {self.test_clients} "
                       "(test_split=off scores no test-split clients)")


@dataclasses.dataclass(frozen=True)
class RunConfig(fields.Config):
  """Everything a run depends on (the module docstring says how to read it).

  Example::

    config = RunConfig(dataset="fashion_mnist", rounds=100)
    config = fields.replace(config, **{"augfl.lam": 0.0})   # AugFL w/o PM
  """

  algorithm: str = field("augfl", _algorithm_help())
  dataset: str = field("digits", _dataset_help())
  model: str | None = field(
      None, "client model: mlp, cnn, logreg, resnet8x4, ... (default: the "
      "dataset's: digits mlp, synthetic logreg, 28x28 images cnn, CIFAR "
      "resnet8x4)")
  norm: str | None = field(
      None, "normalisation layers of the client model and the PM: batch "
      "(statistics of the batch at hand, padding masked; the default), "
      "group (the default on digits) or none",
      choices=("batch", "group", "none"))
  conv_impl: str = field(
      AUTO, "how the convolutions and max-pools of cnn / resnet models run: "
      "auto (patches on CPU, xla elsewhere), xla or patches; the same "
      "parameters and outputs up to float rounding",
      choices=(AUTO,) + models.CONV_IMPLS, resume="free")
  regularizer: str = field(
      "crd", "AugFL's server regulariser R_h: crd, l2 (same architecture "
      "only) or none", choices=("crd", "l2", "none"))
  rounds: int = field(300, "communication rounds", ge=1, resume="free")
  eval_every: int = field(10, "score the held-out clients every this many "
                          "rounds (and after the last)", ge=1, resume="free")
  clients_per_round: int = field(
      0, "clients sampled per round, reproducibly from the seed (0: all); "
      "AugFL aggregates the stale (theta_i, y_i) of the others", ge=0)
  seed: int = field(0, "seed of the partition, the initialisation and the "
                    "run")
  strategy: str = field(
      AUTO, "how the client axis runs: auto (the backend's measured choice: "
      "map on CPU, vmap on GPU/TPU), vmap, map, chunked or sharded (over "
      "all devices, vmap on each; sharded:map, sharded:chunked: map or "
      "chunks on each); across processes, the run shards the client axis "
      "over all devices and runs this strategy on each",
      choices=(AUTO,) + client_axis.STRATEGIES + tuple(
          f"sharded:{inner}" for inner in client_axis.INNER_STRATEGIES),
      resume="free")
  chunk_size: int = field(0, "clients per chunk for --strategy=chunked",
                          ge=0, resume="free")
  data: DataConfig = field(default_factory=DataConfig,
                           help="the data and its federated partition")
  pm: PMConfig = field(default_factory=PMConfig, help="the pretrained model")
  crd: crd.CRDConfig = field(default_factory=crd.CRDConfig,
                             help="AugFL's R_h, contrastive representation "
                             "distillation (Section V)")
  eval: EvalConfig = field(default_factory=EvalConfig,
                           help="fast adaptation of held-out clients")
  augfl: augfl.AugFLConfig = field(
      default_factory=lambda: augfl.AugFLConfig(lam=5.0),
      help="AugFL and KT-only (Eqs. 7, 10-13); lam 0 is AugFL w/o PM")
  fedavg: fedavg.FedAvgConfig = field(default_factory=fedavg.FedAvgConfig,
                                      help="FedAvg and FedLP")
  fedavgm: fedopt.FedAvgMConfig = field(
      default_factory=fedopt.FedAvgMConfig,
      help="FedAvgM: FedAvg's clients, server SGD with momentum")
  fedadam: fedopt.FedAdamConfig = field(
      default_factory=fedopt.FedAdamConfig,
      help="FedAdam: FedAvg's clients, Adam on the server (Reddi et al. "
      "2021)")
  fedyogi: fedopt.FedYogiConfig = field(
      default_factory=fedopt.FedYogiConfig,
      help="FedYogi: FedAvg's clients, Yogi on the server (Reddi et al. "
      "2021)")
  per_fedavg: per_fedavg.PerFedAvgConfig = field(
      default_factory=per_fedavg.PerFedAvgConfig, help="Per-FedAvg")
  fedbc: fedbc.FedBCConfig = field(
      default_factory=lambda: fedbc.FedBCConfig(alpha=0.03),
      help="FedBC and Per-FedBC")
  fedproto: fedproto.FedProtoConfig = field(
      default_factory=fedproto.FedProtoConfig, help="FedProto")
  fedpcl: fedpcl.FedPCLConfig = field(default_factory=fedpcl.FedPCLConfig,
                                      help="FedPCL")
  fedcp: fedcp.FedCPConfig = field(default_factory=fedcp.FedCPConfig,
                                   help="FedCP")
  fedit: fedit.FedITConfig = field(default_factory=fedit.FedITConfig,
                                   help="FedIT")
  fedoa: fedoa.FedOAConfig = field(default_factory=fedoa.FedOAConfig,
                                   help="FedOA")


def _section_types(cls: type) -> dict[type, str]:
  """``{section type: field name}`` of the dataclass sections of ``cls``."""
  hints = typing.get_type_hints(cls)
  return {hints[f.name]: f.name for f in dataclasses.fields(cls)
          if dataclasses.is_dataclass(hints[f.name])}


@functools.lru_cache(maxsize=None)
def _with_sections(extra: tuple[tuple[str, type, str], ...]) -> type:
  """``RunConfig`` with the sections ``(name, config class, help)``."""
  return dataclasses.make_dataclass(
      "RunConfig", [(name, cls, field(default_factory=cls, help=text))
                    for name, cls, text in extra],
      bases=(RunConfig,), frozen=True,
      namespace={"__module__": __name__, "__doc__": RunConfig.__doc__})


def config_class() -> type[RunConfig]:
  """``RunConfig``, plus a section for each registered algorithm whose
  config class has none (a user's method, ``algorithms.register``), named
  after the first such algorithm: what commands build their flags and read
  ``config.json`` with.

  Raises:
    ValueError: a registered algorithm's name is already a field of
      ``RunConfig``.
  """
  known = _section_types(RunConfig)
  extra, names = [], {f.name for f in dataclasses.fields(RunConfig)}
  for spec in algorithms.REGISTRY.values():
    if spec.config_class in known or any(
        cls is spec.config_class for _, cls, _ in extra):
      continue
    if spec.name in names:
      raise ValueError(f"algorithm {spec.name!r}: its config section would "
                       "take the name of a RunConfig field; register it "
                       "under another name")
    extra.append((spec.name, spec.config_class,
                  f"{spec.label_of(spec.config_class())}'s hyper-parameters"))
  return _with_sections(tuple(extra)) if extra else RunConfig


def section_name(config: RunConfig, algorithm: str | None = None) -> str:
  """The section of ``config`` that ``algorithm`` (default
  ``config.algorithm``) reads its hyper-parameters from: the one whose type
  is the spec's config class."""
  spec = algorithms.spec(algorithm or config.algorithm)
  sections = _section_types(type(config))
  if spec.config_class not in sections:
    raise ValueError(f"{spec.name} reads a {spec.config_class.__name__}, "
                     f"which this {type(config).__name__} has no section for;"
                     " build it with training.config.config_class()")
  return sections[spec.config_class]


def algorithm_config(config: RunConfig) -> Any:
  """The config of ``config.algorithm``: its section."""
  return getattr(config, section_name(config))


def unused_sections(config: RunConfig) -> tuple[str, ...]:
  """The sections of the algorithms other than ``config.algorithm``: a
  run's configuration is the rest, so a change of another algorithm's
  default leaves its directory, its checkpoints and its plot labels as they
  were."""
  own = section_name(config)
  registered = {spec.config_class for spec in algorithms.REGISTRY.values()}
  return tuple(sorted(name for cls, name in _section_types(
      type(config)).items() if cls in registered and name != own))


def pm_role(config: RunConfig) -> str:
  """What the run's PM does (``algorithms.PM_ROLES``): its algorithm's
  role, or ``"none"`` where the algorithm's configuration leaves the PM out
  (``AlgorithmSpec.active_role``: AugFL at lam 0)."""
  return algorithms.spec(config.algorithm).active_role(
      algorithm_config(config), config.regularizer)


def unread_sections(config: RunConfig) -> tuple[str, ...]:
  """The sections of ``config`` that its run never reads: the other
  algorithms' (:func:`unused_sections`), ``pm`` when the run has no PM
  (:func:`pm_role` ``"none"``) and ``crd`` unless the PM teaches through
  CRD."""
  role = pm_role(config)
  return tuple(sorted(
      unused_sections(config) + ("pm",) * (role == "none") +
      ("crd",) * (role != "regularizer" or config.regularizer != "crd")))


def resumable_fields(config: RunConfig) -> tuple[str, ...]:
  """The fields a resumed run may change (their metadata says
  ``resume="free"``): they do not change the maths (``rounds``: more
  rounds continue training; the others only lay out the same computation
  or say where the files are)."""
  return fields.select(config, resume="free")


def resume_changes(config: RunConfig) -> tuple[str, ...]:
  """The fields a resumed run may change when ``--resume_changes`` names
  them (``resume="named"``): step sizes, and weights such as AugFL's lambda
  (a huge one makes a round non-finite too), e.g. after a non-finite
  round. They change the maths from the checkpoint on, never the state
  saved, which is why they must be named; the change is recorded in
  ``changes.jsonl`` and the log."""
  return fields.select(config, resume="named")


# config.json's list of the sections of the configuration that its run read
# (the others hold values the run never used: :func:`unread_sections`). Not
# a field of RunConfig: :func:`from_config_json` leaves it out.
READ_SECTIONS = "read_sections"


def to_config_json(config: RunConfig,
                   unread: tuple[str, ...] | None = None) -> dict[str, Any]:
  """``config.json`` of a run of ``config``: ``fields.to_dict(config)`` and
  :data:`READ_SECTIONS`, its sections but ``unread`` (default:
  :func:`unread_sections`)."""
  unread = unread_sections(config) if unread is None else unread
  return {**fields.to_dict(config), READ_SECTIONS: [
      f.name for f in dataclasses.fields(config)
      if dataclasses.is_dataclass(getattr(config, f.name))
      and f.name not in unread]}


def from_config_json(cls: type[RunConfig] | RunConfig,
                     values: dict[str, Any]) -> RunConfig:
  """The configuration in a ``config.json`` (of this version, or of one
  without :data:`READ_SECTIONS`), on top of ``cls`` (``fields.from_dict``;
  ``ValueError`` for a key that is no field)."""
  return fields.from_dict(cls, {k: v for k, v in values.items()
                                if k != READ_SECTIONS})
