"""A run compiles its round and its evaluation once, and so does a resumed run.

Counted from jax's own records (``jax_log_compiles``, as optax's
``log_compilations`` / chex's trace counting do):

* traces: ``Finished tracing <name> for jit`` (a jit's Python function run
  again: a changed shape, dtype, tree or static value);
* lowerings: ``Compiling jit(<name>) ...``, logged when a jitted function is
  lowered for a new signature (also for new input shardings or committed
  devices). It comes before the persistent compilation cache is looked up,
  so a cache hit (``tests/conftest.py``'s ``compile_cache``, which this
  module does not use) does not hide it.

The round is ``training.rounds.compiled_round``'s fused program: its Python
function ``finite_round`` (the algorithm's round in the non-finite guard,
``training.guard.keep_finite``) is traced once per structure of the
arguments, and lowered as ``hoisted_finite_round``
(``core.jit.hoisted_jit``); the evaluation is the algorithm's jitted ``evaluate``,
once for each set of clients it scores (the held-out clients and the
test-split clients, which have other shapes).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re

import jax
import pytest

from augfl_jax.core import fields
from augfl_jax import training

_TRACED = re.compile(r"Finished tracing (\S+) for jit ")
_LOWERED = re.compile(r"Compiling jit\(([^)]+)\) ")
ROUND = ("finite_round", "hoisted_finite_round")  # (traced, lowered)
EVALUATE = ("evaluate", "evaluate")


def _config(**changes):
  """A ``RunConfig`` with dotted fields changed."""
  return fields.replace(training.RunConfig(), **changes)


class _Records(logging.Handler):

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@contextlib.contextmanager
def _counting():
  """Yields ``count() -> (traces, lowerings)``, Counters by function name
  of what jax traced and lowered inside the block."""
  handler, logger = _Records(), logging.getLogger("jax")
  old = jax.config.jax_log_compiles
  jax.config.update("jax_log_compiles", True)
  logger.addHandler(handler)

  def count():
    traced, lowered = collections.Counter(), collections.Counter()
    for message in handler.messages:
      for pattern, counter in ((_TRACED, traced), (_LOWERED, lowered)):
        match = pattern.match(message)
        if match:
          counter[match.group(1)] += 1
    return traced, lowered
  try:
    yield count
  finally:
    logger.removeHandler(handler)
    jax.config.update("jax_log_compiles", old)


def _run_counted(config, out, **kwargs):
  with _counting() as count:
    summary = training.run(config, out, log=lambda line: None, **kwargs)
  return summary, *count()


def _evaluations(out):
  with open(os.path.join(out, "metrics.jsonl")) as f:
    return [json.loads(line)["round"] for line in f]


def _test_split_rounds(out):
  with open(os.path.join(out, "metrics.jsonl")) as f:
    return [record["round"] for record in map(json.loads, f)
            if "test_split" in record]


def _assert_once(traced, lowered, what, client_sets=2):
  """The round once; the evaluation once per scored client set."""
  for name, (trace_name, lower_name), times in (
      ("round", ROUND, 1), ("evaluation", EVALUATE, client_sets)):
    assert traced[trace_name] == times, (
        f"{what}: the {name} was traced {traced[trace_name]} times "
        f"(traces: {dict(traced)})")
    assert lowered[lower_name] == times, (
        f"{what}: the {name} was compiled {lowered[lower_name]} times "
        f"(lowerings: {dict(lowered)})")


@pytest.mark.slow
def test_round_and_evaluation_compile_once_per_run_and_resume(tmp_path):
  out = str(tmp_path / "run")
  every_round = {"augfl.lam": 0.0, "eval.test_split_every": 1}
  config = _config(**every_round, rounds=3, eval_every=1)
  assert config.algorithm == "augfl" and config.eval.test_split != "off"
  summary, traced, lowered = _run_counted(config, out, checkpoint_every=1)
  assert summary["rounds"] == 3 and _evaluations(out) == [1, 2, 3]
  assert _test_split_rounds(out) == [1, 2, 3]
  _assert_once(traced, lowered, "a run of 3 rounds, 3 evaluations of the "
               "held-out and of the test-split clients")

  # A resumed run is a new program: compiled once more, then reused.
  summary, traced, lowered = _run_counted(
      _config(**every_round, rounds=6, eval_every=1), out,
      checkpoint_every=1, resume=True)
  assert summary["resumed_from_round"] == 3
  assert _evaluations(out) == [1, 2, 3, 4, 5, 6]
  assert _test_split_rounds(out) == [1, 2, 3, 4, 5, 6]
  _assert_once(traced, lowered, "resumed for rounds 4-6, 3 evaluations of "
               "each client set")
