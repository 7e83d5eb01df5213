"""Running experiments: the loop around the pure round functions.

``run(config, output_dir) -> summary`` is what ``python -m experiments.run``
calls; a Python user calls it the same way::

  from augfl_jax import training
  config = training.RunConfig(dataset="digits", rounds=50)
  summary = training.run(config, "runs/my_run")

* :mod:`.config`: ``RunConfig`` and its sections; :mod:`.presets`: the
  dataset presets, ``resolve`` and ``validate``;
* :mod:`.wiring`: data, models, the PM by its role, the algorithm;
* :mod:`.loop`: ``run``; :mod:`.resume`: the plan (fresh or resumed) and its
  checks; :mod:`.rounds`: the rounds, evaluations and checkpoints;
  :mod:`.safety`: the non-finite guard, signals (:class:`StopSignals`:
  wrap a loop over runs in one to see a signal that came in a run's last
  round) and their exceptions;
* :mod:`.outputs`, :mod:`.checkpoints`, :mod:`.events`: the run's files;
* :class:`Progress` (``augfl_jax.core.progress``): time per step and time left.
"""

from augfl_jax.training import (checkpoints, config, events, loop, outputs,
                                plan, presets, resume, rounds, safety, wiring)
from augfl_jax.training.config import (EvalConfig, DataConfig, PMConfig,
                                       RunConfig, pm_role, resumable_fields,
                                       resume_changes, unread_sections)
from augfl_jax.training.loop import (CHECKPOINT_EVERY, NonFiniteError,
                                     RunInterrupted, run)
from augfl_jax.training.outputs import OutputDirError
from augfl_jax.training.plan import Plan, prepare, validate
from augfl_jax.training.presets import resolve
from augfl_jax.training.safety import StopSignals
from augfl_jax.core.progress import Progress
