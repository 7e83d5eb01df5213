"""The coordinator's gate: a run across processes admits only its own
processes, and says whom it waits for.

Process 0's child (``group``) listens on the port of
``--distributed.coordinator`` with :class:`Gate`, and runs JAX's
coordination service on a second port that the system picks. Every
process of the run first joins at the gate (:func:`join`): it gives its
``--distributed.process_id`` and ``--distributed.num_processes`` and
learns the service's port once every process has joined. A process id
that another process holds already (a second command with the same id,
or another run's process on this coordinator) or another number of
processes is refused in one line at the gate, before it reaches the
service, whose processes it would otherwise abort (a task that registers
twice fails the whole service). While processes are missing, each one
that waits names them every :data:`REPORT_SECONDS`, and gives up after
its ``--distributed.startup_timeout``.

Only the standard library is imported here: process 0's child loads this
file by its path, without the package (see ``group``), and gives
:func:`serve` the function that starts JAX's service
(``jax_internals.start_service``).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable

__all__ = ["Gate", "join", "REPORT_SECONDS", "StartupError", "serve"]

# How often a process that waits for others names them.
REPORT_SECONDS = 10.0
FIRST_REPORT_SECONDS = 5.0
POLL_SECONDS = 0.3
# A connection to the gate that says nothing within this is dropped.
TALK_SECONDS = 2.0


class StartupError(ValueError):
  """A process cannot join the run: refused at the gate, or the others did
  not join in time (one line, with the remedy)."""


def _listen(port: int) -> socket.socket:
  """A socket listening on ``port`` of every address (IPv6 and IPv4 where
  the system has both, as the coordination service's ``[::]``)."""
  if socket.has_dualstack_ipv6():
    return socket.create_server(("", port), family=socket.AF_INET6,
                                dualstack_ipv6=True)
  return socket.create_server(("", port))


class Gate:
  """Admits the processes of one run of ``num_processes`` (process 0's
  child runs it in a thread, :meth:`serve_forever`).

  Each request is one JSON line, answered by one JSON line:
  ``{"join": i, "of": n, "nonce": s}`` holds process id ``i`` for the
  process that made up the nonce ``s`` (asking again with it is asking
  whom the run still waits for), and is answered ``{"port": service_port,
  "missing": [ids not joined yet]}``, ``{"taken": i}`` (another process
  holds ``i``) or ``{"processes": num_processes}`` (``n`` differs).
  """

  def __init__(self, listener: socket.socket, num_processes: int,
               service_port: int):
    self.listener, self.num_processes = listener, num_processes
    self.service_port = service_port
    self.holders: dict[int, str] = {}  # process id -> nonce

  def answer(self, request: dict) -> dict:
    """The answer to one request (see the class docstring); ``{}`` to a
    request it does not understand."""
    try:
      i, n, nonce = (int(request["join"]), int(request["of"]),
                     str(request["nonce"]))
    except (KeyError, TypeError, ValueError):
      return {}
    if n != self.num_processes or not 0 <= i < n:
      return {"processes": self.num_processes}
    if self.holders.setdefault(i, nonce) != nonce:
      return {"taken": i}
    return {"port": self.service_port,
            "missing": [j for j in range(n) if j not in self.holders]}

  def serve_forever(self) -> None:
    """Answers requests one at a time (an answer is immediate; a client
    that says nothing is dropped after ``TALK_SECONDS``)."""
    while True:
      connection, _ = self.listener.accept()
      with connection:
        connection.settimeout(TALK_SECONDS)
        try:
          line = connection.makefile("rb").readline(65536)
          try:
            request = json.loads(line)
          except ValueError:
            request = None
          answer = self.answer(request) if isinstance(request, dict) else {}
          connection.sendall(json.dumps(answer).encode() + b"\n")
        except OSError:
          pass


def _ask(host: str, port: int, request: dict) -> dict | None:
  """The gate's answer, or ``None`` when nothing listens there (yet).

  Raises:
    StartupError: something else than a gate answers there.
  """
  try:
    with socket.create_connection((host.strip("[]"), port),  # [::1]
                                  timeout=TALK_SECONDS) as s:
      s.sendall(json.dumps(request).encode() + b"\n")
      line = s.makefile("rb").readline(65536)
  except OSError:
    return None
  try:
    answer = json.loads(line)
  except ValueError:
    answer = None
  if not isinstance(answer, dict) or not answer.keys() & {
      "port", "taken", "processes"}:
    raise StartupError(
        f"--distributed.coordinator={host}:{port}: something other than "
        "the coordinator of a run across processes answers there; choose "
        "another port")
  return answer


def _processes(ids: list[int], n: int) -> str:
  """``"process 1 of 2"``, ``"process 0 (the coordinator) and process 2
  of 3"``."""
  names = [f"process {i}" + (" (the coordinator)" if i == 0 else "")
           for i in ids]
  return (", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1
          else names[0]) + f" of {n}"


def _refusal(answer: dict, address: str, process_id: int,
             num_processes: int) -> str | None:
  """The line that refuses this process (``answer``: the gate's), or
  ``None`` when it is admitted."""
  another = ("give each process of a run its own --distributed.process_id,"
             " and another run another --distributed.coordinator port")
  if "taken" in answer:
    return (f"--distributed.process_id={process_id}: process {process_id} "
            f"of the run at {address} has joined already (this is a second "
            "command with its process id, or another run's process on its "
            f"coordinator); {another}")
  if "processes" in answer:
    return (f"--distributed.num_processes={num_processes}: the run at "
            f"{address} has {answer['processes']} processes; give every "
            "process of a run the same --distributed.num_processes, and "
            "another run another --distributed.coordinator port")
  return None


def join(host: str, port: int, process_id: int, num_processes: int,
         timeout: float, say: Callable[[str], None]) -> int:
  """Joins the run at the gate ``host:port`` as ``process_id`` and waits
  until every process has joined; returns the coordination service's port.
  ``say`` receives the lines that name the processes awaited.

  Raises:
    StartupError: refused at the gate, or the processes awaited did not
      join within ``timeout`` seconds.
  """
  address = f"{host}:{port}"
  request = {"join": process_id, "of": num_processes,
             "nonce": secrets.token_hex(8)}
  start = time.monotonic()
  next_report = start + FIRST_REPORT_SECONDS
  while True:
    answer = _ask(host, port, request)
    if answer is not None:
      refusal = _refusal(answer, address, process_id, num_processes)
      if refusal:
        raise StartupError(refusal)
      if not answer["missing"]:
        return int(answer["port"])
    missing = [0] if answer is None else answer["missing"]
    now = time.monotonic()
    if now - start >= timeout:
      how = ("start it on the host of --distributed.coordinator (the same "
             "command with --distributed.process_id=0), or correct that flag"
             if missing == [0] else "start every process of the run (the "
             "same command, each with its own --distributed.process_id)")
      raise StartupError(
          f"{_processes(missing, num_processes)} did not join the run at "
          f"{address} within --distributed.startup_timeout={timeout:g} s: "
          f"{how}, or give a larger --distributed.startup_timeout")
    if now >= next_report:
      say(f"process {process_id}: waiting for "
          f"{_processes(missing, num_processes)} at {address} "
          f"({now - start:.0f} s of --distributed.startup_timeout="
          f"{timeout:g}) ...")
      next_report = now + REPORT_SECONDS
    time.sleep(POLL_SECONDS)


def serve(start_service: Callable[[str, int, int], Any], port: str,
          num_processes: str, heartbeat: str, parent: str, linger: str,
          service_port: str = "0") -> None:
  """Process 0's child: the gate on ``port``, JAX's coordination service
  (``start_service(address, num_processes, heartbeat)``:
  ``jax_internals.start_service``) on ``service_port`` (``"0"``: a port
  the system picks), both kept until ``linger`` seconds after the process
  ``parent`` is gone (at once when no other process joined: none needs the
  service to hear of its end). Prints one line once both listen,
  ``serving <service port>``, or why not: ``in use`` (the gate's port is
  taken), ``service port in use`` (the ``service_port`` given is taken),
  ``no service: <the error's first line>``."""
  try:
    listener = _listen(int(port))
  except OSError:
    print("in use", flush=True)
    return
  fixed, error = int(service_port), None
  for _ in range(1 if fixed else 5):
    if fixed:
      try:
        _listen(fixed).close()
      except OSError:
        print("service port in use", flush=True)
        return
      service_port = fixed
    else:
      with _listen(0) as probe:  # a port nothing listens on now
        service_port = probe.getsockname()[1]
    try:
      service = start_service(  # pylint: disable=unused-variable
          f"[::]:{service_port}", int(num_processes), int(heartbeat))
      break
    except Exception as e:  # pylint: disable=broad-except
      error = e  # another process took the port meanwhile, or worse
  else:
    print("no service: " + (f"{type(error).__name__}: {error}".strip()
                            .splitlines()[0]), flush=True)
    return
  gate = Gate(listener, int(num_processes), service_port)
  threading.Thread(target=gate.serve_forever, daemon=True).start()
  print(f"serving {service_port}", flush=True)
  while os.getppid() == int(parent):
    time.sleep(0.2)
  if len(gate.holders) > 1:
    time.sleep(float(linger))
