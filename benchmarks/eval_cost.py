r"""What scoring a run costs, against one of its rounds, timed in one process.

  python -m benchmarks.eval_cost --dataset=fashion_mnist \
    --eval.test_clients=1000

Builds a run as ``experiments.run`` would (``--dataset``, ``--algorithm``,
``--model``; AugFL without its PM by default, so that no PM is pretrained)
and times, round-robin, ``--repeats`` times each after a first (compiling)
call: one training round of every training client, the evaluation of the
protocol's held-out clients, and the scoring of ``--eval.test_clients``
test-split clients (``evaluation.score_in_chunks``, as a run does after its
last round). Prints each median in seconds, each as a multiple of the
round, and the load average before and after.
"""

from __future__ import annotations

import json
import os
import statistics

from absl import flags

from augfl_jax.core import evaluation, fields
from augfl_jax import algorithms, data, models, training
from augfl_jax.training import experiment
from benchmarks import command

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_string("dataset", "fashion_mnist", "the run's dataset")
  flags.DEFINE_string("algorithm", "augfl", "the run's algorithm")
  flags.DEFINE_enum("model", None, models.available_models(),
                    "client model (default: the dataset's)")
  flags.DEFINE_integer("eval.test_clients", 1000,
                       "test-split clients scored")
  flags.DEFINE_integer("repeats", 3, "timed calls of each, after the first",
                       lower_bound=1)
  command.check("dataset", data.canonical_name)
  command.check("algorithm", algorithms.spec)
  command.config_rule("eval.test_clients")


def measure(config: training.RunConfig, repeats: int) -> dict:
  """Seconds (median of ``repeats``) of a round, the held-out clients'
  evaluation and the test-split scoring of ``config``'s run."""
  plan = training.prepare(config)
  config = plan.config
  loaded = experiment.load(plan)
  fed = loaded.data
  if fed.test_split is None:
    raise ValueError(f"{config.dataset}: no test split ({fed.test_split_off})")
  built = training.build(plan, loaded)
  algo, state = built.algorithm, built.start()
  work = {
      "round": lambda: algo.round(state, fed.train)[0],
      "heldout": lambda: algo.evaluate(state, fed.test)["accuracy"],
      "test_split": lambda: evaluation.score_in_chunks(
          algo.evaluate, state, fed.test_split.clients)["accuracy"],
  }
  first = {name: command.timed(fn) for name, fn in work.items()}  # compiles
  times = {name: [] for name in work}
  for _ in range(repeats):
    for name, fn in work.items():
      times[name].append(command.timed(fn))
  seconds = {name: statistics.median(t) for name, t in times.items()}
  return {"seconds": seconds, "first_call_seconds": first,
          "per_round": {k: v / seconds["round"] for k, v in seconds.items()},
          "train_clients": fed.train.num_clients,
          "heldout_clients": fed.test.num_clients,
          "test_clients": fed.test_split.num_clients,
          "model": config.model}


def main(argv):
  del argv
  config = fields.replace(
      training.RunConfig(dataset=FLAGS.dataset, algorithm=FLAGS.algorithm,
                         model=FLAGS.model),
      **{"augfl.lam": 0.0,
         "eval.test_clients": FLAGS["eval.test_clients"].value})
  before = os.getloadavg()
  result = measure(config, FLAGS.repeats)
  result["load_average"] = {"before": before, "after": os.getloadavg()}
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  command.run(define_flags, main)
