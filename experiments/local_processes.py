r"""Runs ``experiments.run`` as several processes on this machine.

  python -m experiments.local_processes --num_processes=2 \
      --devices_per_process=2 -- --rounds=3 --output_dir=runs/two

starts ``--num_processes`` copies of ``python -m experiments.run`` with the
flags after ``--``, each with its ``--distributed.*`` flags (a free port on
localhost for the coordinator) and ``--devices_per_process`` CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count``), and waits for them:
the run of one process with several processes' devices, which is what a
run across hosts does, on one machine. Process 0's console is this
command's; the others' go to ``<output_dir>.process<i>.log``. The exit code
is the first non-zero exit code of a process, else 0.

On several hosts, run ``experiments.run`` on each with its own
``--distributed.process_id`` (README, "Across processes and hosts").
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Sequence

__all__ = ["command", "free_port", "launch", "wait"]


def free_port() -> int:
  """A TCP port that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def command(process_id: int, num_processes: int, port: int,
            args: Sequence[str]) -> list[str]:
  """The command line of process ``process_id``."""
  return [sys.executable, "-m", "experiments.run",
          f"--distributed.coordinator=localhost:{port}",
          f"--distributed.num_processes={num_processes}",
          f"--distributed.process_id={process_id}", *args]


def launch(num_processes: int, devices_per_process: int,
           args: Sequence[str], *, logs: Sequence[str | None] | None = None,
           env: dict[str, str] | None = None, cwd: str | None = None
           ) -> list[subprocess.Popen]:
  """Starts the processes (CPU only). ``logs[i]``: where process ``i``'s
  output goes (None: this process's console)."""
  port = free_port()
  env = dict(os.environ if env is None else env, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count="
             f"{devices_per_process}")
  logs = logs or [None] * num_processes
  procs = []
  for i in range(num_processes):
    out = None if logs[i] is None else open(logs[i], "w")  # pylint: disable=consider-using-with
    procs.append(subprocess.Popen(
        command(i, num_processes, port, args), env=env, cwd=cwd,
        stdout=out, stderr=subprocess.STDOUT if out else None))
    if out is not None:
      out.close()  # the child holds its own copy
  return procs


def wait(procs: Sequence[subprocess.Popen], timeout: float | None = None
        ) -> list[int]:
  """Waits for every process, killing those still running after
  ``timeout`` seconds in all; their exit codes (negative: killed)."""
  deadline = None if timeout is None else time.monotonic() + timeout
  try:
    for p in procs:
      p.wait(timeout=None if deadline is None else
             max(0.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    pass
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [p.returncode for p in procs]


def main(argv: Sequence[str]) -> int:
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog="python -m experiments.local_processes",
      description=__doc__.split("\n\n")[1],
      usage="%(prog)s [--num_processes=N] [--devices_per_process=D] -- "
      "FLAGS OF experiments.run")
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--devices_per_process", type=int, default=1)
  argv = list(argv)
  split = argv.index("--") if "--" in argv else len(argv)
  options = parser.parse_args(argv[:split])
  if options.num_processes < 1 or options.devices_per_process < 1:
    parser.error("--num_processes and --devices_per_process must be >= 1")
  args = argv[split + 1:]
  output_dir = next((a.partition("=")[2] for a in args
                     if a.startswith("--output_dir=")), None)
  stem = output_dir.rstrip("/") if output_dir else "experiments_run"
  logs = [None] + [f"{stem}.process{i}.log"
                   for i in range(1, options.num_processes)]
  for log in logs[1:]:
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
  procs = launch(options.num_processes, options.devices_per_process, args,
                 logs=logs)
  try:
    codes = wait(procs)
  except KeyboardInterrupt:  # the processes got the signal too
    codes = wait(procs, timeout=600)
  return next((c for c in codes if c), 0)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
