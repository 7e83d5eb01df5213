r"""A grid of runs over configuration fields and seeds, with a table.

  python -m experiments.sweep --algorithm=augfl \
      --grid="augfl.rho=0.7,0.2,0.05;eval.alpha=0.03,0.1" --seeds=0,1,2 \
      --output_dir=runs/sweep_augfl

``--grid`` names ``RunConfig`` fields by their dotted paths, as the flags of
``experiments.run`` do; every other run flag (``--dataset``, ``--rounds``,
``--augfl.lam``, ...) applies to every cell. Each (cell, seed) run writes its
own directory under ``--output_dir``; a finished run of the same
configuration is reused and an interrupted one continues from its
checkpoint, so an interrupted sweep resumes (a larger ``--rounds`` trains the
finished runs further). A finished run is reused by what its newest
checkpoint sealed (its configuration, round and records); one whose files
are not what it sealed (copied from another run, edited, torn) is refused
in one line with the command that writes them again. Writes
``results.json`` (what the table is of: each cell's configuration and the
seeds), ``results.md`` and ``results.csv``, scored as
``experiments.table2`` scores (``experiments.scores``): per cell, the
final accuracy on the test-split clients where every run has them (else
on the protocol's held-out clients), the mean of the seeds with its 95%
t-interval across seeds, and the paired difference to the reference cell
(``--reference``, default the first; the same seed, the same clients)
with its interval across seeds; per run, its accuracy and paired
difference with their intervals across clients (:func:`write_tables`).
With fewer than 3 seeds the table says that an interval across seeds
needs at least 3. A table of other
cells, seeds or configuration in ``--output_dir`` is never replaced by a
smaller one: the sweep stops before any run unless ``--replace_results``
is given; ``--grid`` or ``--seeds`` naming nothing, or a value twice, is
refused.

The runs go one after another in this one process, on its devices: a sweep
launches no run across processes or hosts (``--distributed.*`` is
``experiments.run``'s alone), and a cell whose checkpoints several
processes saved is refused, in one line, where the sweep would continue
it.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import itertools
import json
import os
import shlex
import signal
import sys
import time
from typing import Any, Callable, Iterator

from absl import flags
import numpy as np

from augfl_jax import training
from augfl_jax.commands import runner
from augfl_jax.core import fields, intervals, progress
from augfl_jax.storage import locks
from augfl_jax.training import checkpoints, outputs
from experiments import cli
from experiments import curves, scores

FLAGS = flags.FLAGS
Cell = dict[str, Any]  # dotted RunConfig field -> value


def define_command_flags(output_dir_default: str) -> None:
  """The run flags of every comparison command (``--output_dir``, whose
  help states ``output_dir_default``, the compilation cache,
  ``--checkpoint_every`` and every ``RunConfig`` field); defined only when
  a command runs."""
  cli.define_config_flags()
  cli.define_run_control_flags(output_dir_default)


def define_seeds_flag() -> None:
  flags.DEFINE_list("seeds", ["0", "1", "2"], "seeds of every cell")


def parse_list(values: list[str], cast: type, flag: str) -> list:
  """A list flag's values as ``cast`` (int, float), each named once;
  ``ValueError`` names the flag."""
  try:
    parsed = [cast(v) for v in values]
  except ValueError:
    raise ValueError(f"--{flag} takes {cast.__name__} values separated by "
                     f"commas, got {','.join(values)!r}") from None
  return distinct(parsed, f"--{flag}")


def _cast(kind: type, text: str, name: str) -> Any:
  """``text`` as a value of a field of type ``kind``."""
  if kind is bool:
    if text.lower() in ("1", "true"):
      return True
    if text.lower() in ("0", "false"):
      return False
    raise ValueError(f"--grid: {name} takes true or false, got {text!r}")
  if kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      raise ValueError(f"--grid: {name} takes {kind.__name__} values, got "
                       f"{text!r}") from None
  if kind is tuple:
    raise ValueError(f"--grid: {name} is a list field; set it with its flag")
  return text


def parse_grid(text: str) -> list[Cell]:
  """``"augfl.rho=0.7,0.2;algorithm=augfl"`` -> ``[{"augfl.rho": 0.7,
  "algorithm": "augfl"}, {"augfl.rho": 0.2, "algorithm": "augfl"}]``, each
  value typed by its field (``fields.leaf_type``)."""
  default = training.config.config_class()()
  leaves = {name: owner for name, _, owner, _ in fields.walk(default)}
  axes = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, _, values = part.partition("=")
    name = name.strip()
    if name not in leaves or not values:
      raise ValueError(f"bad --grid entry {part!r}: expected name=v1,v2 with "
                       "a dotted RunConfig field as name (e.g. augfl.rho, "
                       "eval.alpha, data.M, rounds)")
    if name == "seed":
      raise ValueError(f"--grid: {part}: every cell runs every seed of "
                       f"--seeds; pass --seeds={values.strip()}")
    if any(axis[0][0] == name for axis in axes):
      raise ValueError(f"--grid names {name} more than once; give its values "
                       f"once ({name}=v1,v2)")
    kind = fields.leaf_type(leaves[name], name.rpartition(".")[2])
    axes.append([(name, value) for value in distinct(
        [_cast(kind, v.strip(), name) for v in values.split(",")],
        f"--grid: {name}")])
  return [dict(cell) for cell in itertools.product(*axes)]


def command_name() -> str:
  """The running command's module, e.g. ``experiments.table2``."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  return spec.name if spec is not None and spec.name else "experiments.sweep"


def command_line() -> str:
  """``python -m <the running command> <its arguments>``: the command that
  continues an interrupted comparison (it reuses what is finished)."""
  return " ".join(["python -m", command_name()] +
                  [shlex.quote(a) for a in sys.argv[1:]])


def distinct(values: list[Any], flag: str) -> list[Any]:
  """``values`` unchanged; ``ValueError`` (one line, ``flag`` naming
  where they come from: ``--seeds``) when there are none (a table of
  nothing would replace one of something) or one is named twice (a seed
  or a method counted twice would weigh twice)."""
  if not values:
    raise ValueError(f"{flag} names nothing; name at least one")
  seen = set()
  twice = [v for v in values if v in seen or seen.add(v)]
  if twice:
    raise ValueError(f"{flag} names {twice[0]} more than once; name each "
                     "once")
  return values


_held: set[str] = set()  # the directories this process holds


@contextlib.contextmanager
def exclusive(directory: str) -> Iterator[None]:
  """Holds ``directory``'s lock (``.augfl_jax.lock``, the directory made
  if needed) for the block: one command writes there at a time; another
  stops at once, one line naming the holder. Re-entered in the process
  that holds it, it holds it on. Taking it removes the temporary files
  (``.tmp-*``) a command killed while it wrote a table left there."""
  key = os.path.realpath(directory)
  if key in _held:
    yield
    return
  try:
    fd, holder = locks.try_lock(os.path.join(directory, outputs.LOCK))
  except OSError as e:
    raise ValueError(f"{directory} cannot be written: "
                     f"{e.strerror or e}") from None
  if fd is None:
    raise ValueError(f"{directory} is in use by another command (process "
                     f"{holder}); wait for it to finish or write elsewhere")
  # What a command killed while it wrote a table left (no other writes
  # there while this one holds the lock).
  for name in os.listdir(directory):
    if name.startswith(".tmp-") and os.path.isfile(
        os.path.join(directory, name)):
      with contextlib.suppress(OSError):
        os.remove(os.path.join(directory, name))
  _held.add(key)
  try:
    yield
  finally:
    _held.discard(key)
    os.close(fd)


def cell_name(cell: Cell) -> str:
  return ("_".join(f"{k}={v}" for k, v in cell.items()).replace("/", "-")
          or "base")


def _sealed(run_dir: str, log: Callable[[str], None]
           ) -> tuple[int, dict[str, Any]] | None:
  """``(round, metadata)`` of the newest checkpoint of ``run_dir`` that
  reads back (its metadata, sealed: what the run is, whatever its
  ``config.json`` says), telling ``log`` of each newer one that does not;
  None without a checkpoint.

  Raises:
    ValueError: the run has checkpoints, and none reads back.
  """
  out = outputs.OutputDir(run_dir)
  root = out.file("checkpoints")
  if "checkpoints" not in out.own_files() or not os.path.isdir(root):
    return None
  manager = checkpoints.RunCheckpoints(root)  # touches nothing
  try:
    if not manager.steps():
      return None
    return manager.latest_meta(log)
  except checkpoints.CheckpointError as e:
    raise ValueError(f"{e.what}; {_start_again(run_dir)}") from None
  finally:
    manager.close()


def _start_again(run_dir: str) -> str:
  """The way out of a run directory whose checkpoints are all damaged."""
  return (f"remove {run_dir} to run it again, or choose another "
          "--output_dir")


def finished_run(run_dir: str, config: training.RunConfig | training.Plan,
                 log: Callable[[str], None] = print
                ) -> dict[str, Any] | None:
  """The summary of the run in ``run_dir`` if it is ``config``'s (or its
  plan's: ``training.prepare``) and has done ``config.rounds`` rounds;
  ``None`` if it must run (absent,
  interrupted, or fewer rounds: it continues). What the run is comes from
  its newest checkpoint's sealed metadata (its configuration, round and
  records), not from its files, which may have been edited, torn or
  copied from another run: a newer checkpoint that does not read back
  (damaged, unsealed) is named to ``log`` and the run continues from the
  one before, as ``--resume`` does.

  Raises:
    ValueError: ``run_dir`` holds a run of another configuration (fields
      outside ``training.resumable_fields`` differ, or a configuration
      this version cannot read), one that went beyond ``config.rounds``,
      checkpoints none of which reads back, or a finished run whose
      ``metrics.jsonl``, ``summary.json``, ``config.json`` or
      ``changes.jsonl`` are not what it sealed (one line with the command
      that writes them again).
  """
  out = outputs.OutputDir(run_dir)
  if "summary.json" not in out.own_files() or not os.path.exists(
      out.file("summary.json")):
    return None  # the run decides: a fresh run, or a refused directory
  sealed = _sealed(run_dir, log)
  if sealed is None:
    return None  # no checkpoint to tell what it is: the run decides
  step, meta = sealed
  plan = config if isinstance(config, training.Plan) else training.prepare(
      config)
  config = plan.config
  try:
    saved = fields.from_dict(type(config), meta["config"])
  except (ValueError, TypeError, AttributeError) as e:
    raise ValueError(f"{run_dir} holds a run whose configuration does not "
                     f"read as a RunConfig ({e}); choose another "
                     "--output_dir or remove that run") from None
  diff = fields.diff(saved, config, training.resumable_fields(config) +
                     plan.unused)
  if diff:
    raise ValueError(f"{run_dir} holds a run of another configuration "
                     f"({'; '.join(diff)}); choose another --output_dir or "
                     "remove that run")
  if step > config.rounds:
    raise ValueError(f"{run_dir} holds a run at round {step}, beyond "
                     f"--rounds={config.rounds}; pass --rounds={step} or "
                     "more, or choose another --output_dir")
  done = _finished_rounds(run_dir)
  if step != config.rounds or (done is not None and done < step):
    return None  # it continues (a summary of fewer rounds: stopped after
    # its last checkpoint, before the summary of its extension)
  scores.check_files(run_dir, os.path.join(out.file("checkpoints"),
                                           f"step_{step}"), meta, log)
  return out.read_json("summary.json")


def resumable(run_dir: str) -> bool:
  """Whether ``run_dir`` holds a run of this tool with a checkpoint (read
  without touching anything: the run may be going on in another
  process)."""
  out = outputs.OutputDir(run_dir)
  root = out.file("checkpoints")
  if "checkpoints" not in out.own_files() or not os.path.isdir(root):
    return False
  manager = checkpoints.RunCheckpoints(root)
  try:
    return bool(manager.steps())
  finally:
    manager.close()


def _finished_rounds(run_dir: str) -> int | None:
  """The rounds of the finished run in ``run_dir`` (its summary), if any."""
  try:
    return int(outputs.OutputDir(run_dir).read_json("summary.json")["rounds"])
  except (OSError, ValueError, KeyError, TypeError, outputs.OutputDirError):
    return None


@dataclasses.dataclass(frozen=True)
class Run:
  """One (cell, seed) run of a grid.

  Attributes:
    name: the cell's directory name.
    cell: its dotted ``RunConfig`` field overrides.
    seed: its seed.
    plan: its plan (``training.prepare``): the one the run trains and the
      finished run is checked against.
  """

  name: str
  cell: Cell
  seed: int
  plan: training.Plan


def plan_runs(base: training.RunConfig, cells: list[Cell], seeds: list[int],
              names: list[str] | None = None) -> list[Run]:
  """Every (cell, seed) run of ``cells`` (on ``base``) and ``seeds``, in
  that order, each prepared once (``training.prepare``): what can be
  refused is refused here, before any run. ``names``: the cells'
  directory names (default ``cell_name(cell)``)."""
  names = names or [cell_name(cell) for cell in cells]
  return [Run(name, cell, seed, training.prepare(
      fields.replace(base, seed=seed, **cell)))
          for (name, cell), seed in itertools.product(zip(names, cells),
                                                      seeds)]


def run_cells(runs: list[Run], out: str,
              transform: Callable[[training.Plan],
                                  Callable[..., Any] | None] | None = None,
              checkpoint_every: int = training.CHECKPOINT_EVERY,
              log: Callable[[str], None] = print,
              finished_only: bool = False) -> list[dict[str, Any]]:
  """Runs every run of ``runs`` (:func:`plan_runs`) under
  ``out/<name>/seed<seed>``.

  Args:
    runs: the (cell, seed) runs, prepared.
    out: the root of the run directories.
    transform: ``transform(plan)`` gives the ``transform_data`` hook of
      ``training.run`` for the run of ``plan`` (e.g. ``experiments.ood``'s
      held-out domain), or ``None``.
    checkpoint_every: as ``training.run``'s.
    log: receives every run's progress lines, each prefixed with
      ``[k/n] <cell> seed <seed>:``, and after each run the sweep's time
      so far and an estimate of the time left.
    finished_only: run nothing: a (cell, seed) without a finished run is
      left out of the rows (saying so), e.g. to tabulate a sweep whose
      runs are still going, or were run elsewhere; ``out`` is only read
      (its lock is not taken: a copy one may not write is read too).

  A finished run of the same configuration is reused (``finished_run``); an
  interrupted one continues from its checkpoint, and a finished one with
  fewer rounds is extended (saying so: its directory then holds the longer
  run). SIGINT/SIGTERM raises ``training.RunInterrupted``: from the run it
  stopped (its state saved), or after the run it came too late to stop.

  Returns:
    One row per run: ``cell``, ``seed``, the cell's fields (dotted names),
    ``final_accuracy``, ``best_accuracy``, ``run_dir``.
  """
  # Reading finished runs needs no lock: a copy one may not write is read.
  with contextlib.nullcontext() if finished_only else exclusive(out):
    return _run_cells(runs, out, transform, checkpoint_every, log,
                      finished_only)


def _run_cells(runs, out, transform, checkpoint_every, log,
               finished_only) -> list[dict[str, Any]]:
  """:func:`run_cells`' body, while it holds ``out``'s lock."""
  rows, durations = [], []
  start = time.perf_counter()
  with training.StopSignals() as stop:
    for k, run in enumerate(runs, 1):
      name, cell, seed, plan = run.name, run.cell, run.seed, run.plan
      config = plan.config
      run_dir = os.path.join(out, name, f"seed{seed}")
      prefix = f"[{k}/{len(runs)}] {name} seed {seed}"
      summary = finished_run(run_dir, plan,
                             log=lambda line, p=prefix: log(f"{p}: {line}"))
      if summary is not None:
        log(f"{prefix}: reusing {run_dir}")
      elif finished_only:
        log(f"{prefix}: no finished run in {run_dir}; left out")
        continue
      else:
        resume = resumable(run_dir)  # an interrupted run continues
        done = _finished_rounds(run_dir) if resume else None
        if done is not None and done >= config.rounds:
          done = None  # its last checkpoint is damaged: it trains again
        log(f"{prefix}: " + (
            f"extending the finished {done}-round run in {run_dir} to "
            f"{progress.counted(config.rounds, 'round')}" if done is not None
            else
            f"continuing {run_dir}" if resume else f"running in {run_dir}"))
        t0 = time.perf_counter()
        try:
          summary = training.run(
              plan, run_dir, log=lambda text, p=prefix: log("\n".join(
                  f"{p}: {line}" for line in text.splitlines())),
              resume=resume, overwrite=not resume,
              checkpoint_every=checkpoint_every,
              transform_data=transform(plan) if transform else None)
        except checkpoints.CheckpointError as e:
          if e.way_out is None:  # not "none reads back"
            raise
          raise ValueError(f"{e.what}; {_start_again(run_dir)}") from None
        durations.append(time.perf_counter() - t0)
        left = len(runs) - k
        elapsed = progress.format_duration(time.perf_counter() - start)
        estimate = progress.format_duration(left * np.mean(durations))
        log(f"{prefix}: done ({durations[-1]:.0f} s); {k}/{len(runs)} runs "
            f"in {elapsed}" + (
                f", about {estimate} left for {left} more (at the mean of "
                f"the {len(durations)} run(s) so far)" if left else ""))
      rows.append({"cell": name, "seed": seed, **cell,
                   "final_accuracy": summary["final_accuracy"],
                   "best_accuracy": summary["best_accuracy"],
                   "seconds": summary["seconds"],
                   "run_dir": run_dir})
      if stop.signum is not None:  # it came too late to stop that run
        raise training.RunInterrupted(
            f"{signal.Signals(stop.signum).name} after run {k}/{len(runs)} "
            f"({name} seed {seed}, finished and saved in {run_dir})",
            stop.signum, summary["rounds"], None)
  return rows


def run_comparison(body: Callable[[], Any]) -> Any:
  """A comparison command's ``body()`` under ``runner.run_command``;
  SIGINT/SIGTERM stops it after the current round of the current run (its
  state saved), or after the run it came too late to stop, with a line
  saying what was saved and the command that continues (the same one: it
  reuses finished runs and resumes the stopped one), exit 128 + signal."""
  try:
    return runner.run_command(body)
  except training.RunInterrupted as e:
    print(f"interrupted: {e}\ncontinue with: {command_line()}",
          file=sys.stderr)
    sys.exit(128 + e.signum)
  except KeyboardInterrupt:
    print("interrupted at once (a second signal); continue from the newest "
          f"checkpoints with: {command_line()}", file=sys.stderr)
    sys.exit(130)


def check_run_control() -> None:
  """A comparison command decides itself whether each run is fresh,
  reused or resumed: ``--resume``, ``--overwrite`` and
  ``--resume_changes`` are refused; it runs every seed of ``--seeds``, so
  a ``--seed`` given is refused rather than ignored."""
  given = [f"--{n}" for n in ("resume", "overwrite", "resume_changes")
           if FLAGS[n].value]
  if given:
    raise ValueError(f"{' and '.join(given)}: a comparison command reuses "
                     "finished runs and continues interrupted ones by "
                     "itself; use another --output_dir to start afresh")
  if FLAGS["seed"].present:
    raise ValueError(f"--seed={FLAGS.seed}: this command runs every seed of "
                     f"--seeds; pass --seeds={FLAGS.seed}")


def table_key(configs: dict[str, training.RunConfig], seeds: list[int]
             ) -> dict[str, Any]:
  """What a table is of: each cell's resolved configuration
  (``training.resolve``; named by ``configs``' keys: its own section and
  the shared fields; not the seed, not where the data are or how the
  rounds run) and the seeds."""
  skip = {"seed"} | set(training.resumable_fields(
      next(iter(configs.values())))) - {"rounds"}
  cells = {}
  for name, config in configs.items():
    unused = training.config.unused_sections(config)
    flat = curves.flatten({k: v for k, v in fields.to_dict(config).items()
                           if k not in unused})
    cells[name] = {k: v for k, v in flat.items() if k not in skip}
  return {"cells": cells, "seeds": sorted(seeds)}


def check_table(directory: str, key: dict[str, Any], replace: bool,
                tables: tuple[str, ...], record: str, what: str,
                advice: str) -> None:
  """Refuses to replace a table in ``directory`` (its files ``tables``)
  by one of another configuration: the new table (``key``,
  :func:`table_key`) must hold every (``what``: method or cell, seed) of
  the old one (its ``record``, written with it), with the same
  configuration, unless ``replace``.

  Raises:
    ValueError: one line saying what differs, then ``advice``.
  """
  files = [f for f in tables if os.path.exists(os.path.join(directory, f))]
  if replace or not files:
    return
  try:
    with open(os.path.join(directory, record)) as f:
      old = json.load(f)
    old_cells, old_seeds = old["cells"], old["seeds"]
  except (OSError, ValueError, KeyError, TypeError):
    raise ValueError(f"{directory}/{files[0]} holds a table whose "
                     f"configuration is not recorded (no readable {record}); "
                     f"{advice}") from None
  differences = [f"seeds {','.join(map(str, old_seeds))} -> "
                 f"{','.join(map(str, key['seeds']))}"] if not set(
                     old_seeds) <= set(key["seeds"]) else []
  for name, cell in old_cells.items():
    new = key["cells"].get(name)
    if new is None:
      differences.append(f"{what} {name} missing")
    elif new != cell:
      differences += [f"{name} {k}: {cell.get(k)} -> {new.get(k)}"
                      for k in sorted(set(cell) | set(new))
                      if cell.get(k) != new.get(k)][:3]
  if differences:
    raise ValueError(f"{directory}/{files[0]} holds a table of another "
                     f"configuration ({'; '.join(differences[:4])}); "
                     f"{advice}")


def csv_text(rows: list[dict[str, Any]]) -> str:
  """``rows`` as CSV text, one column per key (in order of appearance)."""
  buffer = io.StringIO(newline="")
  writer = csv.DictWriter(buffer, fieldnames=list(
      dict.fromkeys(k for r in rows for k in r)))
  writer.writeheader()
  writer.writerows(rows)
  return buffer.getvalue()


def reference_cell(cells: list[str], reference: str | None) -> str:
  """The cell the others are paired with: ``reference`` (a cell's name,
  :func:`cell_name`), or the first of ``cells`` when it is ``None``.

  Raises:
    ValueError: ``reference`` names no cell (one line listing them).
  """
  if reference is None or reference == "":
    return cells[0]
  if reference not in cells:
    raise ValueError(f"--reference={reference} names no cell; name one of "
                     f"{', '.join(cells)}")
  return reference


def write_tables(rows: list[dict[str, Any]], out: str, title: str,
                 key: dict[str, Any] | None = None,
                 reference: str | None = None,
                 log: Callable[[str], None] = print) -> str:
  """Writes ``results.json`` (``key``, what the table is of:
  :func:`table_key`; first, so that a table stopped between its files is
  one its rerun writes again), ``results.csv`` and ``results.md`` to
  ``out``; prints and returns the markdown.

  Each run of ``rows`` (:func:`run_cells`) is scored from its newest
  checkpoint (``scores.load_run_score``), as ``experiments.table2`` scores
  its runs: on the test-split clients where every run has them, else on
  the protocol's held-out clients. Per cell: the mean of its seeds'
  accuracies with the 95% t-interval across seeds, and the paired
  difference to the ``reference`` cell (:func:`reference_cell`: the
  first by default; the same seeds and clients) with its interval across
  seeds; a cell scored on other clients than the reference's (a grid over
  the data) is not paired, saying why; a line says where a cell has fewer
  than 3 seeds. Per run: its accuracy with its interval across its
  clients and its paired difference to the reference's run of its seed.
  ``results.csv`` holds the same figures in %: a row per cell (``seed``
  "all", intervals across seeds) then a row per run (intervals across
  clients), with the cells' fields.
  """
  if key is not None:
    outputs.write_text_atomic(os.path.join(out, "results.json"),
                              json.dumps(key, indent=1, sort_keys=True))
  runs = [scores.load_run_score(r["run_dir"], r["cell"], r["seed"], log)
          for r in rows]
  cells = list(dict.fromkeys(r["cell"] for r in rows))
  fields_of = {r["cell"]: {k: v for k, v in r.items() if k not in _ROW}
               for r in rows}
  reference = reference_cell(cells, reference)
  paired = len(cells) > 1
  test_split = scores.uses_test_split(runs)
  where = "test_split" if test_split else "heldout"
  unpaired = {}  # cell -> why it has no paired difference
  summaries, csv_rows = [], []
  for cell in cells:
    diff = None
    if paired and cell != reference:
      try:
        diff = scores.paired(runs, cell, reference, test_split)[1]
      except ValueError as e:
        unpaired[cell] = str(e)
    summaries.append((cell, scores.across_seeds(runs, cell, test_split),
                      diff, scores.across_seeds(runs, cell, False),
                      sum(r.method == cell for r in runs)))
  headline = ("test-split clients" if test_split else
              "the protocol's held-out clients")
  minus = f"minus {reference}"
  lines = [f"# {title}", "",
           f"Accuracy (%) after the last round on {headline}. `a [l, h]` "
           "is an estimate a with its 95% confidence interval. Across "
           "seeds: the mean of the seeds' accuracies, Student's t with "
           "n - 1 degrees of freedom. Across clients (one run): the "
           "sample-weighted accuracy over its clients (augfl_jax.intervals)."
           + (f" \"{minus}\" is paired: the same seed, the same clients."
              if paired else ""), "",
           "| cell | accuracy, 95% CI across seeds | "
           + (f"{minus}, 95% CI across seeds | " if paired else "")
           + ("held-out clients, 95% CI across seeds | " if test_split
              else "") + "seeds |",
           "|---" * (3 + paired + test_split) + "|"]
  for cell, acc, diff, held, n in summaries:
    lines.append(f"| {cell} | {acc.format()} | "
                 + (f"{_dash(diff)} | " if paired else "")
                 + (f"{held.format()} | " if test_split else "") + f"{n} |")
    rounds = next(r.rounds for r in runs if r.method == cell)
    csv_rows.append(_csv_row(cell, "all", fields_of[cell], reference,
                             rounds, where, "seeds", acc, diff, held))
  few = scores.few_seeds_note({s[0]: s[-1] for s in summaries})
  notes = [f"{cell} is not paired with {reference}: {why}."
           for cell, why in unpaired.items()] + ([few] if few else [])
  lines += ["", "\n\n".join(notes)] if notes else []
  lines += ["", "Every run (95% CI across its clients):", "",
            "| cell | seed | accuracy | " + (f"{minus} | " if paired else "")
            + "held-out clients | best held-out | rounds | seconds |",
            "|---" * (7 + paired) + "|"]
  for r in runs:
    diff = (scores.minus_reference(runs, r, reference, test_split)
            if paired and r.method not in unpaired else None)
    acc, held = r.headline(test_split).interval, r.heldout.interval
    lines.append(f"| {r.method} | {r.seed} | {acc.format()} | "
                 + (f"{_dash(diff)} | " if paired else "")
                 + f"{held.format()} | {100 * r.best_heldout:.2f} | "
                 f"{r.rounds} | {r.seconds:.0f} |")
    csv_rows.append({**_csv_row(r.method, str(r.seed), fields_of[r.method],
                                reference, r.rounds, where, "clients", acc,
                                diff, held),
                     "best_heldout_accuracy": f"{100 * r.best_heldout:.2f}",
                     "seconds": f"{r.seconds:.0f}", "run_dir": r.run_dir})
  outputs.write_text_atomic(os.path.join(out, "results.csv"),
                            csv_text(csv_rows))
  text = "\n".join(lines) + "\n"
  outputs.write_text_atomic(os.path.join(out, "results.md"), text)
  print(text)
  return text


# What a row of run_cells holds beside its cell's fields.
_ROW = ("cell", "seed", "final_accuracy", "best_accuracy", "seconds",
        "run_dir")


def _dash(interval: intervals.Interval | None) -> str:
  return "–" if interval is None else interval.format()


def _csv_row(cell: str, seed: str, cell_fields: dict[str, Any],
             reference: str, rounds: int, scored_on: str, interval: str,
             accuracy: intervals.Interval,
             diff: intervals.Interval | None,
             heldout: intervals.Interval) -> dict[str, Any]:
  """A row of ``results.csv``: figures in % (``scores.percent``)."""
  a, d, h = map(scores.percent, (accuracy, diff, heldout))
  return {"cell": cell, "seed": seed, **cell_fields, "rounds": rounds,
          "scored_on": scored_on, "interval": interval,
          "accuracy": a[0], "accuracy_ci_low": a[1],
          "accuracy_ci_high": a[2], "reference": reference,
          "minus_reference": d[0], "minus_reference_ci_low": d[1],
          "minus_reference_ci_high": d[2], "heldout_accuracy": h[0],
          "heldout_ci_low": h[1], "heldout_ci_high": h[2]}


def main(argv):
  del argv  # flags only (cli.parse_flags)
  cli.start_command()

  def body():
    check_run_control()
    base = cli.config_from_flags()
    cells = parse_grid(FLAGS.grid)
    seeds = parse_list(FLAGS.seeds, int, "seeds")
    for cell in cells:  # every cell's configuration, before any run
      try:
        fields.replace(base, **cell)
      except (ValueError, TypeError) as e:  # a section's own check
        raise ValueError(f"--grid cell {cell_name(cell)}: {e}") from None
    runs = plan_runs(base, cells, seeds)  # every run's, prepared once
    configs = {cell_name(cell): training.resolve(fields.replace(base, **cell))
               for cell in cells}
    reference = reference_cell(list(configs), FLAGS.reference)
    key = table_key(configs, seeds)
    out = FLAGS.output_dir or f"runs/sweep_{base.algorithm}"
    with exclusive(out):  # its runs, then its tables
      check_table(out, key, FLAGS.replace_results,
                  ("results.md", "results.csv"), "results.json", "cell",
                  "pass --output_dir=DIR to run the new sweep elsewhere, or "
                  "--replace_results to replace its table (its runs stay)")
      rows = run_cells(runs, out, checkpoint_every=FLAGS.checkpoint_every)
      write_tables(rows, out, f"{base.algorithm} on {base.dataset}, "
                   f"{progress.counted(base.rounds, 'round')}", key,
                   reference)

  run_comparison(body)


if __name__ == "__main__":
  define_command_flags("runs/sweep_<algorithm>")
  flags.DEFINE_string("grid", "", "cells: 'name=v1,v2;name2=w1,w2' over "
                      "dotted RunConfig fields (augfl.rho, eval.alpha, ...)")
  flags.DEFINE_bool("replace_results", False, "replace a table of other "
                    "cells, seeds or configuration in --output_dir (refused "
                    "otherwise)")
  flags.DEFINE_string("reference", None, "the cell the others are paired "
                      "with, by its name in the table (e.g. augfl.rho=0.7; "
                      "default: the first cell of --grid)")
  define_seeds_flag()
  cli.main_runner(main)
