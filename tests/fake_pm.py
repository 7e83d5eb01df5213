"""A PM checkpoint as the digits runs expect one, without training it
(pretraining has its own tests; training a PM here would only cost time)."""

from __future__ import annotations

import jax
import numpy as np

from augfl_jax import models
from augfl_jax.pm import pretrain, store

# What a digits run expects of its PM: the server split and the recipe.
DIGITS = {"dataset": "digits", "server_size": 400, "epochs": 30}


def save(path: str, module, name: str, *, params=None, dataset="digits",
         server_size=400, epochs=30, input_shape=(8, 8, 1), seed=0) -> str:
  """Saves ``module`` (registry name ``name``) at ``path`` as a PM trained
  for ``dataset`` / ``server_size`` / ``epochs``; its weights are ``params``
  or a random normal(0, 0.1) draw. Returns ``path``."""
  if params is None:
    shapes = jax.eval_shape(
        lambda: models.init_params(module, jax.random.key(0), input_shape))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: rng.normal(0, 0.1, s.shape).astype(s.dtype), shapes)
  variables = {"params": params,
               "batch_stats": models.init_batch_stats(module, input_shape)}
  store.save_pm(path, variables, store.pm_metadata(
      dataset, name, server_size, 0, model_kwargs=store.model_kwargs(module),
      config=pretrain.PretrainConfig(model=name, epochs=epochs)))
  return path
