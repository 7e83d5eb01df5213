"""Every private JAX name that augfl_jax uses, in one place, with the check
that the installed JAX still has each as this code expects
(:func:`problems`; ``tests/test_jax_internals.py`` asserts it finds none, so
that a JAX upgrade that moves one fails that test, not a run across
processes). Checked on jax 0.10.2 and jaxlib 0.10.2 (CPU), the versions
setup.cfg admits from.

The internals, and what each is for:

* ``jax._src.lib._jax.get_distributed_runtime_service(address, num_nodes,
  heartbeat_timeout=...)`` starts JAX's coordination service: process 0's
  child starts it behind the coordinator's gate (:func:`start_service`,
  called by ``gate.serve``).
* ``jax._src.distributed._jax`` is that module as ``jax.distributed``
  sees it: ``State.initialize`` looks ``get_distributed_runtime_service``
  up on it when it runs, so replacing it there while process 0 runs
  ``jax.distributed.initialize`` keeps the service out of process 0, in
  the child (:func:`service_replaced`; the service's end with process 0
  would abort the other processes before their watchdogs speak).
* ``jax._src.distributed.global_state.client`` is this process's client of
  the coordination service once ``jax.distributed.initialize`` ran, a
  ``DistributedRuntimeClient`` whose ``key_value_set(key, value,
  allow_overwrite)``, ``key_value_dir_get(key)`` and
  ``blocking_key_value_get(key, timeout_in_ms)`` carry the watchdog's
  heartbeats and ``agree_on``'s records (:func:`client`).
* ``jax._src.xla_bridge.backends_are_initialized()`` says whether this
  process has used JAX already (a notebook, a test, a program that calls
  a command's ``main``): ``jax.distributed.initialize`` then raises, so
  cluster detection is skipped and the process runs as it is
  (:func:`backends_started`).

Public, and checked here too because the code depends on them exactly:
``jax.distributed.initialize``'s ``heartbeat_timeout_seconds`` and
``initialization_timeout`` (jax 0.6.0 has no ``heartbeat_timeout_seconds``),
and the error it raises when no argument is given and JAX detects no
cluster, :data:`NO_CLUSTER` (how ``group.initialize`` tells a one-process
run from a cluster's, by JAX's own detection).

Only the standard library is imported at the top: process 0's child loads
this file by its path, without the package, as it loads ``gate``.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any, Callable, Iterator

__all__ = ["NO_CLUSTER", "backends_started", "client", "problems",
           "service_replaced", "start_service"]

# jax.distributed.initialize()'s ValueError where no argument is given and
# JAX detects no cluster (State.initialize: its coordinator_address is None).
NO_CLUSTER = "coordinator_address should be defined."


def start_service(address: str, num_processes: int,
                  heartbeat_timeout: int) -> Any:
  """JAX's coordination service for ``num_processes`` processes, listening
  on ``address`` (``"[::]:port"``); it serves until the object is dropped
  or shut down."""
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  return _jax.get_distributed_runtime_service(
      address, num_processes, heartbeat_timeout=heartbeat_timeout)


@contextlib.contextmanager
def service_replaced(replacement: Callable[..., Any]) -> Iterator[bool]:
  """While the block runs, ``jax.distributed.initialize`` calls
  ``replacement`` (with the service's arguments) instead of starting the
  coordination service in this process. Yields whether it could: ``False``
  where this JAX has no ``jax._src.distributed._jax`` (then JAX starts its
  own service as usual)."""
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    runtime = distributed._jax  # pylint: disable=protected-access
    start = runtime.get_distributed_runtime_service
  except (ImportError, AttributeError):
    yield False
    return
  runtime.get_distributed_runtime_service = replacement
  try:
    yield True
  finally:
    runtime.get_distributed_runtime_service = start


def client() -> Any:
  """This process's client of the coordination service (``None`` before
  ``jax.distributed.initialize``)."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def backends_started() -> bool:
  """Whether this process has started JAX's backends (after which
  ``jax.distributed.initialize`` can no longer be called)."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  return xla_bridge.backends_are_initialized()


def _parameters(function: Any) -> list[str]:
  """The names of ``function``'s parameters: from ``inspect.signature``, or
  for a compiled function (nanobind's, which has none) from the signature
  on the first line of its docstring."""
  try:
    return list(inspect.signature(function).parameters)
  except (TypeError, ValueError):
    head = (getattr(function, "__doc__", None) or "").split("\n", 1)[0]
    arguments = head.partition("(")[2].rpartition(")")[0]
    return re.findall(r"(?:^|,\s*)(\w+)(?=\s*[:=,]|\s*$)", arguments)


def _expects(what: str, function: Any, names: list[str]) -> list[str]:
  """``[]`` where ``function``'s parameters start with ``names`` (those the
  code passes), else the sentence that says what differs."""
  found = _parameters(function)
  if found[:len(names)] == names:
    return []
  return [f"{what} takes ({', '.join(found)}), not ({', '.join(names)}, "
          "...)"]


def problems() -> list[str]:
  """Each internal above that the installed JAX lacks or has otherwise, in
  one sentence; ``[]`` where every one is as this module uses it."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return [f"jax {jax.__version__}: {e}"]
  found = []
  if getattr(distributed, "_jax", None) is not _jax:
    found.append("jax._src.distributed._jax is not jax._src.lib._jax")
  initialize = getattr(getattr(distributed, "State", None), "initialize",
                       None)
  source = inspect.getsource(initialize) if initialize else ""
  if "_jax.get_distributed_runtime_service(" not in source:
    found.append("jax._src.distributed.State.initialize does not call "
                 "_jax.get_distributed_runtime_service(...)")
  if f"ValueError('{NO_CLUSTER}')" not in source:
    found.append("jax._src.distributed.State.initialize does not raise "
                 f"ValueError({NO_CLUSTER!r})")
  service = getattr(_jax, "get_distributed_runtime_service", None)
  if service is None:
    found.append("jax._src.lib._jax has no get_distributed_runtime_service")
  else:
    found += _expects("get_distributed_runtime_service", service,
                      ["address", "num_nodes"])
    if "heartbeat_timeout" not in _parameters(service):
      found.append("get_distributed_runtime_service takes no "
                   "heartbeat_timeout")
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    started = xla_bridge.backends_are_initialized
  except (ImportError, AttributeError):
    started = None
  if not callable(started) or _parameters(started):
    found.append("jax._src.xla_bridge has no backends_are_initialized()")
  if not hasattr(getattr(distributed, "global_state", None), "client"):
    found.append("jax._src.distributed.global_state has no client")
  runtime_client = getattr(_jax, "DistributedRuntimeClient", None)
  for method, names in (("key_value_set", ["self", "key", "value",
                                           "allow_overwrite"]),
                        ("key_value_dir_get", ["self", "key"]),
                        ("blocking_key_value_get", ["self", "key",
                                                    "timeout_in_ms"])):
    if not hasattr(runtime_client, method):
      found.append(f"DistributedRuntimeClient has no {method}")
    else:
      found += _expects(f"DistributedRuntimeClient.{method}",
                        getattr(runtime_client, method), names)
  public = _parameters(jax.distributed.initialize)
  for name in ("heartbeat_timeout_seconds", "initialization_timeout"):
    if name not in public:
      found.append(f"jax.distributed.initialize takes no {name}")
  return found
