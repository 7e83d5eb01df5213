"""The limits of a run: what a resolved configuration asks of the machine
and of its models, checked before anything is loaded or compiled (:func:`check`, called by
``plan.prepare``), each refusal one line naming the flag:

* every integer fits 32 bits (the index type of JAX's arrays):
  ``--rounds=99999999999999999999`` is refused, not run for ever;
* ``--eval.steps`` is at most :data:`MAX_EVAL_STEPS`: an evaluation takes
  that many SGD steps per held-out client in one XLA call;
* the memory a value needs, where it follows from the configuration alone
  (:func:`memory_needs`: a minibatch of a batch size, CRD's contrast scores
  of ``nce_k`` negatives, the clients' examples), is at most the machine's
  (:func:`machine_memory`). The needs are lower bounds: a value refused
  here could never run, one accepted may still not fit;
* ``--pm.kwargs`` builds the PM (unknown or ill-typed arguments).
"""

from __future__ import annotations

import math
import os

import jax

from augfl_jax import data, models
from augfl_jax.core import fields
from augfl_jax.training.config import RunConfig

__all__ = [
    "check", "check_pm_kwargs", "FLOAT_BYTES", "INT_RANGE", "machine_memory",
    "MAX_EVAL_STEPS", "memory_needs"
]

INT_RANGE = (-2 ** 31, 2 ** 31 - 1)
MAX_EVAL_STEPS = 10_000
FLOAT_BYTES = 4


def machine_memory() -> tuple[int, str]:
  """``(bytes, what)``: the default device's memory (an accelerator's
  limit), else the host's physical memory."""
  device = jax.devices()[0]
  limit = (device.memory_stats() or {}).get("bytes_limit") if (
      device.platform != "cpu") else None
  if limit:
    return int(limit), f"the memory of the {device.device_kind}"
  return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
          "this machine's memory")


def memory_needs(config: RunConfig, unread: tuple[str, ...]
                ) -> list[tuple[str, int, str]]:
  """``[(flags, bytes, what)]``: lower bounds of the memory that values of
  ``config`` need (``flags``: the values, as ``--name=value``; sections in
  ``unread`` are left out)."""
  spec = data.DATASETS[config.dataset]
  shape = spec.example_shape
  example = FLOAT_BYTES * math.prod(shape)
  needs = []
  for name, _, _, value in fields.walk(config):
    if (name.rpartition(".")[2] == "batch_size" and isinstance(value, int)
        and name.partition(".")[0] not in unread):
      needs.append((f"--{name}={value}", value * example, f"one minibatch "
                    f"of {value} examples of shape {shape}"))
  d, e = config.data, config.eval
  if not spec.natural_clients:  # else the clients' sizes are their own
    needs.append((f"--data.num_clients={d.num_clients} with --data.M={d.M}",
                  d.num_clients * d.M * example, "the clients' examples"))
    if e.test_split != "off":
      needs.append((f"--eval.test_clients={e.test_clients} with "
                    f"--data.M={d.M}", e.test_clients * d.M * example,
                    "the test-split clients' examples"))
  if "crd" not in unread:
    b, k = config.crd.batch_size, config.crd.negatives
    needs.append((f"--crd.nce_k={k}", FLOAT_BYTES * b * (k + 1),
                  f"the contrast scores of a server minibatch, {b} x "
                  f"{k + 1} float32"))
  return needs


def _gigabytes(size: int) -> str:
  return f"{size / 1e9:,.1f} GB"


def check_pm_kwargs(config: RunConfig, kwargs: dict) -> None:
  """Builds the PM with ``kwargs`` (``defaults.model_kwargs``) and traces
  its initialisation on the dataset's example shape (nothing is compiled);
  ``ValueError`` naming ``--pm.kwargs`` when it fails."""
  num_classes = data.DATASETS[config.dataset].num_classes
  shape = data.DATASETS[config.dataset].example_shape
  try:
    module = models.create_model(config.pm.model, num_classes, **kwargs)
    jax.eval_shape(lambda: models.init_params(module, jax.random.key(0),
                                              shape))
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
    raise ValueError(f"--pm.kwargs={config.pm.kwargs} does not build a "
                     f"{config.pm.model} PM ({type(e).__name__}: "
                     f"{reason[:200]})") from None


def check(config: RunConfig, unread: tuple[str, ...]) -> None:
  """The checks of the module docstring on the resolved ``config`` but the
  PM's kwargs' (:func:`check_pm_kwargs`); ``unread``: the sections its run
  does not read (``config.unread_sections``).

  Raises:
    ValueError: one line naming the flag, the bound and the value.
  """
  low, high = INT_RANGE
  for name, _, _, value in fields.walk(config):
    if isinstance(value, bool) or not isinstance(value, int):
      continue
    if not low <= value <= high:
      raise ValueError(f"--{name} must be in [{low}, {high}] (a 32-bit "
                       f"integer), got {value}")
  if config.eval.steps > MAX_EVAL_STEPS:
    raise ValueError(
        f"--eval.steps must be at most {MAX_EVAL_STEPS:,} (every "
        "evaluation takes that many SGD steps on each held-out client in "
        f"one XLA call), got {config.eval.steps:,}")
  available, where = machine_memory()
  for flags, size, what in memory_needs(config, unread):
    if size > available:
      raise ValueError(
          f"{flags} needs at least {_gigabytes(size)} ({what}), more than "
          f"the {_gigabytes(available)} of {where}")
