r"""Runs one federated experiment (``augfl_jax.training.run``).

  python -m experiments.run                          # AugFL w/ PM on digits
  python -m experiments.run --dataset=fashion_mnist --pm.model=cnn \
      --pm.epochs=10 --rounds=100   # Debian's IDX files, on a CPU
  python -m experiments.run --dataset=fashion_mnist  # the paper's: a GPU's
  python -m experiments.run --dataset=emnist --data.download  # fetched once
  python -m experiments.run --dataset=emnist --data.data_dir=~/emnist/gzip
  python -m experiments.run --algorithm=fedavg --fedavg.lr=0.05 --rounds=100
  python -m experiments.run --flagfile=experiments/configs/fashion_mnist.flags
  python -m experiments.run --rounds=500 --resume    # continue a run further
  python -m experiments.run --distributed.coordinator=host0:1234 \
      --distributed.num_processes=2 --distributed.process_id=0  # on host0

Every flag but the run-control ones (``--output_dir``,
``--checkpoint_every``, ``--resume``, ``--overwrite``,
``--compilation_cache[_dir]``, ``--distributed.*``) is a field of
``augfl_jax.training.RunConfig``, named by its dotted path; flags of a
section the run does not read (``--augfl.lam`` with
``--algorithm=fedavg``, ``--pm.*`` without a PM) are named in a warning.
Outputs go to ``--output_dir`` (default
``runs/<dataset>_<algorithm>_seed<seed>``); the same command again, once
the run has finished, trains nothing, names its summary and exits 0. On a
terminal a live line shows every round below the printed lines.
Ctrl-C (SIGINT) or SIGTERM finishes the current round, saves a checkpoint
and exits with 128 + the signal's number, printing the command that resumes
the run; one that comes before the first round (PM pretraining included)
ends the command at its next step with a line saying what was kept, and one
in the last round lets the run finish; the exit code is the same. A second
one ends the process at once, even inside a long XLA call.

Across processes or hosts (``--distributed.*``, ``augfl_jax.processes``;
README, "Across processes and hosts") every process runs this command
with its own ``--distributed.process_id``; process 0 writes the files and
the console, a signal to any process stops all after the round, and a
process that ends stops the others within seconds, each with one line.
"""

from __future__ import annotations

import os
import signal
import sys


def _stopped_while_starting(signum, frame):
  """Ends the command at once with 128 + ``signum``. ``os._exit``, not
  ``sys.exit``: the handler can run inside code whose exceptions Python
  drops (a ``__del__``, a garbage-collection callback such as JAX's), where
  a ``SystemExit`` would be printed and the command would go on; nothing is
  open or written yet, so nothing is left to clean up."""
  del frame
  print(f"interrupted: {signal.Signals(signum).name} while the command was "
        "starting: nothing was trained or saved", file=sys.stderr, flush=True)
  os._exit(128 + signum)  # pylint: disable=protected-access


if __name__ == "__main__":
  # Before the imports, which take seconds (JAX): a signal then ends the
  # command in one line instead of silently (SIGTERM's default) or with a
  # traceback (SIGINT's); the run replaces these handlers with its own.
  for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, _stopped_while_starting)

import shlex  # pylint: disable=g-import-not-at-top,wrong-import-position
import traceback  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from augfl_jax import training  # pylint: disable=g-import-not-at-top,wrong-import-position
from augfl_jax import processes  # pylint: disable=g-import-not-at-top,wrong-import-position
from augfl_jax.commands import runner  # pylint: disable=g-import-not-at-top,wrong-import-position
from augfl_jax.processes import group  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments.local_processes import LAUNCHER  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = cli.FLAGS
cli.define_config_flags()
cli.define_run_control_flags()
cli.define_distributed_flags()
flags.adopt_module_key_flags(cli)  # --help lists them


def resume_command(argv: list[str], resume: bool = True) -> str:
  """The command line that continues this run: the same flags with
  ``--resume`` instead of ``--overwrite`` (``resume=False``: the command
  that starts it, for a run stopped before anything was saved). In a
  process that ``experiments.local_processes`` started, that command's,
  which resumes all its processes (the ``--distributed.*`` flags it gave
  each left out)."""
  drop = ("--resume", "--noresume", "--overwrite", "--nooverwrite")
  args = [a for a in argv[1:] if a.split("=")[0] not in drop]
  if not resume:
    args = [a for a in args if a.split("=")[0] != "--resume_changes"]
  head = "python -m experiments.run"
  if os.environ.get(LAUNCHER):
    head = os.environ[LAUNCHER]
    args = [a for a in args if not a.split("=")[0].startswith(
        ("--distributed.coordinator", "--distributed.num_processes",
         "--distributed.process_id"))]
  return " ".join([head] + [shlex.quote(a) for a in args] +
                  (["--resume"] if resume else []))


def _log(line: str) -> None:
  print(line, flush=True)


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  cli.start_command()
  if not runner.run_command(cli.start_processes):
    _main()
    return
  group.hint = f"resume with: {resume_command(sys.argv)}"
  # One of several processes: a process that ends tells the others why
  # (they stop within seconds, saying so), and ends at once, not in
  # jax.distributed's wait for the processes that stopped.
  try:
    _main()
  except BaseException as e:  # pylint: disable=broad-except
    code = e.code if isinstance(e, SystemExit) else 1
    if not isinstance(e, SystemExit):
      group.ending(_first_line(e))
      traceback.print_exc()
    group.announce_stop(f"it ended with exit code {code}")
    group.leave(code if isinstance(code, int) else 1)
  group.finished()


def _main():
  def body():
    plan = training.prepare(cli.config_from_flags())
    warning = cli.unread_flags_warning(plan)
    if warning and processes.is_writer():
      print(warning, file=sys.stderr, flush=True)
    return training.run(
        plan, FLAGS.output_dir or cli.default_output_dir(plan.config),
        log=_log, checkpoint_every=FLAGS.checkpoint_every,
        resume=FLAGS.resume, overwrite=FLAGS.overwrite,
        resume_changes=FLAGS.resume_changes, live=sys.stdout.isatty())

  try:
    with training.StopSignals() as stop:  # a signal before the run's own
      runner.run_command(body, on_error=group.ending)
      late = stop.take()  # it came in the last round: the run finished
  except training.RunInterrupted as e:
    group.announce_stop(f"interrupted ({_first_line(e)})")
    if e.checkpoint is None:  # nothing saved: the same command starts it
      print(f"interrupted: {e}\nstart it again with: "
            f"{resume_command(sys.argv, resume=False)}", file=sys.stderr)
    else:
      print(f"interrupted: {e}\nresume with: {resume_command(sys.argv)}",
            file=sys.stderr)
    sys.exit(128 + e.signum)
  except KeyboardInterrupt:
    print("interrupted at once (a second signal); resume from the newest "
          f"checkpoint, if any, with: {resume_command(sys.argv)}",
          file=sys.stderr, flush=True)
    # os._exit, not sys.exit: the interpreter's exit would wait for the
    # computation in flight (an XLA call may last minutes); what is on disk
    # is what a kill -9 leaves, which --resume reads.
    sys.stdout.flush()
    os._exit(130)  # pylint: disable=protected-access
  if late is not None:
    print(f"interrupted: {signal.Signals(late).name} in the last round: the "
          "run finished and saved its results", file=sys.stderr)
    sys.exit(128 + late)


if __name__ == "__main__":
  cli.main_runner(main)
