"""The configuration of one run: fields, presets, validation.

``RunConfig`` holds every choice a run makes; a field left ``None`` takes the
dataset's preset, then the paper's value (§VI-A), then the algorithm's own
default. ``validate`` returns the resolved config or raises ``ValueError``
with one line saying what is wrong and what would be right; it runs before
any data is loaded or anything is compiled.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import jax

from augfl_jax import algorithms, clients, data, models, pretrain, transfer
from augfl_jax.transfer import crd

AUTO = "auto"  # strategy and conv_impl: the backend's measured choice

# Per-dataset values for fields left None. digits keeps the paper's alpha,
# rho and lambda (the learning-rate search in the README) with GroupNorm:
# batch statistics of a 5-20 example query set of two classes change a test
# client's predictions with its class mix (README, "Normalisation").
DATASET_PRESETS = {
    "digits": {"model": "mlp", "norm": "group", "pm_model": "cnn",
               "pm_epochs": 30, "nce_k": 1024},
    # synthetic: 60 features; its PM is an MLP (one hidden layer of 128).
    "synthetic": {"model": "logreg", "pm_model": "mlp"},
    "cifar10": {"model": "resnet8x4"},
    "cifar100": {"model": "resnet8x4"},
}
# The 28x28 grey-scale datasets (mnist, fashion_mnist, kmnist, emnist/*).
IMAGE_28_PRESET = {"model": "cnn"}


def dataset_preset(dataset: str) -> dict[str, Any]:
  """The preset values of ``dataset`` (a canonical name)."""
  return DATASET_PRESETS.get(dataset, IMAGE_28_PRESET)


# The paper's hyper-parameters (§VI-A) and the reference PM recipe.
PAPER_DEFAULTS = {"alpha": 0.03, "rho": 0.7, "lam": 5.0, "norm": "batch",
                  "pm_model": "resnet32x4", "pm_epochs": 240}
# Where pretrained models are kept by default: PM_ROOT/pm/<dataset>_<model>_...
PM_ROOT = "runs"
# The server split is the first server_size examples whatever the run's seed,
# so every run of a dataset shares it (and its PM): its seed is a constant.
SERVER_SPLIT_SEED = 0
# Datasets of natural clients without a server split (synthetic, FedBC's
# benchmark): a run that needs a PM and leaves --server_size unset draws this
# many examples at random from the clients for the server
# (``data.natural_partition``); methods without a PM keep every example.
NATURAL_SERVER_SIZE = {"synthetic": 500}
# Datasets generated from the run's seed: their server split, hence their
# PM, belong to that seed.
SEEDED_DATASETS = ("synthetic",)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything a run depends on (see ``experiments/run.py`` for each flag)."""

  # data
  dataset: str = "digits"
  data_dir: str | None = None
  num_clients: int | None = None
  M: int = 20  # pylint: disable=invalid-name
  classes_per_client: int = 2
  server_size: int | None = None
  partition: str = "pathological"
  dirichlet_alpha: float = 0.5
  # model and training
  algorithm: str = "augfl"
  model: str | None = None
  norm: str | None = None
  conv_impl: str = AUTO
  rounds: int = 300
  eval_every: int = 10
  clients_per_round: int | None = None
  seed: int = 0
  strategy: str = AUTO
  chunk_size: int | None = None
  # algorithm hyper-parameters (None: preset, paper, or the algorithm's own)
  alpha: float | None = None
  rho: float | None = None
  lam: float | None = None
  hvp: str | None = None
  uniform_weights: bool = False
  lr: float | None = None
  local_epochs: int | None = None
  batch_size: int | None = None
  beta: float | None = None
  local_steps: int | None = None
  variant: str | None = None
  momentum: float | None = None
  lr_lambda: float | None = None
  lr_gamma: float | None = None
  lambda_max: float | None = None
  start_from: str | None = None
  inner_steps: int | None = None
  # the pretrained model and knowledge transfer (AugFL with lam > 0)
  regularizer: str = "crd"
  pm_model: str | None = None
  pm_epochs: int | None = None
  pm_kwargs: str | None = None
  pm_dir: str | None = None
  kt_steps: int | None = None
  kt_batch_size: int | None = None
  kt_loop: str | None = None
  nce_k: int | None = None
  feat_dim: int | None = None
  ce_weight: float | None = None
  kd_weight: float | None = None
  crd_weight: float | None = None
  # evaluation
  adapt_steps: int = 1

  @property
  def uses_pm(self) -> bool:
    """AugFL-style server with a non-zero regulariser (needs the PM)."""
    return (self.algorithm in algorithms.USES_REGULARIZER and
            (self.lam or 0) > 0 and self.regularizer != "none")

  @property
  def needs_pm(self) -> bool:
    """The run loads (or pretrains) a model on the server split: the PM of
    AugFL's regulariser, FedPCL's frozen encoder, FedLP's starting point."""
    return self.uses_pm or self.algorithm in (
        algorithms.STARTS_PRETRAINED + algorithms.NEEDS_ENCODER +
        algorithms.PM_BACKBONE)


def resolve(config: RunConfig) -> RunConfig:
  """Fills the fields left ``None`` from the dataset's preset, the paper's
  defaults and ``data.DATASET_DEFAULTS`` (clients, server split), and
  replaces ``"auto"`` in ``strategy`` and ``conv_impl`` by the backend's
  measured choice (``clients.default_strategy``,
  ``models.default_conv_impl``), so ``config.json`` records what ran."""
  filled = {**PAPER_DEFAULTS, **dataset_preset(config.dataset),
            **data.DATASET_DEFAULTS[config.dataset]}
  if jax.default_backend() == "cpu":
    # XLA:CPU runs convolutions inside lax.scan slowly (see transfer/crd.py).
    filled["kt_loop"] = "python"
  if config.algorithm in algorithms.STARTS_PRETRAINED:
    filled["pm_model"] = config.model or filled["model"]  # client-size
  if config.algorithm not in algorithms.USES_REGULARIZER:
    # --lam is AugFL's lambda; FedProto, FedCP and FedOA have their own
    # lambda (1, 5, 0.5) and take --lam only when it is given.
    filled.pop("lam")
  server_size_given = config.server_size is not None
  config = dataclasses.replace(config, **{
      name: filled[name] for name, value in dataclasses.asdict(config).items()
      if value is None and name in filled})
  if (not server_size_given and config.server_size == 0 and config.needs_pm
      and config.dataset in NATURAL_SERVER_SIZE):
    config = dataclasses.replace(
        config, server_size=NATURAL_SERVER_SIZE[config.dataset])
  if config.strategy == AUTO:
    config = dataclasses.replace(
        config, strategy=clients.default_strategy().name)
  if config.conv_impl == AUTO:
    config = dataclasses.replace(config, conv_impl=models.default_conv_impl())
  if config.pm_dir is None and config.pm_model is not None:
    # PMs of one architecture with another norm or kwargs live side by side.
    name = config.pm_model + (
        "-" + re.sub(r"[^A-Za-z0-9]+", "-", config.pm_kwargs).strip("-")
        if config.pm_kwargs else "")
    if config.norm != "batch" and config.pm_model != "logreg":
      name += f"-{config.norm}"
    if config.dataset in SEEDED_DATASETS:
      name += f"-seed{config.seed}"
    config = dataclasses.replace(config, pm_dir=pretrain.default_pm_dir(
        PM_ROOT, config.dataset, name, config.server_size))
  return config


def server_split_seed(config: RunConfig) -> int:
  """The seed the run's server split (and its PM) belongs to: the run's
  for ``SEEDED_DATASETS``, else ``SERVER_SPLIT_SEED``."""
  return (config.seed if config.dataset in SEEDED_DATASETS
          else SERVER_SPLIT_SEED)


def _kwargs(cls: type, config: RunConfig,
            renamed: dict[str, str] | None = None) -> dict[str, Any]:
  """``cls``'s fields that the run sets (not None), by name or ``renamed``
  (``cls`` field -> RunConfig field)."""
  renamed = renamed or {}
  values = {f.name: getattr(config, renamed.get(f.name, f.name), None)
            for f in dataclasses.fields(cls)}
  return {name: value for name, value in values.items() if value is not None}


def algorithm_config(config: RunConfig) -> Any:
  """The algorithm's config dataclass built from the run's fields."""
  cls = algorithms.CONFIGS[config.algorithm]
  return cls(**_kwargs(cls, config))


def crd_config(config: RunConfig) -> crd.CRDConfig:
  """CRD's config from the run's ``kt_*``, ``nce_k``, weight fields."""
  return crd.CRDConfig(**_kwargs(
      crd.CRDConfig, config,
      {"batch_size": "kt_batch_size", "loop": "kt_loop"}))


def model_kwargs(name: str, norm: str, json_kwargs: str | None = None,
                 conv_impl: str = AUTO) -> dict[str, Any]:
  """Keyword arguments of ``models.create_model(name, ...)``: the norm (not
  for logreg), ``conv_impl`` (models with convolutions) and any JSON object
  given, e.g. ``'{"hidden": [512, 256]}'``."""
  kwargs = {} if name == "logreg" else {"norm": norm}
  if name in models.CONV_MODELS:
    kwargs["conv_impl"] = conv_impl
  if json_kwargs:
    try:
      extra = json.loads(json_kwargs)
    except json.JSONDecodeError as e:
      raise ValueError(f"model kwargs are not valid JSON ({e}); write e.g. "
                       "'{\"hidden\": [512, 256]}'") from e
    if not isinstance(extra, dict):
      raise ValueError("model kwargs must be a JSON object, e.g. "
                       "'{\"hidden\": [512, 256]}'")
    kwargs.update({k: tuple(v) if isinstance(v, list) else v
                   for k, v in extra.items()})
  return kwargs


def validate(config: RunConfig) -> RunConfig:
  """Checks every field; returns the resolved config.

  Raises:
    ValueError: one line saying what is wrong and what would be right.
    data.DatasetUnavailableError: the dataset's files are not on this
      machine (one line: the files, the places searched, how to get them).
  """
  config = resolve(dataclasses.replace(
      config, dataset=data.canonical_name(config.dataset)))
  known_models = models.available_models()
  checks = [
      (config.algorithm in algorithms.ALGORITHMS,
       f"unknown algorithm {config.algorithm!r}; choose one of "
       f"{', '.join(algorithms.ALGORITHMS)}"),
      (config.model in known_models,
       f"unknown model {config.model!r}; choose one of "
       f"{', '.join(known_models)}"),
      (config.rounds >= 1, f"--rounds must be >= 1, got {config.rounds}"),
      (config.eval_every >= 1,
       f"--eval_every must be >= 1, got {config.eval_every}"),
      (config.M >= 1, f"--M must be >= 1, got {config.M}"),
      (config.num_clients >= 2,
       f"--num_clients must be >= 2 (train and test clients), got "
       f"{config.num_clients}"),
      (config.clients_per_round is None or config.clients_per_round >= 1,
       f"--clients_per_round must be >= 1, got {config.clients_per_round}"),
      (config.alpha > 0, f"--alpha must be > 0, got {config.alpha}"),
      (config.rho > 0, f"--rho must be > 0, got {config.rho}"),
      (config.lam is None or config.lam >= 0,
       f"--lam must be >= 0, got {config.lam}"),
      (config.adapt_steps >= 0,
       f"--adapt_steps must be >= 0, got {config.adapt_steps}"),
      (config.strategy in clients.STRATEGIES,
       f"unknown --strategy {config.strategy!r}; choose auto or one of "
       f"{', '.join(clients.STRATEGIES)}"),
      (config.conv_impl in models.CONV_IMPLS,
       f"unknown --conv_impl {config.conv_impl!r}; choose auto or one of "
       f"{', '.join(models.CONV_IMPLS)}"),
      (config.regularizer in transfer.REGULARIZERS,
       f"unknown --regularizer {config.regularizer!r}; choose one of "
       f"{', '.join(transfer.REGULARIZERS)}"),
      (not config.needs_pm or config.server_size > 0,
       f"{config.algorithm}"
       f"{f' with --lam={config.lam}' if config.uses_pm else ''} needs a "
       "pretrained model, trained on a server split, but --server_size is 0; "
       "give the server examples (--server_size=N)"
       f"{', or use --lam=0' if config.uses_pm else ''}"),
      (not config.needs_pm or config.pm_model in known_models,
       f"unknown --pm_model {config.pm_model!r}; choose one of "
       f"{', '.join(known_models)}"),
      (config.algorithm not in algorithms.STARTS_PRETRAINED or
       config.pm_model == config.model,
       f"{config.algorithm} starts from a pretrained client model: "
       f"--pm_model must equal --model ({config.model}), got "
       f"{config.pm_model}"),
      (not config.needs_pm or config.pm_epochs >= 1,
       f"--pm_epochs must be >= 1, got {config.pm_epochs}"),
  ]
  for ok, message in checks:
    if not ok:
      raise ValueError(message)
  algorithm_config(config)  # the algorithm's own checks
  if config.uses_pm:
    crd_config(config)
  if config.needs_pm:
    model_kwargs(config.pm_model, config.norm, config.pm_kwargs,
                 config.conv_impl)
  clients.ClientStrategy(config.strategy, config.chunk_size)
  data.locate(config.dataset, config.data_dir)  # DatasetUnavailableError
  return config
