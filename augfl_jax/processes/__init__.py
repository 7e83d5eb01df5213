"""A run across processes or hosts (``jax.distributed``): the processes of
one program, how they start and end together, and where the run's arrays
live among them. Nothing here knows a method or a run's configuration;
``training`` runs on it, and in one process every function is the
identity, or nothing.

Modules, each named for what it holds:

* :mod:`.placement`: where the clients and the state live (the client
  axis sharded over every process's devices), who writes (process 0), and
  the collectives the processes decide with (``agree``, ``gather``,
  ``sync``, ``to_host``); its functions are this package's face
  (``processes.is_writer()``, ``processes.place_clients(...)``).
* :mod:`.group`: the processes start together and end together:
  ``jax.distributed.initialize`` with the coordination service in a child
  of process 0, the watchdog, the agreement on the run's flags
  (``agree_on``), and the ways a process ends (``ending``, ``leave``,
  ``finished``).
* :mod:`.gate`: the coordinator's gate, which admits only the run's
  processes and names those awaited (standard library only: process 0's
  child loads it by its path).
* :mod:`.jax_internals`: every private JAX name the package uses, and the
  check that the installed JAX has each as expected (``problems``).
* :mod:`.signals`: ``StopSignals``, SIGINT and SIGTERM taken between steps;
  the watchdog counts the signals taken.
* :mod:`.local`: N processes of the run command on this machine, each with
  CPU devices of its own (``experiments.local_processes``,
  ``benchmarks.processes`` and the tests).
"""

from augfl_jax.processes import (gate, group, jax_internals, local,
                                 placement, signals)
from augfl_jax.processes.placement import (agree, count, describe, gather,
                                           index, is_writer, place_clients,
                                           place_state, run_strategy, start,
                                           sync, to_host)

__all__ = [
    "agree", "count", "describe", "gate", "gather", "group", "index",
    "is_writer", "jax_internals", "local", "place_clients", "place_state", "placement",
    "run_strategy", "signals", "start", "sync", "to_host"
]
