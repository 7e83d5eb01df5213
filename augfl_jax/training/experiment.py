"""From a run's plan (:mod:`.plan`) to its data, models and algorithm.

Each algorithm declares its PM role once (``algorithms.REGISTRY``; the plan
holds the role its configuration gives it); this is the one place that acts
on it:

* ``regularizer`` (AugFL with lam > 0, KT-only): the PM stays on the server
  inside ``grad R_h`` (:mod:`augfl_jax.transfer`);
* ``initialization`` (FedLP): the client model starts from the PM, a model
  of the client's architecture pretrained on the server split;
* ``encoder`` (FedPCL): every client runs the frozen PM, a model of the
  client's architecture pretrained on the server split (the paper's
  "pretrained ResNet8x4"), as its encoder and trains a projector (one
  hidden layer of 256) on its features;
* ``backbone`` (FedIT, FedOA): LoRA adapters on the frozen PM.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from augfl_jax import algorithms, data, models, transfer
from augfl_jax.algorithms.augfl import factored
from augfl_jax.pm import store as pm, pretrain
from augfl_jax.training import defaults
from augfl_jax.training.config import RunConfig
from augfl_jax.training.plan import Plan

__all__ = [
    "build_algorithm", "load_federated", "load_pm", "Log", "pm_apply",
    "pm_model", "pm_recipe"
]

Log = Callable[[str], None]


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


def pm_model(config: RunConfig, num_classes: int):
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
  ``pm.get_or_pretrain_pm``'s."""
  module = pm_model(config, fed.num_classes)
  variables, meta = pm.get_or_pretrain_pm(
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


def build_algorithm(plan: Plan, fed: data.FederatedData, log: Log,
                    should_stop: Callable[[], bool] | None = None
                   ) -> tuple[algorithms.FederatedAlgorithm, Any]:
  """``(algorithm, initial_params)`` for the run, with the PM wired in by
  its role (module docstring); ``should_stop``: asked while the PM is
  pretrained (``pretrain.Stopped``)."""
  config, role = plan.config, plan.pm_role
  model = models.create_model(
      config.model, fed.num_classes,
      **defaults.model_kwargs(config.model, config.norm,
                             conv_impl=config.conv_impl))
  input_shape = fed.input_shape
  regularizer = encoder_apply = None
  if role != "none":  # first: a mismatched PM fails before any compilation
    module, variables, _ = load_pm(config, fed, log, should_stop)
    pm_params = variables["params"]
    teacher, per_example = pm_apply(config, module, variables)
  params = None
  if role == "regularizer":
    weight = getattr(plan.algorithm_config, "lam", None)  # of R_h
    log(f"server regulariser {config.regularizer}"
        + ("" if weight is None else f", lam {weight}"))
    regularizer = transfer.make_regularizer(
        config.regularizer, student_apply=models.make_features_fn(model),
        teacher_apply=teacher, pm_params=pm_params, server=fed.server,
        config=config.crd, teacher_per_example=per_example)
  elif role == "encoder":
    encoder_apply = lambda x, mask: teacher(x, mask)[0]
    features = jax.eval_shape(
        encoder_apply, jax.ShapeDtypeStruct((2,) + input_shape, jnp.float32),
        jax.ShapeDtypeStruct((2,), jnp.float32))
    input_shape = features.shape[1:]
    model = models.create_model("mlp", fed.num_classes, hidden=(256,),
                                norm="none")
  elif role in ("initialization", "backbone"):
    params = pm_params
    if role == "backbone":
      model = module
  if params is None:
    params = models.init_params(model, plan.keys()[0], input_shape)
  name = {"backbone": f"{config.pm.model} + LoRA",
          "encoder": "projector mlp"}.get(role, config.model)
  log(f"model {name}: {models.num_params(params):,} parameters; algorithm "
      f"{config.algorithm}; {fed.train.num_clients} train / "
      f"{fed.test.num_clients} test clients")
  if getattr(plan.algorithm_config, "dense_updates", None) == "auto":
    chosen = factored.choose(plan.algorithm_config, models.make_loss_fn(model),
                             params, fed.train)
    log(f"dense updates: {chosen} (auto)")
  algo = algorithms.build(
      config.algorithm, model, plan.algorithm_config, strategy=plan.strategy,
      eval_alpha=config.eval.alpha, eval_steps=config.eval.steps,
      regularizer=regularizer, encoder_apply=encoder_apply)
  return algo, params
