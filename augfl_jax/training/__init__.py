"""Running experiments: the loop around the pure round functions.

``run(config, output_dir) -> summary`` is what ``python -m experiments.run``
calls; a Python user calls it the same way::

  from augfl_jax import training
  config = training.RunConfig(dataset="digits", rounds=50)
  summary = training.run(config, "runs/my_run")

A run goes flags -> :class:`RunConfig` -> :func:`prepare` (the
:class:`Plan`: resolved, checked and located once) -> one data pipeline
-> the algorithm's ``build`` -> :class:`rounds.RoundLoop` -> the summary.

Public: :mod:`.config` (``RunConfig`` and its sections; a user's method
gets its section from ``config.config_class()``), :mod:`.plan`
(``prepare``, ``validate``), :mod:`.defaults` (``resolve``: the dataset's
and the paper's defaults), :mod:`.loop` (``run``), :mod:`.guard` (the
non-finite guard) and :class:`StopSignals` (``augfl_jax.processes.signals``:
wrap a loop over runs in one to see a signal that came in a run's last
round). A run across processes is ``augfl_jax.processes``
(``processes.group.initialize`` before ``run``). Internal:
:mod:`.experiment` (data, models, the PM by its role, the algorithm),
:mod:`.rounds` (the round loop), :mod:`.scoring` (records, intervals, the
summary),
:mod:`.resume` (where a run starts, and its checks), :mod:`.limits`
(sizes against the machine), :mod:`.outputs`, :mod:`.checkpoints` and
:mod:`.events` (the run's files).
"""

from augfl_jax.processes.signals import StopSignals
from augfl_jax.training import (checkpoints, config, defaults, events,
                                experiment, guard, limits, loop, outputs,
                                plan, resume, rounds)
from augfl_jax.training.config import (EvalConfig, DataConfig, PMConfig,
                                       RunConfig, pm_role, resumable_fields,
                                       resume_changes, unread_sections)
from augfl_jax.training.loop import (CHECKPOINT_EVERY, NonFiniteError,
                                     RunInterrupted, run)
from augfl_jax.training.outputs import OutputDirError
from augfl_jax.training.plan import Plan, prepare, validate
from augfl_jax.training.defaults import resolve
from augfl_jax.core.progress import Progress

__all__ = [
    "CHECKPOINT_EVERY", "DataConfig", "EvalConfig", "NonFiniteError",
    "OutputDirError", "PMConfig", "Plan", "Progress", "RunConfig",
    "RunInterrupted", "StopSignals", "config", "pm_role", "prepare",
    "resolve", "resumable_fields", "resume_changes", "run",
    "unread_sections", "validate",
]
