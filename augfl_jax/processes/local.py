"""N processes of a run command on this machine, each with CPU devices of
its own: the run of one process with several processes' devices, which is
what a run across hosts does, on one machine.

:func:`launch` starts the command (``program``: by default :data:`RUN`, the
checkout's ``python -m experiments.run``; any command that reads the
``--distributed.*`` flags) ``num_processes`` times with the flags given,
each with its ``--distributed.*`` flags (a free port on localhost for the
coordinator, :func:`free_port`; :func:`command`) and
``XLA_FLAGS=--xla_force_host_platform_device_count``; :func:`wait` waits for
them. ``experiments.local_processes`` (the command), ``benchmarks.processes``
and the tests launch with it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Sequence

__all__ = ["RUN", "command", "free_port", "launch", "wait"]

# What python runs by default: the run command of a checkout (experiments/
# is not installed; outside a checkout, name a command of one's own).
RUN = ("-m", "experiments.run")


def free_port() -> int:
  """A TCP port that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def command(process_id: int, num_processes: int, port: int,
            args: Sequence[str], program: Sequence[str] = RUN) -> list[str]:
  """The command line of process ``process_id``: python with ``program``
  (what names the command: a module, ``("-m", "my_run")``, or a script,
  ``("my_run.py",)``), its ``--distributed.*`` flags, then ``args``."""
  return [sys.executable, *program,
          f"--distributed.coordinator=localhost:{port}",
          f"--distributed.num_processes={num_processes}",
          f"--distributed.process_id={process_id}", *args]


def launch(num_processes: int, devices_per_process: int,
           args: Sequence[str], *, program: Sequence[str] = RUN,
           logs: Sequence[str | None] | None = None,
           env: dict[str, str] | None = None, cwd: str | None = None,
           own_group: bool = False) -> list[subprocess.Popen]:
  """Starts the processes of ``program`` (:func:`command`; CPU only).
  ``logs[i]``: where process ``i``'s output goes (None: this process's
  console). ``own_group``: each in a process group of its own, so that a
  Ctrl-C in the terminal reaches only this process (which passes it on
  once, as ``experiments.local_processes`` does)."""
  port = free_port()
  env = dict(os.environ if env is None else env, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count="
             f"{devices_per_process}")
  logs = logs or [None] * num_processes
  procs = []
  for i in range(num_processes):
    out = None if logs[i] is None else open(logs[i], "w")  # pylint: disable=consider-using-with
    procs.append(subprocess.Popen(
        command(i, num_processes, port, args, program), env=env, cwd=cwd,
        stdin=subprocess.DEVNULL, stdout=out,
        stderr=subprocess.STDOUT if out else None,
        process_group=0 if own_group else None))
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
