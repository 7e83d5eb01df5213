r"""Runs one federated experiment (``augfl_jax.training.run``).

  python -m experiments.run                          # AugFL w/ PM on digits
  python -m experiments.run --dataset=fashion_mnist  # Debian's IDX files
  python -m experiments.run --dataset=emnist --data.data_dir=~/emnist/gzip
  python -m experiments.run --algorithm=fedavg --fedavg.lr=0.05 --rounds=100
  python -m experiments.run --flagfile=experiments/configs/fashion_mnist.flags
  python -m experiments.run --rounds=500 --resume    # continue a run further

Every flag but the run-control ones (``--output_dir``,
``--checkpoint_every``, ``--resume``, ``--overwrite``,
``--compilation_cache[_dir]``) is a field of
``augfl_jax.training.RunConfig``, named by its dotted path. Outputs go to
``--output_dir`` (default ``runs/<dataset>_<algorithm>_seed<seed>``).
Ctrl-C (SIGINT) or SIGTERM finishes the current round, saves a checkpoint
and exits with 128 + the signal's number, printing the command that resumes
the run.
"""

from __future__ import annotations

import shlex
import sys

from absl import app
from absl import flags

from augfl_jax import training
from experiments import flags as run_flags

FLAGS = run_flags.FLAGS
run_flags.define_config_flags()
run_flags.define_run_control_flags()
flags.adopt_module_key_flags(run_flags)  # --help lists them


def resume_command(argv: list[str]) -> str:
  """The command line that continues this run: the same flags with
  ``--resume`` instead of ``--overwrite``."""
  drop = ("--resume", "--noresume", "--overwrite", "--nooverwrite")
  args = [a for a in argv[1:] if a.split("=")[0] not in drop]
  return " ".join(["python -m experiments.run"] +
                  [shlex.quote(a) for a in args] + ["--resume"])


def _log(line: str) -> None:
  print(line, flush=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  run_flags.start_command()

  def body():
    config = training.validate(run_flags.config_from_flags())
    return training.run(
        config, FLAGS.output_dir or run_flags.default_output_dir(config),
        log=_log, checkpoint_every=FLAGS.checkpoint_every,
        resume=FLAGS.resume, overwrite=FLAGS.overwrite)

  try:
    run_flags.run_command(body)
  except training.RunInterrupted as e:
    print(f"interrupted: {e}\nresume with: {resume_command(sys.argv)}",
          file=sys.stderr)
    sys.exit(128 + e.signum)
  except KeyboardInterrupt:
    print("interrupted at once (second signal); resume from the newest "
          f"checkpoint, if any, with: {resume_command(sys.argv)}",
          file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  run_flags.main_runner(main)
