"""Running experiments: the loop around the pure round functions.

``run(config, output_dir) -> summary`` is what ``python -m experiments.run``
calls; a Python user calls it the same way::

  from augfl_jax import training
  config = training.RunConfig(dataset="digits", rounds=50)
  summary = training.run(config, "runs/my_run")

A run goes flags -> :class:`RunConfig` -> :func:`prepare` (the
:class:`Plan`: resolved, checked and located once) -> :func:`build` (the
:class:`Experiment`: its data, its algorithm, its initial parameters, its
start, restore and evaluations) -> :class:`rounds.RoundLoop` -> the
summary. The plan travels the whole way: nothing after :func:`prepare`
resolves, checks or searches again, and nothing builds a run but
:func:`build`.

Public: :mod:`.config` (``RunConfig`` and its sections; a user's method
gets its section from ``config.config_class()``), :mod:`.plan`
(``prepare``, ``validate``), :mod:`.defaults` (``resolve``: the dataset's
and the paper's defaults), :mod:`.experiment` (``build``: a run from its
plan, for one's own loop, a benchmark or a test), :mod:`.loop` (``run``),
:mod:`.guard` (``keep_finite``: an algorithm whose round keeps its last
finite state), :mod:`.stops` (the exceptions a run stops with) and
:class:`StopSignals` (``augfl_jax.processes.signals``: wrap a loop over
runs in one to see a signal that came in a run's last round). A run
across processes is ``augfl_jax.processes``
(``processes.group.initialize`` before ``run``). Internal:
:mod:`.pm_roles` (the PM by its role), :mod:`.rounds` (the round loop),
:mod:`.scoring` (the evaluations, records, intervals, the summary),
:mod:`.resume` (where a run starts, and its checks), :mod:`.limits`
(sizes against the machine), :mod:`.outputs`, :mod:`.checkpoints` and
:mod:`.events` (the run's files), :mod:`.phases` (where a run's time
goes, ``summary.json``'s ``phase_seconds``).
"""

from augfl_jax.processes.signals import StopSignals
from augfl_jax.training import (checkpoints, config, defaults, events,
                                experiment, guard, limits, loop, outputs,
                                phases, plan, pm_roles, resume, rounds,
                                scoring, stops)
from augfl_jax.training.config import (EvalConfig, DataConfig, PMConfig,
                                       RunConfig, pm_role, resumable_fields,
                                       resume_changes, unread_sections)
from augfl_jax.training.loop import (CHECKPOINT_EVERY, NonFiniteError,
                                     RunInterrupted, run)
from augfl_jax.training.outputs import OutputDirError
from augfl_jax.training.plan import Plan, prepare, validate
from augfl_jax.training.defaults import resolve
from augfl_jax.training.experiment import Experiment, build
from augfl_jax.core.progress import Progress

__all__ = [
    "CHECKPOINT_EVERY", "DataConfig", "EvalConfig", "Experiment",
    "NonFiniteError", "OutputDirError", "PMConfig", "Plan", "Progress",
    "RunConfig", "RunInterrupted", "StopSignals", "build", "config",
    "pm_role", "prepare",
    "resolve", "resumable_fields", "resume_changes", "run",
    "unread_sections", "validate",
]
