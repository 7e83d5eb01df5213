"""The plumbing of absl commands: ``experiments/``, ``benchmarks/`` and a
user's own. Nothing here knows a run's configuration (``experiments.cli``
makes the run's flags from ``RunConfig``), and nothing else of the library
imports it: the library itself defines no flags.

* :mod:`.runner`: a command's flags parsed (a flag that cannot be, or an
  argument that is not a flag, is one line on stderr and exit code 2), its
  body's user errors as one line and exit code 2, library logs quiet.
* :mod:`.flag_help`: ``--help`` by section, exit code 0.
* :mod:`.output_files`: an output file, or a figure's, checked before any
  work.
"""

from augfl_jax.commands import flag_help, output_files, runner

__all__ = ["flag_help", "output_files", "runner"]
