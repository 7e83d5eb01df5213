"""The pretrained model (PM) in a run, by the role its algorithm declares.

Each algorithm declares its PM role once (``algorithms.REGISTRY``; the plan
holds the role its configuration gives it); :func:`wire` is the one place
that acts on it:

* ``regularizer`` (AugFL with its R_h weighed in, KT-only): the PM stays on
  the server inside ``grad R_h`` (:mod:`augfl_jax.transfer`);
* ``initialization`` (FedLP): the client model starts from the PM, a model
  of the client's architecture pretrained on the server split;
* ``encoder`` (FedPCL): every client runs the frozen PM, a model of the
  client's architecture pretrained on the server split (the paper's
  "pretrained ResNet8x4"), as its encoder and trains the model its spec
  names (``AlgorithmSpec.head``) on the features;
* ``backbone`` (FedIT, FedOA): LoRA adapters on the frozen PM.

The PM itself: its module (:func:`pm_model`), how it is pretrained
(:func:`pm_recipe`), where it comes from (:func:`load_pm`: reused or
pretrained on the server split) and how it runs frozen (:func:`pm_apply`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from augfl_jax import algorithms, data, models, transfer
from augfl_jax.pm import pretrain
from augfl_jax.pm import store
from augfl_jax.training import defaults
from augfl_jax.training.config import RunConfig
from augfl_jax.training.plan import Plan

__all__ = ["Log", "Wired", "load_pm", "pm_apply", "pm_model", "pm_recipe",
           "wire"]

Log = Callable[[str], None]


class Wired(NamedTuple):
  """What an algorithm is built with once its PM took its role."""
  # the model it trains (the client model; the PM for ``backbone``; the
  # spec's ``head`` for ``encoder``), and its name in the run's log
  model: nn.Module
  name: str
  # its initial parameters where the PM gives them (``initialization``,
  # ``backbone``); None: initialised from the run's key
  params: Any
  # the shape of one of its inputs (the encoder's features for ``encoder``)
  input_shape: tuple[int, ...]
  # the server's ``(init_fn, grad_fn)`` for ``regularizer``
  regularizer: algorithms.Regularizer | None = None
  # the frozen encoder for ``encoder``
  encoder_apply: Callable[..., jax.Array] | None = None


def pm_model(config: RunConfig, num_classes: int) -> nn.Module:
  """The PM's Flax module."""
  return models.create_model(
      config.pm.model, num_classes, **defaults.model_kwargs(
          config.pm.model, config.norm, config.pm.kwargs, config.conv_impl))


def pm_recipe(config: RunConfig) -> pretrain.PretrainConfig:
  """How the run's PM is (or was) pretrained."""
  return pretrain.PretrainConfig(
      model=config.pm.model, epochs=config.pm.epochs, lr=config.pm.lr,
      batch_size=config.pm.batch_size,
      holdout_fraction=config.pm.holdout_fraction,
      checkpoint_every_steps=config.pm.checkpoint_every_steps)


def load_pm(config: RunConfig, fed: data.FederatedData, log: Log,
            should_stop: Callable[[], bool] | None = None):
  """``(module, variables, metadata)``: reused from ``config.pm.dir`` when
  it was trained for the run, pretrained on the server split when there is
  none (``variables = {"params", "batch_stats"}``); ``should_stop`` as
  ``pm.store.get_or_pretrain_pm``'s."""
  module = pm_model(config, fed.num_classes)
  variables, meta = store.get_or_pretrain_pm(
      config.pm.dir, model=module, model_name=config.pm.model,
      dataset_name=config.dataset, server=fed.server,
      server_size=config.data.server_size,
      split_seed=defaults.server_split_seed(config),
      config=pm_recipe(config), input_shape=fed.input_shape, log=log,
      should_stop=should_stop)
  held = [meta.get(k) for k in ("heldout_accuracy",
                                "heldout_accuracy_running")]
  shown = ", ".join(f"{100 * h:.2f}%{suffix}" for h, suffix in zip(
      held, ("", " with running statistics")) if h is not None) or "n/a"
  log(f"PM {config.pm.model} ({meta.get('num_params', 0):,} parameters, "
      f"held-out accuracy {shown}) from {config.pm.dir}")
  return module, variables, meta


def pm_apply(config: RunConfig, module, variables):
  """``(apply(x, mask) -> (features, logits), per_example)``: the frozen PM
  as the server's teacher or the clients' encoder. A batch-norm PM runs in
  eval mode with its running statistics when ``config.pm.statistics`` is
  ``"running"`` (the reference's teacher); then, as with GroupNorm or no
  norm, its output for an example does not depend on the rest of its
  batch."""
  if (getattr(module, "norm", None) == "batch"
      and config.pm.statistics == "running"):
    module = module.clone(norm="running")
  else:
    variables = {"params": variables["params"]}
  apply = lambda x, mask: module.apply(variables, x, mask=mask)
  return apply, getattr(module, "norm", "none") != "batch"


def wire(plan: Plan, client: nn.Module, fed: data.FederatedData, log: Log,
         should_stop: Callable[[], bool] | None = None) -> Wired:
  """The PM of ``plan`` in its role (module docstring) beside the client
  model ``client``; the PM is loaded (or pretrained: ``should_stop`` is
  asked meanwhile, ``pretrain.Stopped``) first, so that a mismatched PM
  fails before anything compiles."""
  config, role = plan.config, plan.pm_role
  wired = Wired(client, config.model, None, fed.input_shape)
  if role == "none":
    return wired
  module, variables, _ = load_pm(config, fed, log, should_stop)
  teacher, per_example = pm_apply(config, module, variables)
  if role == "regularizer":
    weight = plan.spec.pm_weight and plan.spec.pm_weight(
        plan.algorithm_config)
    log(f"server regulariser {config.regularizer}"
        + ("" if not weight else f", {weight[0]} {weight[1]}"))
    return wired._replace(regularizer=transfer.make_regularizer(
        config.regularizer, student_apply=models.make_features_fn(client),
        teacher_apply=teacher, pm_params=variables["params"],
        server=fed.server, config=config.crd,
        teacher_per_example=per_example))
  if role == "encoder":
    encoder_apply = lambda x, mask: teacher(x, mask)[0]
    features = jax.eval_shape(
        encoder_apply,
        jax.ShapeDtypeStruct((2,) + fed.input_shape, jnp.float32),
        jax.ShapeDtypeStruct((2,), jnp.float32))
    name, kwargs = plan.spec.head
    return Wired(models.create_model(name, fed.num_classes, **kwargs),
                 f"projector {name}", None, features.shape[1:],
                 encoder_apply=encoder_apply)
  if role == "backbone":
    return Wired(module, f"{config.pm.model} + LoRA", variables["params"],
                 fed.input_shape)
  return wired._replace(params=variables["params"])  # initialization
