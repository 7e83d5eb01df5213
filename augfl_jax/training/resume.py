"""Starting or resuming a run in its output directory: the checks of
``run``'s arguments (:class:`RunControl`), where it starts (a fresh run or
the checkpoint to resume from: :func:`find_start`), the checkpoint's
configuration and data against the resumed one's plan, the step sizes a
resume changes (``changes.jsonl``), what a resumed run continues with
(:func:`resumed`), the run's files against what its checkpoint sealed
(:func:`differing_files`) and the one-line error for a file of the run
that could not be written.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Callable, NamedTuple, Sequence

from augfl_jax import data, processes
from augfl_jax.core import fields
from augfl_jax.core.progress import counted
from augfl_jax.training.checkpoints import CheckpointError, RunCheckpoints
from augfl_jax.training.config import (RunConfig, config_class,
                                       from_config_json, pm_role,
                                       resumable_fields, unused_sections)
from augfl_jax.training.config import resume_changes as resume_changes_of
from augfl_jax.training.outputs import OutputDir, OutputDirError
from augfl_jax.training.plan import Plan

__all__ = [
    "changed", "check_data", "check_resume_config", "check_run_control",
    "differing_files", "find_start", "finished", "record_changes", "resumed",
    "Resumed", "RunControl", "RunDir", "saved_config", "write_error"
]


class RunControl(NamedTuple):
  """How ``training.run`` treats its directory: its own arguments."""
  checkpoint_every: int  # every this many rounds (0: at the end)
  resume: bool  # continue from the newest readable checkpoint
  overwrite: bool  # replace the run the directory holds
  resume_changes: tuple[str, ...]  # step sizes a resumed run may change


class RunDir(NamedTuple):
  """A run's directory (locked): its files and its checkpoints."""
  out: OutputDir
  checkpoints: RunCheckpoints


def check_resume_config(saved: RunConfig, plan: Plan,
                        resume_changes: Sequence[str], where: str) -> None:
  """Refuses a resumed run of ``plan`` whose configuration differs from the
  checkpoint's ``saved`` outside :func:`resumable_fields` and
  ``resume_changes``, or whose changes give the run another PM role (a
  weight to or from 0 where the method leaves its PM out there,
  ``AlgorithmSpec.uses_pm``: the checkpoint holds the PM's state, or lacks
  it)."""
  config = plan.config
  before, after = pm_role(saved), plan.pm_role
  named = [n for n in resume_changes
           if fields.get(saved, n) != fields.get(config, n)]
  if before != after and named:
    raise ValueError(
        f"--resume_changes={','.join(named)}: "
        f"{' and '.join(n.rpartition('.')[2] for n in named)} may change on "
        f"resume, but not to or from 0, where the run gains or loses its PM "
        f"(PM role {before} -> {after}), whose state the checkpoint {where} "
        "holds or lacks; got " + "; ".join(
            f"{n} {fields.get(saved, n)} -> {fields.get(config, n)}"
            for n in named))
  free = resumable_fields(config)
  diff = fields.diff(saved, config, free + tuple(resume_changes)
                     + plan.unused)
  if not diff:
    return
  names = [d.partition(":")[0] for d in diff]
  if all(n in resume_changes_of(config) for n in names):
    way_out = ("to continue with these values, add --resume_changes="
               + ",".join(list(resume_changes) + names))
  else:
    way_out = (f"only {', '.join(free)} may change on resume, "
               "and the step sizes and weights named in --resume_changes")
  raise ValueError(f"--resume: the checkpoint {where} is of another "
                   f"configuration ({'; '.join(diff)}); {way_out}")


def check_data(meta: dict[str, Any], digest: str, where: str, log) -> None:
  """Refuses to resume the checkpoint ``where`` (its ``meta``) on data
  other than those its run started with (``digest``:
  ``experiment.Loaded.digest``); a
  checkpoint that records no digest (an older version) is said to be
  unchecked."""
  saved = meta.get("data_digest")
  if saved is None:
    log(f"checkpoint {where} records no digest of its data (an older "
        "version): the data are not checked against it")
  elif saved != digest:
    raise ValueError(
        f"--resume: the data differ from those the run of {where} started "
        f"with (digest {saved[:12]}..., now {digest[:12]}...): another copy "
        "of the dataset, other labels or another partition; pass the "
        "--data.data_dir it read (partition.txt names the files), or run "
        "in another --output_dir")


def changed(saved: RunConfig, config: RunConfig,
             resume_changes: Sequence[str]) -> dict[str, list[Any]]:
  """``{name: [before, after]}`` of the fields in ``resume_changes`` that
  differ between the checkpoint's ``saved`` and ``config``."""
  return {n: [fields.get(saved, n), fields.get(config, n)]
          for n in resume_changes
          if fields.get(saved, n) != fields.get(config, n)}


def saved_config(out: OutputDir, checkpoints: RunCheckpoints, log,
                 cls: type[RunConfig] = RunConfig) -> RunConfig | None:
  """The configuration of the run ``out`` holds, as a ``cls``: its
  ``config.json``, or, when that is missing, empty or torn (a crash or a
  full disk while it was written), the one saved with its newest readable
  checkpoint; ``None`` when neither reads."""
  path = out.file("config.json")
  if os.path.exists(path):
    try:
      return from_config_json(cls, out.read_json("config.json"))
    except OutputDirError:
      log(f"{path} is empty or cut short (a crash or a full disk while it "
          "was written); " + ("using the configuration saved with the "
                              "newest checkpoint" if checkpoints.steps()
                              else "it is written again"))
  if checkpoints.steps():
    try:
      return fields.from_dict(cls, checkpoints.latest_meta(log)[1]["config"])
    except CheckpointError:
      return None
  return None


def finished(out: OutputDir) -> bool:
  """Whether ``out`` holds a ``summary.json`` that reads whole: what the
  run writes once its last round is done."""
  if not os.path.exists(out.file("summary.json")):
    return False
  try:
    out.read_json("summary.json")
  except OutputDirError:
    return False
  return True


def find_start(plan: Plan, run_dir: RunDir, control: RunControl, log
              ) -> int | None:
  """The checkpoint step to resume from (``None``: a fresh run), after
  checking the directory against the run: without ``control.resume``, a
  directory that holds this very run (the same configuration, but for the
  sections it does not read), finished, gives its last step,
  ``config.rounds`` (``run`` then reports its summary and trains
  nothing). Raises ``ValueError``."""
  out = run_dir.out
  foreign = out.foreign()
  if foreign:
    raise OutputDirError(
        f"{out.path} holds {', '.join(foreign)}, which augfl_jax did not "
        "write: it never removes or reuses such files; choose another "
        "--output_dir")
  if control.resume:
    return _resumed_step(plan, run_dir.checkpoints, control.resume_changes,
                         log)
  if control.overwrite or not out.own_files():
    return None
  return _same_run(plan, run_dir, log)


def _resumed_step(plan: Plan, checkpoints: RunCheckpoints,
                  resume_changes: tuple[str, ...], log) -> int:
  """:func:`find_start` with ``--resume``: the newest readable
  checkpoint's step, checked against the run."""
  config = plan.config
  if not checkpoints.steps():
    raise ValueError(f"--resume: no checkpoint in {checkpoints.directory};"
                     " run without --resume to start the run (again)")
  step, meta = checkpoints.latest_meta(log)
  saved_processes = meta.get("processes", 1)
  if saved_processes != processes.count():
    raise ValueError(
        f"--resume: {checkpoints.path(step)} was saved by a run of "
        f"{saved_processes} process{'es' if saved_processes > 1 else ''}"
        f" and this one has {processes.count()}; resume it with "
        f"--distributed.num_processes={saved_processes} (each process "
        "holds its own part of the state)")
  check_resume_config(fields.from_dict(type(config), meta["config"]),
                      plan, resume_changes, f"{checkpoints.path(step)}")
  if step > config.rounds:
    raise ValueError(f"--resume: the checkpoint is at round {step}, "
                     f"beyond --rounds={config.rounds}")
  return step


def _same_run(plan: Plan, run_dir: RunDir, log) -> int | None:
  """:func:`find_start` in a directory of the run's own files, without
  ``--resume`` or ``--overwrite``: its last step where it holds this run,
  finished; ``None`` where it holds this run without a checkpoint; else
  ``OutputDirError``."""
  config, (out, checkpoints) = plan.config, run_dir
  steps = checkpoints.steps()
  saved = saved_config(out, checkpoints, log, type(config))
  if saved is not None:
    diff = fields.diff(saved, config, plan.unused)
    if diff:
      raise OutputDirError(
          f"{out.path} holds a different run ({'; '.join(diff)}); pass "
          "--overwrite to replace it or choose another --output_dir")
  if steps:
    if steps[-1] == config.rounds and finished(out):
      return steps[-1]  # the same run, done: run() reports its summary
    raise OutputDirError(
        f"{out.path} already holds this run; pass --resume to continue it "
        "from its latest checkpoint or --overwrite to start again")
  log(f"{out.path} holds this run without a checkpoint: starting it again")
  return None


def check_run_control(plan: Plan, control: RunControl) -> None:
  """The checks of ``run``'s own arguments (and of ``clients_per_round``
  against the partition's size), before anything is read or written."""
  config = plan.config
  if control.checkpoint_every < 0:
    raise ValueError(f"--checkpoint_every must be >= 0 (0: only at the "
                     f"end), got {control.checkpoint_every}")
  if control.resume and control.overwrite:
    raise ValueError("--resume and --overwrite exclude each other: resume "
                     "continues the run in --output_dir, overwrite replaces "
                     "it")
  if control.resume_changes and not control.resume:
    raise ValueError("--resume_changes names step sizes a resumed run "
                     "changes: it needs --resume")
  allowed = resume_changes_of(config)
  for name in control.resume_changes:
    if name not in allowed:
      raise ValueError(
          f"--resume_changes: {name} is not a step size; these may change "
          f"on resume: {', '.join(allowed)}")
  if not data.DATASETS[config.dataset].natural_clients:
    train = data.num_train_clients(config.data.num_clients)
    if config.clients_per_round > train:
      raise ValueError(
          f"--clients_per_round={config.clients_per_round} is more than the "
          f"{train} training clients (80% of --data.num_clients="
          f"{config.data.num_clients})")


def write_error(e: BaseException, run_dir: RunDir, done: int
               ) -> OutputDirError:
  """One line for a file of the run that could not be written (a full
  disk, a file system gone read-only): what failed, after which round,
  and the newest checkpoint to resume from."""
  out, checkpoints = run_dir
  if isinstance(e, OSError) and e.strerror:
    reason = e.strerror + (f": {e.filename}" if e.filename else "")
  else:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  try:
    checkpoints.wait()  # the saves before the failed one are on disk
  except CheckpointError:
    pass
  try:
    checkpoints.reload()
    steps = checkpoints.steps()
  except Exception:  # pylint: disable=broad-except
    steps = []
  way_out = (f"the newest checkpoint is round {steps[-1]} "
             f"({checkpoints.path(steps[-1])}): make room (or fix the "
             "directory) and continue with --resume" if steps else
             "no checkpoint was saved: make room (or fix the directory) and "
             "run again")
  return OutputDirError(f"writing the run's files in {out.path} failed "
                        f"after round {done} ({reason}); {way_out}")


class Resumed(NamedTuple):
  """What a resumed run continues with (:func:`resumed`)."""
  round: int  # the checkpoint's round
  state: Any
  history: list[dict[str, Any]]  # the metrics records up to ``round``
  train_losses: list[float]  # the training losses since the last evaluation
  seconds: float  # the run's time until the checkpoint
  changes: dict[str, list[Any]]  # the step sizes changed (``changed``)
  # the changes.jsonl records up to ``round`` (earlier resumes' changes)
  change_records: list[dict[str, Any]]
  # where the run's time until the checkpoint went (``training.phases``;
  # an older checkpoint's ``seconds`` as ``unattributed``)
  phase_seconds: dict[str, float]


def resumed(plan: Plan, run_dir: RunDir,
            checkpoint: tuple[int, Any, dict[str, Any]],
            resume_changes: Sequence[str], log) -> Resumed:
  """What a resumed run of ``plan`` continues with from ``checkpoint``,
  ``(round, state, meta)`` of ``run_dir``'s checkpoints as
  ``Experiment.restore`` read it back, checked against the plan
  (``ValueError``)."""
  start_round, state, meta = checkpoint
  out = run_dir.out
  saved = fields.from_dict(type(plan.config), meta["config"])
  check_resume_config(saved, plan, resume_changes,
                      run_dir.checkpoints.path(start_round))
  on_disk = out.read_records("metrics.jsonl", log, tolerant=True)
  # The checkpoint holds the records up to its round (older ones: only
  # metrics.jsonl does).
  history = meta["records"] if "records" in meta else [
      r for r in on_disk if r.get("round", start_round + 1) <= start_round]
  # The checkpoint holds the changes recorded up to its round (older ones:
  # only changes.jsonl does).
  change_records = (meta["changes"] if "changes" in meta else
                    out.read_records("changes.jsonl", log, tolerant=True))
  phase_seconds = meta.get("phase_seconds") or {
      "unattributed": meta["seconds"]}
  return Resumed(start_round, state, history,
                 list(meta["pending_train_losses"]), meta["seconds"],
                 changed(saved, plan.config, resume_changes), change_records,
                 phase_seconds)


def record_changes(out: OutputDir, start_round: int,
                   changes: dict[str, list[Any]],
                   records: list[dict[str, Any]], log
                  ) -> list[dict[str, Any]]:
  """Logs the step sizes a resume changed (``changes``) and writes
  ``changes.jsonl`` again: ``records`` (the changes its checkpoint
  recorded), then this one; returns what it holds (nothing is written
  when both are empty and there is no such file)."""
  if changes:
    text = ", ".join(f"{n} {a} -> {b}" for n, (a, b) in changes.items())
    log(f"changed on resume from round {start_round} (--resume_changes): "
        f"{text}; recorded in {out.file('changes.jsonl')}")
    records = list(records) + [{
        "round": start_round, "changes": changes,
        "time": datetime.datetime.now().isoformat(timespec="seconds")}]
  if records or os.path.exists(out.file("changes.jsonl")):
    out.write_records("changes.jsonl", records)
  return records


def differing_files(out: OutputDir, meta: dict[str, Any],
                    log: Callable[[str], None] | None = None) -> list[str]:
  """What in the files of the run in ``out`` differs from what its
  checkpoint sealed (``meta``, the newest step's), one phrase per file
  naming it (empty: they agree): ``metrics.jsonl`` (missing, a line that
  is not JSON, or records other than the sealed ones), ``changes.jsonl``
  (where the checkpoint records the changes), ``summary.json`` (missing,
  torn, or of another round, accuracy or run than the sealed records and
  configuration) and ``config.json`` (missing, torn, or another
  configuration, outside the fields a resume may change). A resumed run
  writes each of them again from the checkpoint.

  Args:
    out: the run's directory.
    meta: its newest checkpoint's metadata, its seal checked.
    log: given, a torn last line of a ``.jsonl`` file (a run stopped while
      it wrote a record past the checkpoint) is dropped, telling ``log``,
      as a run's own reader does; ``None``: it is a difference.
  """
  problems = []
  if isinstance(meta.get("records"), list):
    problems += _jsonl_differs(out, "metrics.jsonl", meta["records"], log)
  if isinstance(meta.get("changes"), list):
    problems += _jsonl_differs(out, "changes.jsonl", meta["changes"], log)
  problems += _summary_differs(out, meta)
  problems += _config_differs(out, meta)
  return problems


def _jsonl_differs(out: OutputDir, name: str, sealed: list[dict[str, Any]],
                   log: Callable[[str], None] | None) -> list[str]:
  """:func:`differing_files`' phrase for the ``.jsonl`` file ``name``."""
  if not os.path.exists(out.file(name)):
    return [f"{name} is missing"] if sealed else []
  torn = []
  try:
    found = out.read_records(name, torn.append)
  except OutputDirError:
    return [f"{name} holds a line that is not JSON before its last one"]
  except OSError as e:
    return [f"{name} cannot be read ({e.strerror or e})"]
  if torn and log is None:
    return [f"{name}'s last line is cut short (a crash while it was "
            "written)"]
  for line in torn:
    log(line)
  if found == sealed:
    return []
  if len(found) != len(sealed):
    return [f"{name} holds {counted(len(found), 'record')} where the "
            f"checkpoint sealed {len(sealed)}"]
  first = next(b for a, b in zip(found, sealed) if a != b)
  return [f"{name}'s record of round {first.get('round')} is not the one "
          "the checkpoint sealed"]


def _read_own_json(out: OutputDir, name: str) -> tuple[Any, list[str]]:
  """``(content, [])`` of the JSON file ``name``, or ``(None, [why
  not])``."""
  if not os.path.exists(out.file(name)):
    return None, [f"{name} is missing"]
  try:
    return out.read_json(name), []
  except OutputDirError:
    return None, [f"{name} is not readable JSON (cut short by a crash or a "
                  "full disk)"]
  except OSError as e:
    return None, [f"{name} cannot be read ({e.strerror or e})"]


def _summary_differs(out: OutputDir, meta: dict[str, Any]) -> list[str]:
  """:func:`differing_files`' phrase for ``summary.json``."""
  summary, problems = _read_own_json(out, "summary.json")
  if problems:
    return problems
  if not isinstance(summary, dict):
    return ["summary.json is not a run's summary"]
  records = meta.get("records") or []
  config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
  expected = {"rounds": meta.get("round")}
  if records:
    expected["final_accuracy"] = records[-1].get("accuracy")
    expected["best_accuracy"] = max(r.get("accuracy", -1) for r in records)
  expected.update({k: config[k] for k in ("dataset", "algorithm", "model",
                                          "seed")
                   if k in config and k in summary})
  for key, value in expected.items():
    if summary.get(key) != value:
      return [f"summary.json's {key} is {summary.get(key)!r} where the "
              f"checkpoint's is {value!r}"]
  return []


def _config_differs(out: OutputDir, meta: dict[str, Any]) -> list[str]:
  """:func:`differing_files`' phrase for ``config.json``."""
  recorded, problems = _read_own_json(out, "config.json")
  if problems:
    return problems
  try:
    cls = config_class()
    saved = fields.from_dict(cls, meta["config"])
    written = from_config_json(cls, recorded)
  except (ValueError, TypeError, KeyError, AttributeError):
    return ["config.json does not read as the configuration of a run"]
  diff = fields.diff(saved, written, resumable_fields(saved) +
                     unused_sections(saved))
  if diff:
    return [f"config.json is of another configuration than the "
            f"checkpoint's ({'; '.join(diff[:3])})"]
  return []
