r"""Runs ``experiments.run`` as several processes on this machine.

  python -m experiments.local_processes --num_processes=2 \
      --devices_per_process=2 -- --rounds=3 --output_dir=runs/two

starts ``--num_processes`` copies of ``python -m experiments.run`` with the
flags after ``--``, each with its ``--distributed.*`` flags (a free port on
localhost for the coordinator) and ``--devices_per_process`` CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count``), and waits for them
(``augfl_jax.processes.local``):
the run of one process with several processes' devices, which is what a
run across hosts does, on one machine. Process 0's console is this
command's; the others' go to ``<output_dir>.process<i>.log``. The exit code
is the first non-zero exit code of a process, else 0.

Ctrl-C or SIGTERM to this command goes to every process once (a second
one, again): they stop together after the round, with a checkpoint, and
the line that resumes the run is this command's, with ``--resume``
(``python -m experiments.local_processes ... -- ... --resume``).

On several hosts, run ``experiments.run`` on each with its own
``--distributed.process_id`` (README, "Across processes and hosts").
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from typing import Sequence

from augfl_jax.processes import local

__all__ = ["launcher_command", "LAUNCHER"]

# The environment variable that gives the processes the command that
# launched them, up to its ``--`` (``experiments.run``'s resume line).
LAUNCHER = "AUGFL_JAX_LAUNCHER"


def _define_flags(flag_values) -> None:
  """This command's own flags (defined when it runs: the module is also a
  library, of tests that define flags of these names)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_integer("num_processes", 2, "how many processes run the "
                       "command together", lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer("devices_per_process", 1, "CPU devices of each "
                       "process", lower_bound=1, flag_values=flag_values)


def launcher_command(argv: Sequence[str]) -> str:
  """This command's line up to its ``--`` (``argv``: ``sys.argv``), as the
  processes' resume line starts it."""
  split = list(argv).index("--") if "--" in argv else len(argv)
  return " ".join(["python -m experiments.local_processes"] +
                  [shlex.quote(a) for a in argv[1:split]] + ["--"])


def main(argv: Sequence[str]) -> int:
  """The command (``argv``: ``sys.argv``). Its own flags are parsed as
  every command's (``--help`` prints them and exits 0; a bad one is one
  line, exit 2); those after ``--`` are ``experiments.run``'s."""
  from experiments import cli  # pylint: disable=g-import-not-at-top
  argv = list(argv)
  split = argv.index("--") if "--" in argv else len(argv)
  _define_flags(cli.FLAGS)
  cli.parse_flags(argv[:split])
  args = argv[split + 1:]
  output_dir = next((a.partition("=")[2] for a in args
                     if a.startswith("--output_dir=")), None)
  stem = output_dir.rstrip("/") if output_dir else "experiments_run"
  num_processes = cli.FLAGS.num_processes
  logs = [None] + [f"{stem}.process{i}.log"
                   for i in range(1, num_processes)]
  for log in logs[1:]:
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
  procs, received = [], []

  def pass_on(signum, frame):
    """A signal goes to every process once (in groups of their own, they
    get none from the terminal)."""
    del frame
    received.append(signum)
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, pass_on)
  started = local.launch(
      num_processes, cli.FLAGS.devices_per_process, args, logs=logs,
      own_group=True,
      env=dict(os.environ, **{LAUNCHER: launcher_command(argv)}))
  procs += started
  for signum in received:  # while they were started
    for p in started:
      p.send_signal(signum)
  codes = local.wait(procs)
  return next((c for c in codes if c), 0)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
