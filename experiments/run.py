r"""Runs one federated experiment.

  python -m experiments.run                      # AugFL on the embedded digits
  python -m experiments.run --dataset=fashion_mnist   # Debian's IDX files
  python -m experiments.run --dataset=emnist --data_dir=~/emnist/gzip
  python -m experiments.run --algorithm=fedavg --lr=0.05 --rounds=100

  python -m experiments.run --rounds=500 --resume   # continue a run further

Every flag but the run-control ones (``--output_dir``, ``--checkpoint_every``,
``--resume``, ``--overwrite``, ``--compilation_cache[_dir]``) mirrors a field
of ``experiments.runner.RunConfig``. Outputs go to ``--output_dir`` (default
``runs/<dataset>_<algorithm>_seed<seed>``). Ctrl-C (SIGINT) or SIGTERM
finishes the current round, saves a checkpoint and exits with 128 + the
signal's number, printing the command that resumes the run.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys

from absl import app
from absl import flags
from absl import logging
import jax

from augfl_jax import algorithms
from experiments import config as config_lib
from experiments import runner

HELP = {
    # data
    "dataset": "digits, synthetic (embedded; no files); fashion_mnist, "
               "mnist, kmnist, emnist (= emnist/letters, the paper's "
               "EMNIST: 26 classes), emnist/balanced|digits|byclass|bymerge "
               "(IDX files or a tfds prepared copy); cifar10, cifar100 (a "
               "tfds prepared copy)",
    "data_dir": "searched first for the dataset's IDX files (or a tfds "
                "prepared copy); then $AUGFL_JAX_DATA_DIR, the Debian "
                "package's directory (fashion_mnist) and the tfds default "
                "directory",
    "num_clients": "number of clients, 80% train / 20% test (default: per "
                   "dataset)",
    "M": "client sizes are uniform on {M, ..., 2M}",
    "classes_per_client": "classes per client (pathological partition)",
    "server_size": "server split: the first n training examples (default: "
                   "per dataset); synthetic: n examples drawn from its "
                   "clients (default none, 500 for a method with a PM)",
    "partition": "pathological or dirichlet",
    "dirichlet_alpha": "concentration of the Dirichlet label skew",
    # model and training
    "algorithm": "one of " + ", ".join(algorithms.ALGORITHMS),
    "model": "client model: mlp, cnn, logreg, resnet8x4, ... (default: per "
             "dataset)",
    "norm": "normalisation layers: batch (statistics of the batch at hand, "
            "padding masked; the default), group (the default on digits) "
            "or none",
    "conv_impl": "how the convolutions and max-pools of the cnn / resnet "
                 "models (client and PM) run: auto (patches on CPU, xla "
                 "elsewhere), xla (XLA's convolution) or patches (patches "
                 "+ matmul); same parameters, same outputs up to rounding",
    "rounds": "communication rounds",
    "eval_every": "evaluate the test clients every this many rounds",
    "clients_per_round": "clients sampled per round (default: all); AugFL "
                         "aggregates the stale (theta_i, y_i) of the others",
    "seed": "seed of the partition, the initialisation and the run",
    "strategy": "how the client axis runs: auto (the backend's measured "
                "choice: map on CPU, vmap on GPU/TPU), vmap, map, chunked "
                "or sharded",
    "chunk_size": "clients per chunk for --strategy=chunked",
    # algorithm hyper-parameters
    "alpha": "inner / fast-adaptation step size (AugFL, Per-FedAvg, "
             "Per-FedBC, evaluation); default 0.03 (the paper's)",
    "rho": "ADMM penalty rho_i (AugFL; default 0.7)",
    "lam": "weight of the server regulariser R_h (AugFL; default 5.0); 0 is "
           "AugFL w/o PM. FedProto, FedCP, FedOA: their own lambda (default "
           "1, 5, 0.5)",
    "hvp": "Hessian-vector product: finite_difference (the paper's) or exact",
    "uniform_weights": "w_i = 1/N instead of |D_i| / sum_j |D_j| (AugFL)",
    "lr": "client SGD step size (FedAvg, FedBC)",
    "local_epochs": "local epochs E (FedAvg, FedBC)",
    "batch_size": "local minibatch size (FedAvg, Per-FedAvg, FedBC)",
    "beta": "outer step size (Per-FedAvg, Per-FedBC)",
    "local_steps": "local steps tau (Per-FedAvg)",
    "variant": "Per-FedAvg: fo (first order) or hf (Hessian-free)",
    "momentum": "client SGD momentum (FedBC)",
    "lr_lambda": "dual step size of lambda_i (FedBC)",
    "lr_gamma": "step size of the tolerance gamma_i (FedBC)",
    "lambda_max": "upper clip of lambda_i (FedBC)",
    "start_from": "FedBC local training starts from z (public code) or x "
                  "(the paper)",
    "inner_steps": "inner steps J of Per-FedBC",
    # pretrained model and knowledge transfer
    "regularizer": "server regulariser R_h: crd, l2 or none",
    "pm_model": "PM architecture (default: resnet32x4; cnn on digits)",
    "pm_epochs": "PM pretraining epochs when no checkpoint exists (default "
                 "240; 30 on digits)",
    "pm_kwargs": "JSON keyword arguments of the PM model, e.g. "
                 "'{\"hidden\": [512, 256]}'",
    "pm_dir": "PM checkpoint directory (default runs/pm/<dataset>_<model>_"
              "srv<server_size>); reused when it matches, else refused",
    "kt_steps": "CRD minibatches per round (default: one pass over the "
                "server split)",
    "kt_batch_size": "CRD minibatch size (default 128)",
    "kt_loop": "CRD minibatch loop: scan or python (default python on CPU)",
    "nce_k": "CRD negatives per example (default 16384; 1024 on digits)",
    "feat_dim": "CRD embedding dimension (default 128)",
    "ce_weight": "weight of CE(student, server labels) in R_h (default 1.0)",
    "kd_weight": "weight of KD(student, PM) in R_h (default 0)",
    "crd_weight": "weight of CRD in R_h (default 0.8)",
    # evaluation
    "adapt_steps": "fast-adaptation SGD steps on a test client's support set",
}


def _define_flags() -> None:
  for field in dataclasses.fields(config_lib.RunConfig):
    default, kind = field.default, field.type
    if kind == "bool":
      flags.DEFINE_bool(field.name, default, HELP[field.name])
    elif kind in ("int", "int | None"):
      flags.DEFINE_integer(field.name, default, HELP[field.name])
    elif kind in ("float", "float | None"):
      flags.DEFINE_float(field.name, default, HELP[field.name])
    else:
      flags.DEFINE_string(field.name, default, HELP[field.name])
  flags.DEFINE_string("output_dir", None, "where the run writes its files "
                      "(default runs/<dataset>_<algorithm>_seed<seed>)")
  flags.DEFINE_integer("checkpoint_every", runner.CHECKPOINT_EVERY,
                       "save the run state to <output_dir>/checkpoints every "
                       "this many rounds and at the end (0: never; SIGINT, "
                       "SIGTERM and a non-finite round still save)")
  flags.DEFINE_bool("resume", False, "continue the run in --output_dir from "
                    "its latest checkpoint (same flags; a larger --rounds "
                    "trains further)")
  flags.DEFINE_bool("overwrite", False, "replace the run --output_dir holds "
                    "(without it an existing run is never overwritten)")
  flags.DEFINE_bool("compilation_cache", True, "keep compiled programs in "
                    "JAX's persistent cache (--compilation_cache_dir) so "
                    "that later runs start faster")
  flags.DEFINE_string("compilation_cache_dir", None, "the persistent "
                      "compilation cache (default $XDG_CACHE_HOME/augfl_jax/"
                      "jax_cache, ~/.cache without XDG_CACHE_HOME)")


_define_flags()
FLAGS = flags.FLAGS


def default_cache_dir() -> str:
  """``$XDG_CACHE_HOME/augfl_jax/jax_cache`` (``~/.cache`` without it)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "augfl_jax", "jax_cache")


def enable_compilation_cache(directory: str | None = None) -> str:
  """Turns on JAX's persistent compilation cache in ``directory`` (default
  :func:`default_cache_dir`) for every program, however small or quick to
  compile; returns the directory. Process-wide: call it before compiling."""
  from jax.experimental.compilation_cache import compilation_cache
  directory = os.path.abspath(os.path.expanduser(
      directory or default_cache_dir()))
  os.makedirs(directory, exist_ok=True)
  compilation_cache.reset_cache()  # a directory set before takes effect now
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  return directory


def disable_compilation_cache() -> None:
  """Turns the persistent compilation cache off again (process-wide)."""
  from jax.experimental.compilation_cache import compilation_cache
  jax.config.update("jax_compilation_cache_dir", None)
  compilation_cache.reset_cache()


def config_from_flags() -> config_lib.RunConfig:
  return config_lib.RunConfig(**{f.name: FLAGS[f.name].value
                             for f in dataclasses.fields(config_lib.RunConfig)})


def quiet_logging() -> None:
  """absl INFO logs off unless --verbosity is given (orbax logs every file
  it reads or writes)."""
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.ERROR)


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
  quiet_logging()
  if FLAGS.compilation_cache:
    enable_compilation_cache(FLAGS.compilation_cache_dir)
  try:
    config = runner.validate(config_from_flags())
    output_dir = FLAGS.output_dir or (
        f"runs/{config.dataset.replace('/', '_')}_{config.algorithm}"
        f"_seed{config.seed}")
    runner.run(config, output_dir, log=_log,
               checkpoint_every=FLAGS.checkpoint_every, resume=FLAGS.resume,
               overwrite=FLAGS.overwrite)
  except runner.RunInterrupted as e:
    print(f"interrupted: {e}\nresume with: {resume_command(sys.argv)}",
          file=sys.stderr)
    sys.exit(128 + e.signum)
  except KeyboardInterrupt:
    print("interrupted at once (second signal or before training began); "
          "resume from the latest checkpoint, if any, with: "
          f"{resume_command(sys.argv)}", file=sys.stderr)
    sys.exit(130)
  except (ValueError, FloatingPointError, FileNotFoundError,
          runner.data.DatasetUnavailableError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
