"""The processes of a run across processes or hosts start together and end
together.

:func:`initialize` is ``jax.distributed.initialize`` for a run (before any
other JAX call; from ``experiments.run``'s ``--distributed.*`` flags, or on
a cluster JAX detects), with the coordination service in a child process
of process 0 and a :class:`Watchdog` in every process. The watchdog keeps a
heartbeat per process in the coordinator's key-value store; a process that
stops (killed, or ended by an error: :func:`ending`, :func:`announce_stop`)
ends the others within ``STALE_SECONDS`` with one line naming it and how
the run goes on (:data:`hint`), instead of a hang in the next collective
or the runtime's abort with a stack trace. :func:`leave` ends a process at
once; :func:`finished` says that it finished its run.

What the processes compute together (who writes, where the clients live,
the decisions they agree on) is :mod:`augfl_jax.training.processes`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading
import time

import jax

from augfl_jax.training.processes import count, index

__all__ = [
    "announce_stop", "cluster_detected", "ending", "finished", "hint",
    "initialize", "leave", "STALE_SECONDS", "Watchdog"
]

# A peer whose heartbeat is older than this is taken to be gone.
STALE_SECONDS = 10.0
BEAT_SECONDS = 0.5
GRACE_SECONDS = 3.0
# The runtime's own detection, a backstop behind the watchdog's.
HEARTBEAT_TIMEOUT = 30
_KEY = "augfl_jax/process/"
_GONE = "augfl_jax/gone/"
_watchdog = None  # this process's, once initialize() started it
# The end of the watchdog's line: how the run goes on (a command sets its
# own, e.g. the command that resumes it).
hint = "the newest checkpoint is where --resume continues"


def cluster_detected() -> bool:
  """Whether a cluster that ``jax.distributed.initialize()`` configures by
  itself (Slurm with several tasks, Open MPI, a Cloud TPU pod, ...) runs
  this process: JAX's own detection (``jax._src.clusters``)."""
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top
    return any(env.is_env_present()
               for env in clusters.ClusterEnv._cluster_types  # pylint: disable=protected-access
               if env.__name__ != "Mpi4pyCluster")  # opt-in only
  except Exception:  # pylint: disable=broad-except
    return False


def initialize(coordinator: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """``jax.distributed.initialize`` for a run, before any other JAX call,
  and this process's :class:`Watchdog`; returns whether the run spans
  several processes.

  With no argument, initializes only on a cluster JAX detects
  (:func:`cluster_detected`); otherwise all three are needed (the
  coordinator is ``host:port`` of process 0).

  Raises:
    ValueError: some of the three given and not all, or out of range.
  """
  given = [v is not None for v in (coordinator, num_processes, process_id)]
  if not any(given):
    if not cluster_detected():
      return False
    jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT)
  else:
    if not all(given):
      raise ValueError(
          "--distributed.coordinator, --distributed.num_processes and "
          "--distributed.process_id go together: give all three (or none, "
          "on a cluster that jax.distributed detects)")
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(
          f"--distributed.process_id={process_id} must be in 0 .. "
          f"{num_processes - 1} (--distributed.num_processes="
          f"{num_processes})")
    if num_processes == 1:
      return False
    with _service_in_a_child(coordinator, num_processes, process_id):
      jax.distributed.initialize(
          coordinator_address=coordinator, num_processes=num_processes,
          process_id=process_id,
          heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT)
  if jax.process_count() > 1:
    global _watchdog
    _watchdog = Watchdog()
    _watchdog.start()
    # Registered after JAX's own exit handler, so it runs before it.
    atexit.register(_watchdog.stop)
  return jax.process_count() > 1


# The coordination service, in a process of its own: it outlives process
# 0 by LINGER_SECONDS, so that the others' watchdogs, not the runtime's
# abort, end them when process 0 is killed.
LINGER_SECONDS = STALE_SECONDS + GRACE_SECONDS + 10
_SERVE = """
import os, sys, time
from jax._src.lib import _jax
bind, num, heartbeat, parent, linger = sys.argv[1:]
service = _jax.get_distributed_runtime_service(
    bind, int(num), heartbeat_timeout=int(heartbeat))
print("serving", flush=True)
while os.getppid() == int(parent):
  time.sleep(0.2)
time.sleep(float(linger))
"""


class _NoService:
  """What process 0's ``jax.distributed`` holds instead of the service
  that runs in the child (its ``shutdown`` is the child's end)."""

  def shutdown(self):
    pass


@contextlib.contextmanager
def _service_in_a_child(coordinator: str, num_processes: int,
                        process_id: int):
  """For process 0, while ``jax.distributed.initialize`` runs: the
  coordination service started in a child process instead of this one
  (JAX's own is in process 0, and its end would abort the others at once,
  with a stack trace, before any watchdog speaks). Where JAX's internals
  differ from the ones this knows, JAX's own service is kept."""
  try:
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
    lib = jax_distributed._jax  # pylint: disable=protected-access
    start = lib.get_distributed_runtime_service
  except (ImportError, AttributeError):
    start = None
  if process_id != 0 or start is None:
    yield
    return
  child = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-c", _SERVE, "[::]:" + coordinator.rsplit(":", 1)[1],
       str(num_processes), str(HEARTBEAT_TIMEOUT), str(os.getpid()),
       str(LINGER_SECONDS)], stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      start_new_session=True)
  if child.stdout.readline().strip() != b"serving":  # it could not bind
    child.wait()
    raise ValueError(f"--distributed.coordinator={coordinator}: the "
                     "coordination service cannot listen on its port (in "
                     "use?); choose another port")
  child.stdout.close()
  lib.get_distributed_runtime_service = lambda *a, **k: _NoService()
  try:
    yield
  finally:
    lib.get_distributed_runtime_service = start


def _client():
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  return jax_distributed.global_state.client


def announce_stop(reason: str) -> None:
  """Tells the other processes that this one ends, and why (one line);
  their watchdogs end them with it. This process's watchdog stops first:
  the process reports its own end."""
  if _watchdog is None or _watchdog.done.is_set():
    return  # one process, or announced already: the first reason stands
  _watchdog.done.set()
  if count() > 1:
    try:
      _client().key_value_set(f"{_KEY}{index()}", "stopped " + reason,
                              allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except
      pass


class Watchdog(threading.Thread):
  """Ends this process, with one line on stderr and exit code 1, within
  ``STALE_SECONDS`` of another process's end: its heartbeat stops (killed)
  or it announced its stop (:func:`announce_stop`), or the coordinator
  (process 0) is gone. A process that finished its run announces so and
  is not waited for."""

  def __init__(self):
    super().__init__(name="augfl_jax-watchdog", daemon=True)
    self.client, self.me, self.n = _client(), index(), count()
    self.done = threading.Event()

  def run(self):
    beat, seen = 0, {}
    while not self.done.is_set():
      beat += 1
      try:
        self.client.key_value_set(f"{_KEY}{self.me}", f"beat {beat}",
                                  allow_overwrite=True)
        values = dict(self.client.key_value_dir_get(_KEY))
      except Exception:  # pylint: disable=broad-except
        if self.me != 0:
          self.end("process 0 (the coordinator) is gone")
        return
      now = time.monotonic()
      for i in range(self.n):
        value = values.get(f"{_KEY}{i}", "")
        if i == self.me or value in ("", "finished"):
          continue
        if value.startswith("stopped "):
          # An end all processes agreed on (a signal, a non-finite round)
          # ends this one too, in the meantime, with its own message.
          self.done.wait(GRACE_SECONDS)
          self.end(f"process {i} stopped: {value[len('stopped '):]}")
        last = seen.get(i)
        if last is None or last[0] != value:
          seen[i] = (value, now)
        elif now - last[1] > STALE_SECONDS:
          self.end(f"process {i} stopped answering (killed, or its "
                    "machine is gone)")
      self.done.wait(BEAT_SECONDS)

  def stop(self) -> None:
    """Stops watching and waits for the thread to end; at the
    interpreter's exit, before ``jax.distributed``'s shutdown. A thread
    still in a call of the coordinator's client when the interpreter
    finalizes is ended by it mid-call, which aborts the process
    ("FATAL: exception not rethrown", exit -6) after a run that finished."""
    self.done.set()
    self.join(STALE_SECONDS)

  def end(self, why: str) -> None:
    """Ends the process with one line: ``why``, and how the run goes on;
    nothing once the process reports its own end."""
    if self.done.is_set():
      return
    print(f"error: {why}; process {self.me} stops too; {hint}",
          file=sys.stderr, flush=True)
    leave(1)


def leave(code: int) -> None:
  """Ends this process at once with exit ``code`` (``os._exit``: not in
  ``jax.distributed``'s wait for processes that stopped). Process 0 first
  waits a few seconds for the others that still answer to leave: where
  JAX's coordination service runs inside it (on a cluster JAX detects),
  its exit would abort them with a stack trace."""
  sys.stdout.flush()
  sys.stderr.flush()
  if count() > 1:
    try:
      client = _client()
      client.key_value_set(f"{_GONE}{index()}", "1", allow_overwrite=True)
      deadline = time.monotonic() + GRACE_SECONDS + STALE_SECONDS
      before = dict(client.key_value_dir_get(_KEY))
      while index() == 0 and time.monotonic() < deadline:
        time.sleep(2 * BEAT_SECONDS)
        gone = dict(client.key_value_dir_get(_GONE))
        beats = dict(client.key_value_dir_get(_KEY))
        waiting = [k for k, v in beats.items()
                   if k[len(_KEY):] not in {g[len(_GONE):] for g in gone}
                   and v != before.get(k)]
        if not waiting:
          break
        before = beats
    except Exception:  # pylint: disable=broad-except
      pass
  os._exit(code)  # pylint: disable=protected-access


# Errors of a collective whose peer is gone (Gloo on CPU, the runtime's).
_LOST = ("Gloo", "Connection reset", "UNAVAILABLE", "DEADLINE_EXCEEDED")


def ending(message: str) -> str:
  """This process ends on an error, ``message`` (one line), which it
  returns to be printed, after telling the other processes
  (:func:`announce_stop`). When the error is a collective's failure and
  another process is gone, this process's watchdog ends it first, with the
  line that names that process (waiting at most ``STALE_SECONDS``)."""
  if (_watchdog is not None and not _watchdog.done.is_set()
      and any(s in message for s in _LOST)):
    _watchdog.join(STALE_SECONDS + 4 * BEAT_SECONDS)
  announce_stop(message)
  return message


def finished() -> None:
  """Tells the other processes' watchdogs that this one has finished its
  run normally (they do not wait for its heartbeat any more); its own
  watchdog still watches them until the process exits."""
  if count() > 1:
    try:
      _client().key_value_set(f"{_KEY}{index()}", "finished",
                              allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except
      pass
