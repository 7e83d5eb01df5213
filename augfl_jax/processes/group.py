"""The processes of a run across processes or hosts start together and end
together.

:func:`initialize` is ``jax.distributed.initialize`` for a run (before any
other JAX call; from ``experiments.run``'s ``--distributed.*`` flags, or on
a cluster JAX detects), with the coordination service in a child process
of process 0, behind a gate that admits only the run's processes and names
those awaited (:mod:`.gate`), and a :class:`Watchdog` in every
process. :func:`agree_on` compares what every process was given (the
run's flags, its data) before the run starts. The watchdog keeps a
heartbeat per process in the coordinator's key-value store; a process that
stops (killed, or ended by an error: :func:`ending`, :func:`announce_stop`)
ends the others within ``STALE_SECONDS`` with one line naming it and how
the run goes on (:data:`hint`), instead of a hang in the next collective
or the runtime's abort with a stack trace; it also ends the process on a
signal that the main thread, stuck in a call, cannot take
(:meth:`Watchdog.watch_signals`). :func:`leave` ends a process at once;
:func:`finished` says that it finished its run.

What the processes compute together (who writes, where the clients live,
the decisions they agree on) is :mod:`augfl_jax.processes.placement`; the
private JAX names used here are :mod:`augfl_jax.processes.jax_internals`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator

import jax

from augfl_jax.processes import gate, jax_internals
from augfl_jax.processes.placement import count, index
from augfl_jax.processes.signals import StopSignals

__all__ = [
    "agree_on", "announce_stop", "differences",
    "ending", "finished", "hint", "initialize", "leave", "STALE_SECONDS",
    "STARTUP_TIMEOUT", "STUCK_SECONDS", "Watchdog"
]

# A peer whose heartbeat is older than this is taken to be gone.
STALE_SECONDS = 10.0
BEAT_SECONDS = 0.5
GRACE_SECONDS = 3.0
# The runtime's own detection, a backstop behind the watchdog's.
HEARTBEAT_TIMEOUT = 30
# How long a process waits for the others to start (--distributed.startup_timeout).
STARTUP_TIMEOUT = 60.0
# A signal not taken within this ends the process (Watchdog.watch_signals).
STUCK_SECONDS = 30.0
_KEY = "augfl_jax/process/"
_GONE = "augfl_jax/gone/"
_watchdog = None  # this process's, once initialize() started it
# The end of the watchdog's line: how the run goes on (a command sets its
# own, e.g. the command that resumes it).
hint = "the newest checkpoint is where --resume continues"


def initialize(coordinator: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None,
               startup_timeout: float = STARTUP_TIMEOUT,
               service_port: int = 0) -> bool:
  """``jax.distributed.initialize`` for a run, before any other JAX call,
  and this process's :class:`Watchdog`; returns whether the run spans
  several processes.

  With no argument, ``jax.distributed.initialize()`` configures the run
  where JAX detects a cluster (Slurm with several tasks, Open MPI, a Cloud
  TPU pod, ...), and the process runs alone where JAX says it detects none
  (its :data:`jax_internals.NO_CLUSTER` error; any other error is
  raised; where this process used JAX before, it runs as it is);
  otherwise all three are needed (the
  coordinator is ``host:port`` of process 0), and the process first joins
  the run at the coordinator's gate (:mod:`.gate`: a process id
  taken already is refused; while processes are missing each waiting one
  names them, for at most ``startup_timeout`` seconds). JAX's coordination
  service listens behind the gate on ``service_port`` of process 0's host
  (0: a port the system picks), which every process must reach too.

  Raises:
    ValueError: some of the three given and not all, or out of range; a
      process refused at the gate or not joined in time
      (``gate.StartupError``); process 0's coordination service did not
      start (the line says why: its port taken, or its process's error).
  """
  if startup_timeout <= 0:
    raise ValueError("--distributed.startup_timeout must be > 0 seconds, "
                     f"got {startup_timeout:g}")
  given = [v is not None for v in (coordinator, num_processes, process_id)]
  if not any(given):
    # Where JAX ran in this process before the command (a test, a
    # notebook), it is too late to join a cluster: the process runs as it is.
    if not jax_internals.backends_started():
      try:
        jax.distributed.initialize(
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT,
            initialization_timeout=max(1, int(startup_timeout)))
      except ValueError as e:
        if str(e) != jax_internals.NO_CLUSTER:
          raise
        return False
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
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f"--distributed.coordinator={coordinator} is not "
                       "host:port (e.g. host0:1234)")
    start = time.monotonic()
    with _service_in_a_child(coordinator, num_processes, process_id,
                             service_port) as gated:
      if gated:  # JAX's client connects to the service behind the gate
        coordinator = f"{host}:" + str(gate.join(
            host, int(port), process_id, num_processes, startup_timeout,
            lambda line: print(line, file=sys.stderr, flush=True)))
      jax.distributed.initialize(
          coordinator_address=coordinator, num_processes=num_processes,
          process_id=process_id, heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT,
          initialization_timeout=max(
              10, int(startup_timeout - (time.monotonic() - start))))
  if jax.process_count() > 1:
    global _watchdog
    _watchdog = Watchdog()
    _watchdog.watch_signals()
    _watchdog.start()
    # Registered after JAX's own exit handler, so it runs before it.
    atexit.register(_watchdog.stop)
  return jax.process_count() > 1


# The coordination service, in a process of its own: it outlives process
# 0 by LINGER_SECONDS, so that the others' watchdogs, not the runtime's
# abort, end them when process 0 is killed. The child loads gate and
# jax_internals by their paths: the package's imports would take seconds.
LINGER_SECONDS = STALE_SECONDS + GRACE_SECONDS + 10
_SERVE = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name="
          "'augfl_jax_gate')['serve'](runpy.run_path(sys.argv[2], run_name="
          "'augfl_jax_internals')['start_service'], *sys.argv[3:])")


def _service_command(port: int | str, num_processes: int,
                     service_port: int = 0, parent: int | None = None,
                     linger: float = LINGER_SECONDS) -> list[str]:
  """The command line of process 0's child: the gate on ``port`` and JAX's
  coordination service behind it on ``service_port`` (0: one the system
  picks), both until ``linger`` seconds after the process ``parent`` (this
  one) is gone (:func:`gate.serve`)."""
  return [sys.executable, "-c", _SERVE, gate.__file__,
          jax_internals.__file__, str(port), str(num_processes),
          str(HEARTBEAT_TIMEOUT), str(os.getpid() if parent is None
                                      else parent), f"{linger:g}",
          str(service_port)]


class _NoService:
  """What process 0's ``jax.distributed`` holds instead of the service
  that runs in the child (its ``shutdown`` is the child's end)."""

  def shutdown(self):
    pass


def _last_line(text: bytes) -> str:
  """The last line of ``text`` that is not blank (``""`` where none is)."""
  lines = [line.strip() for line in text.decode(errors="replace")
           .splitlines() if line.strip()]
  return lines[-1] if lines else ""


def _why_no_service(said: str, code: int, errors: bytes,
                    service_port: int) -> str:
  """Why process 0's child serves nothing, in words: ``said`` is its first
  line (:func:`gate.serve`), ``code`` its exit code and ``errors`` its
  stderr."""
  if said == "in use":
    return (f"its port is in use (by another run's coordinator, or by a "
            f"run's that ended less than {LINGER_SECONDS:g} s ago); choose "
            "another port, or wait")
  if said == "service port in use":
    return (f"the coordination service could not start: --distributed."
            f"service_port={service_port} is in use; choose another, or 0 "
            "for one the system picks")
  if said.startswith("no service: "):
    return ("the coordination service could not start: " +
            said[len("no service: "):])
  ended = (f"was killed by {signal.Signals(-code).name}" if code < 0
           else f"ended with exit code {code}")
  last = _last_line(errors)
  return (f"the coordination service's process {ended} before it served" +
          (f": {last}" if last else " (it printed no error)"))


@contextlib.contextmanager
def _service_in_a_child(coordinator: str, num_processes: int,
                        process_id: int, service_port: int = 0
                       ) -> Iterator[bool]:
  """While ``jax.distributed.initialize`` runs: for process 0, the
  coordination service and its gate started in a child process
  (:func:`gate.serve`) instead of JAX's service in this one (whose end
  would abort the others at once, with a stack trace, before any watchdog
  speaks). Yields whether the run has a gate: where JAX's internals differ
  from the ones this knows (:mod:`.jax_internals`), it has none and JAX's
  own service is kept (on the coordinator's port).

  Raises:
    ValueError: the child serves nothing (one line: its port is taken, or
      the child's own error, with its exit code).
  """
  with jax_internals.service_replaced(lambda *a, **k: _NoService()) as gated:
    if process_id != 0 or not gated:
      yield gated
      return
    with tempfile.TemporaryFile() as errors:  # the child's stderr
      child = subprocess.Popen(  # pylint: disable=consider-using-with
          _service_command(coordinator.rsplit(":", 1)[1], num_processes,
                           service_port),
          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
          start_new_session=True)
      said = child.stdout.readline().decode(errors="replace").strip()
      child.stdout.close()
      if not said.startswith("serving "):
        if child.poll() is None and not said.startswith(("in use",
                                                         "service port",
                                                         "no service")):
          child.kill()
        code = child.wait()
        errors.seek(0)
        raise ValueError(
            f"--distributed.coordinator={coordinator}: " +
            _why_no_service(said, code, errors.read(), service_port))
    yield True


def announce_stop(reason: str) -> None:
  """Tells the other processes that this one ends, and why (one line);
  their watchdogs end them with it. This process's watchdog stops first:
  the process reports its own end."""
  if _watchdog is None or _watchdog.done.is_set():
    return  # one process, or announced already: the first reason stands
  _watchdog.done.set()
  if count() > 1:
    try:
      jax_internals.client().key_value_set(
          f"{_KEY}{index()}", "stopped " + reason, allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except
      pass


_AGREE = "augfl_jax/agree/"
_agreements = 0  # how many agree_on calls this process made


def differences(records: list[dict[str, str]]) -> list[str]:
  """``"--rounds: 3 on process 0, 5 on process 1"`` for each entry whose
  value is not the same in every record (``records[i]``: process
  ``i``'s), in the order of the entries."""
  out = []
  for name in dict.fromkeys(k for r in records for k in r):
    by_value = {}
    for i, record in enumerate(records):
      by_value.setdefault(record.get(name, "(absent)"), []).append(str(i))
    if len(by_value) > 1:
      out.append(f"{name}: " + ", ".join(
          f"{value} on process {ids[0]}" if len(ids) == 1 else
          f"{value} on processes {', '.join(ids[:-1])} and {ids[-1]}"
          for value, ids in by_value.items()))
  return out


def agree_on(what: str, record: dict[str, str]) -> list[str]:
  """Every process's ``record`` of ``what`` (e.g. the run's flags, its
  data's digests) against the others': :func:`differences`, the same list
  in every process (empty where they agree; always in one process). Every
  process calls it, in the same order; each waits, in the coordinator's
  key-value store, until all have given theirs (a process that stops
  meanwhile stops it through its watchdog)."""
  global _agreements
  if count() == 1:
    return []
  _agreements += 1
  prefix = f"{_AGREE}{_agreements}/{what}/"
  client = jax_internals.client()
  client.key_value_set(f"{prefix}{index()}", json.dumps(record))
  while True:
    given = dict(client.key_value_dir_get(prefix))
    if len(given) >= count():
      break
    time.sleep(0.1)
  return differences([json.loads(given[f"{prefix}{i}"])
                      for i in range(count())])


class Watchdog(threading.Thread):
  """Ends this process, with one line on stderr and exit code 1 (128 + the
  signal where this process received SIGINT or SIGTERM), within
  ``STALE_SECONDS`` of another process's end: its heartbeat stops (killed)
  or it announced its stop (:func:`announce_stop`), or the coordinator
  (process 0) is gone. A process that finished its run announces so and
  is not waited for. It also ends this process on a signal that its main
  thread cannot take (:meth:`watch_signals`)."""

  def __init__(self):
    super().__init__(name="augfl_jax-watchdog", daemon=True)
    self.client, self.me, self.n = jax_internals.client(), index(), count()
    self.done = threading.Event()
    self.signals, self.taken_before = None, 0
    self.arrived: list[tuple[int, float]] = []  # (signal, when) received

  def watch_signals(self) -> None:
    """From the main thread: SIGINT and SIGTERM reach this watchdog too
    (``signal.set_wakeup_fd``), even while the main thread is inside one
    call, where its handler cannot run. A signal that the process has not
    taken (``StopSignals``) within ``STUCK_SECONDS`` (the main thread waits
    in a collective that another process never joins, or in one long
    computation), or a second one not taken, ends the process with one
    line, the exit code of the signal and :data:`hint`. Nothing is done
    where the wakeup descriptor is someone else's already."""
    if threading.current_thread() is not threading.main_thread():
      return
    read, write = os.pipe()
    for fd in (read, write):
      os.set_blocking(fd, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous != -1:
      signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
      os.close(read)
      os.close(write)
      return
    self.signals, self.taken_before = read, StopSignals.taken

  def _check_signals(self, now: float, at_once: bool = False) -> None:
    """Ends the process on a signal that its main thread has not taken
    (:meth:`watch_signals`); ``at_once``: without waiting for
    ``STUCK_SECONDS`` (another process stopped: this one stops now, on its
    own signal rather than on the other's stop)."""
    try:
      received = os.read(self.signals, 256) if self.signals else b""
    except BlockingIOError:
      received = b""
    self.arrived += [(s, now) for s in received
                     if s in (signal.SIGINT, signal.SIGTERM)]
    untaken = len(self.arrived) - (StopSignals.taken - self.taken_before)
    if untaken <= 0:
      return
    signum, since = self.arrived[-untaken]  # the oldest one not taken
    name = signal.Signals(signum).name
    if untaken > 1:
      line = (f"interrupted at once (a second signal, {name}): process "
              f"{self.me} stops without saving")
    elif at_once or now - since > STUCK_SECONDS:
      line = (f"interrupted: {name}, which process {self.me} has not taken "
              f"within {STUCK_SECONDS:g} s (it waits in a collective that "
              "another process does not join, or in one long computation):"
              " it stops now, without saving")
    else:
      return
    announce_stop(f"interrupted ({name})")
    print(f"{line}; {hint}", file=sys.stderr, flush=True)
    leave(128 + signum)

  def run(self):
    beat, seen = 0, {}
    while not self.done.is_set():
      beat += 1
      self._check_signals(time.monotonic())
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
          # ends this one too, in the meantime, with its own message; a
          # signal this process received, its main thread took it or not,
          # gives the exit code.
          self.done.wait(GRACE_SECONDS)
          self._check_signals(time.monotonic(), at_once=True)
          self.end(f"process {i} stopped: {value[len('stopped '):]}",
                   128 + self.arrived[-1][0] if self.arrived else 1)
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

  def end(self, why: str, code: int = 1) -> None:
    """Ends the process with one line, ``why`` and how the run goes on, and
    exit ``code``; nothing once the process reports its own end."""
    if self.done.is_set():
      return
    print(f"error: {why}; process {self.me} stops too; {hint}",
          file=sys.stderr, flush=True)
    leave(code)


_leaving = threading.Event()  # leave() was called


def leave(code: int) -> None:
  """Ends this process at once with exit ``code`` (``os._exit``: not in
  ``jax.distributed``'s wait for processes that stopped). Process 0 first
  waits a few seconds for the others that still answer to leave: where
  JAX's coordination service runs inside it (on a cluster JAX detects),
  its exit would abort them with a stack trace. A second call, from
  another thread, waits for the first one's end (its code stands)."""
  if _leaving.is_set():
    threading.Event().wait()
  _leaving.set()
  sys.stdout.flush()
  sys.stderr.flush()
  if count() > 1:
    try:
      client = jax_internals.client()
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
  line that names that process (waiting at most ``STALE_SECONDS``). A
  process that its watchdog ends already (a signal it could not take, a
  process gone) says nothing more: this waits for that end."""
  if _leaving.is_set():
    threading.Event().wait()
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
      jax_internals.client().key_value_set(
          f"{_KEY}{index()}", "finished", allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except
      pass
