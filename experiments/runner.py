"""One federated training run: data, model, algorithm, evaluation, outputs.

``run(config, output_dir)`` is what ``python -m experiments.run`` calls after
parsing flags; tests and sweeps call it directly. It writes to ``output_dir``:

* ``config.json``: the resolved configuration (defaults filled in);
* ``partition.txt``: the partition summary;
* ``metrics.jsonl``: one JSON object per evaluation (round, train loss,
  test-client accuracy mean/std and per client, loss, seconds since start);
* ``tb/``: TensorBoard events (``train/*`` every round, ``eval/*`` at
  evaluations);
* ``checkpoints/step_<round>``: the latest run state (orbax, see
  ``augfl_jax.checkpoint``): every ``checkpoint_every`` rounds, at the end,
  on SIGINT/SIGTERM and before stopping on a non-finite round;
* ``summary.json``: the final accuracy, best accuracy, timings.

Trust rules: a directory holding another run (its ``config.json``) is never
reused without ``overwrite`` (or ``resume``, to continue it); ``resume``
refuses a checkpoint of another configuration except in
``RESUMABLE_FIELDS``; a round with a non-finite loss, metric or state stops
the run naming the round, the quantity and the clients.

Resuming is exact: the checkpoint holds the whole algorithm state (server
and stacked client state, the regulariser's state and optimiser, PRNG keys),
participants are drawn from ``(seed, round)`` and every key is folded from
the state, so ``R`` rounds straight and ``k`` + resume + ``R - k`` give the
same parameters bit for bit (same device, ``--strategy`` and
``--conv_impl``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax import (algorithms, checkpoint, clients, data, models, pretrain,
                       transfer)
from augfl_jax import tree as tree_lib
from augfl_jax.training.progress import Progress
from experiments import config as config_lib
from experiments.config import RunConfig, validate  # re-exported


CHECKPOINT_EVERY = 50
# Rounds are logged at evaluations, and otherwise at least this often.
LOG_SECONDS = 10.0
# RunConfig fields a resumed run may change: they do not change the math
# (rounds: more rounds continue training; strategy, chunk_size, conv_impl
# and kt_loop only change how the same computation is laid out, so a run
# started under other defaults, e.g. "vmap" / "xla", resumes under today's).
RESUMABLE_FIELDS = ("rounds", "eval_every", "data_dir", "strategy",
                    "chunk_size", "conv_impl", "kt_loop")
# What a run writes to its output directory (removed by ``overwrite``).
OUTPUTS = ("config.json", "partition.txt", "metrics.jsonl", "summary.json",
           "checkpoints", "tb")


class RunInterrupted(Exception):
  """SIGINT or SIGTERM stopped the run after a round; its state was saved.

  Attributes: ``signum``, ``round`` (the last completed round) and
  ``checkpoint`` (the saved checkpoint's path).
  """

  def __init__(self, message: str, signum: int, round_: int,
               checkpoint_path: str):
    super().__init__(message)
    self.signum, self.round, self.checkpoint = signum, round_, checkpoint_path


class NonFiniteError(FloatingPointError):
  """A round produced a non-finite loss, metric or state (the last good
  state was saved first)."""


def sample_participants(seed: int, round_: int, num_clients: int,
                        clients_per_round: int | None) -> np.ndarray | None:
  """The clients taking part in ``round_``: ``clients_per_round`` of them,
  uniformly without replacement, reproducible from (seed, round); ``None``
  (everyone) when all clients take part."""
  if clients_per_round is None or clients_per_round >= num_clients:
    return None
  rng = np.random.default_rng([seed, round_])
  return np.sort(rng.choice(num_clients, clients_per_round, replace=False))


def _write_json(path: str, obj: Any) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")


def _scalars(metrics: dict[str, jax.Array]) -> dict[str, float]:
  return {k: float(v) for k, v in metrics.items() if jnp.ndim(v) == 0}


def load_federated(config: RunConfig) -> tuple[data.FederatedData, str]:
  """The run's federated data and its partition summary (``config``
  resolved by ``validate``)."""
  dataset = data.load_dataset(config.dataset, data_dir=config.data_dir,
                              seed=config.seed)
  partition = data.make_partition(
      dataset, num_clients=config.num_clients, M=config.M,
      classes_per_client=config.classes_per_client,
      server_size=config.server_size, partition=config.partition,
      dirichlet_alpha=config.dirichlet_alpha, seed=config.seed)
  return (data.build_federated(dataset, partition),
          f"dataset {dataset.name}: {dataset.source}\n"
          + data.describe(partition, dataset.y))


def load_pm(config: RunConfig, fed: data.FederatedData,
            log: Callable[[str], None]):
  """``(pm_model, pm_params)``: reused from ``config.pm_dir`` when it
  matches the run, pretrained on the server split when there is none."""
  pm_model = models.create_model(
      config.pm_model, fed.num_classes,
      **config_lib.model_kwargs(config.pm_model, config.norm,
                                config.pm_kwargs, config.conv_impl))
  pm_params, meta = pretrain.get_or_pretrain_pm(
      config.pm_dir, model=pm_model, model_name=config.pm_model,
      dataset_name=config.dataset, server=fed.server,
      server_size=config.server_size,
      split_seed=config_lib.server_split_seed(config),
      config=pretrain.PretrainConfig(model=config.pm_model,
                                     epochs=config.pm_epochs),
      input_shape=fed.input_shape, log=log)
  held = meta.get("heldout_accuracy")
  log(f"PM {config.pm_model} ({meta.get('num_params', 0):,} parameters, "
      f"held-out accuracy {'n/a' if held is None else f'{100 * held:.2f}%'})"
      f" from {config.pm_dir}")
  return pm_model, pm_params


def build_algorithm(config: RunConfig, fed: data.FederatedData,
                    log: Callable[[str], None]):
  """``(algorithm, initial_params)`` for the run, with the PM wired in
  where the method uses one (server regulariser, encoder or start)."""
  model = models.create_model(
      config.model, fed.num_classes,
      **config_lib.model_kwargs(config.model, config.norm,
                                conv_impl=config.conv_impl))
  input_shape = fed.input_shape
  pm_model = pm_params = regularizer = encoder_apply = None
  if config.needs_pm:  # first: a mismatched PM fails before any compilation
    pm_model, pm_params = load_pm(config, fed, log)
    pm_apply = lambda x, mask: pm_model.apply({"params": pm_params}, x,
                                              mask=mask)
  init_key = jax.random.split(jax.random.key(config.seed))[0]
  if config.uses_pm:
    log(f"server regulariser {config.regularizer}, lam {config.lam}")
    regularizer = transfer.make_regularizer(
        config.regularizer, student_apply=models.make_features_fn(model),
        teacher_apply=pm_apply, pm_params=pm_params, server=fed.server,
        config=config_lib.crd_config(config))
  if config.algorithm in algorithms.NEEDS_ENCODER:
    # The client model is a projector on the frozen encoder's features
    # (FedPCL's reference projector: one hidden layer of 256).
    encoder_apply = lambda x, mask: pm_apply(x, mask)[0]
    features = jax.eval_shape(
        encoder_apply, jax.ShapeDtypeStruct((2,) + input_shape, jnp.float32),
        jax.ShapeDtypeStruct((2,), jnp.float32))
    input_shape = features.shape[1:]
    model = models.create_model("mlp", fed.num_classes, hidden=(256,),
                                norm="none")
  if config.algorithm in algorithms.PM_BACKBONE:
    model = pm_model  # LoRA adapters on the frozen PM
  params = (pm_params if config.algorithm in
            algorithms.STARTS_PRETRAINED + algorithms.PM_BACKBONE
            else models.init_params(model, init_key, input_shape))
  model_name = (config.pm_model + " + LoRA" if config.algorithm in
                algorithms.PM_BACKBONE else "projector mlp" if
                encoder_apply is not None else config.model)
  log(f"model {model_name}: {models.num_params(params):,} parameters; "
      f"algorithm {config.algorithm}; {fed.train.num_clients} train / "
      f"{fed.test.num_clients} test clients")
  algo = algorithms.build(
      config.algorithm, model, config_lib.algorithm_config(config),
      strategy=clients.ClientStrategy(config.strategy, config.chunk_size),
      eval_alpha=config.alpha, eval_steps=config.adapt_steps,
      regularizer=regularizer, encoder_apply=encoder_apply)
  return algo, params


def config_diff(saved: dict[str, Any], config: RunConfig,
                ignore: tuple[str, ...] = ()) -> list[str]:
  """``"field: saved -> now"`` for every field of ``config`` that differs
  from the ``saved`` dict (a ``config.json`` or a checkpoint's config)."""
  missing = object()
  return [f"{name}: {saved.get(name, missing)!r} -> {value!r}"
          .replace(f"{missing!r}", "(absent)")
          for name, value in dataclasses.asdict(config).items()
          if name not in ignore and saved.get(name, missing) != value]


def resumable(output_dir: str) -> bool:
  """Whether ``output_dir`` holds a checkpoint that ``resume=True`` can use."""
  return checkpoint.latest_step(os.path.join(output_dir, "checkpoints")) \
      is not None


def _prepare_output_dir(config: RunConfig, output_dir: str, resume: bool,
                        overwrite: bool) -> dict[str, Any] | None:
  """Checks ``output_dir`` against the run; returns the metadata of the
  checkpoint to resume from (``None``: a fresh run). Raises ``ValueError``."""
  if resume and overwrite:
    raise ValueError("--resume and --overwrite exclude each other: resume "
                     "continues the run in --output_dir, overwrite replaces it")
  ckpt_root = os.path.join(output_dir, "checkpoints")
  config_path = os.path.join(output_dir, "config.json")
  if resume:
    step = checkpoint.latest_step(ckpt_root)
    if step is None:
      raise ValueError(f"--resume: no checkpoint in {ckpt_root} to resume "
                       "from; run without --resume (add --overwrite if the "
                       "directory holds a run) to start again")
    meta = checkpoint.restore_metadata(checkpoint.step_path(ckpt_root, step))
    diff = config_diff(meta.get("config", {}), config, RESUMABLE_FIELDS)
    if diff:
      raise ValueError(
          f"--resume: the checkpoint in {ckpt_root} (round {step}) is of "
          f"another configuration ({'; '.join(diff)}); only "
          f"{', '.join(RESUMABLE_FIELDS)} may change on resume")
    if step > config.rounds:
      raise ValueError(f"--resume: the checkpoint in {ckpt_root} is at round "
                       f"{step}, beyond --rounds={config.rounds}")
    return meta
  step = checkpoint.latest_step(ckpt_root)
  if overwrite or not (os.path.exists(config_path) or step is not None):
    return None  # a fresh run: _clear_outputs before it writes anything
  if os.path.exists(config_path):
    with open(config_path) as f:
      saved = json.load(f)
  else:  # a checkpoint without its config.json
    saved = checkpoint.restore_metadata(
        checkpoint.step_path(ckpt_root, step)).get("config", {})
  diff = config_diff(saved, config)
  if diff:
    raise ValueError(
        f"{output_dir} holds a different run ({'; '.join(diff)}); pass "
        "--overwrite to replace it or choose another --output_dir")
  raise ValueError(f"{output_dir} already holds this run; pass --resume to "
                   "continue it from its latest checkpoint or --overwrite "
                   "to start again")


def _clear_outputs(output_dir: str) -> None:
  """Removes what an earlier run wrote (``OUTPUTS``) from ``output_dir``."""
  for name in OUTPUTS:
    path = os.path.join(output_dir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)


def _committed(state: Any) -> Any:
  """On one device, ``state`` committed to it: a round's outputs are
  committed, and jit compiles again for committed inputs after uncommitted
  ones (the PM-aided rounds twice), so the first round's are too."""
  if jax.device_count() != 1:
    return state
  return jax.device_put(state, jax.devices()[0])


def _float_leaves(tree: Any) -> list[Any]:
  """The floating-point leaves (not PRNG keys, counters, indices)."""
  return [leaf for leaf in jax.tree.leaves(tree)
          if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)]


_all_finite = jax.jit(tree_lib.all_finite)


def _nonfinite_report(metrics: dict[str, jax.Array], state: Any,
                      participants: np.ndarray | None,
                      num_clients: int) -> str:
  """What is non-finite after a round: metrics by name (``client_loss``
  by training-client id), state leaves by path with the client rows of the
  client-stacked ones (leading axis ``num_clients``)."""
  parts = []
  for name, value in jax.device_get(metrics).items():
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.inexact) or np.isfinite(value).all():
      continue
    if name == "client_loss":
      ids = (np.arange(value.shape[0]) if participants is None
             else np.asarray(participants))
      bad = ~np.isfinite(value)
      parts.append(f"client_loss of training clients {ids[bad].tolist()} "
                   f"({', '.join(str(v) for v in value[bad])})")
    else:
      parts.append(f"{name} = {value}" if value.ndim == 0
                   else f"{name} (non-finite entries)")
  paths, rows = [], set()
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if not _float_leaves([leaf]):
      continue
    finite = np.isfinite(np.asarray(jax.device_get(leaf)))
    if finite.all():
      continue
    paths.append(jax.tree_util.keystr(keypath))
    if finite.ndim >= 1 and finite.shape[0] == num_clients:
      rows.update(np.flatnonzero(
          ~finite.reshape(num_clients, -1).all(1)).tolist())
  if paths:
    shown = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more"
                                    if len(paths) > 4 else "")
    parts.append(f"parameters/state {shown}" + (
        f" (rows of training clients {sorted(rows)})" if rows else ""))
  return "; ".join(parts)


class _StopSignals:
  """Context manager: SIGINT/SIGTERM set ``signum`` instead of stopping the
  process (a second one raises ``KeyboardInterrupt``); main thread only."""

  def __init__(self):
    self.signum, self._old = None, {}

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      raise KeyboardInterrupt
    self.signum = signum

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in (signal.SIGINT, signal.SIGTERM):
        self._old[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._old.items():
      signal.signal(s, handler)


def _summary_writer(logdir: str, purge_step: int | None):
  """A ``tensorboardX.SummaryWriter``. tensorboardX imports torch, when it
  is installed, only to accept torch tensors (2+ s of start-up); this run
  logs floats, so torch is kept out of that import."""
  if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None  # ImportError inside tensorboardX only
    try:
      import tensorboardX  # pylint: disable=import-outside-toplevel
    finally:
      del sys.modules["torch"]
  import tensorboardX  # pylint: disable=import-outside-toplevel
  return tensorboardX.SummaryWriter(logdir, flush_secs=10,
                                    purge_step=purge_step)


def _read_history(path: str, upto: int) -> list[dict[str, Any]]:
  """The records of ``metrics.jsonl`` up to round ``upto`` (later ones were
  written after the checkpoint and are recomputed)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if r["round"] <= upto]


def run(config: RunConfig, output_dir: str,
        log: Callable[[str], None] = print, *,
        checkpoint_every: int = CHECKPOINT_EVERY, resume: bool = False,
        overwrite: bool = False,
        transform_data: Callable[[data.FederatedData], data.FederatedData
                                 | tuple[data.FederatedData, str]]
        | None = None) -> dict[str, Any]:
  """Trains ``config.algorithm`` and evaluates it on the test clients.

  Args:
    config: the run's configuration (validated here).
    output_dir: where the run's files go (see the module docstring).
    log: receives progress lines.
    checkpoint_every: save the run state every this many rounds and at the
      end; 0 never (SIGINT/SIGTERM and a non-finite round still save).
    resume: continue from ``output_dir``'s latest checkpoint (its config
      may differ only in ``RESUMABLE_FIELDS``; a larger ``rounds`` continues
      training).
    overwrite: replace the run ``output_dir`` holds.
    transform_data: applied to the federated data before training (tests
      put a NaN into one client's examples; ``experiments.ood`` swaps in
      rotated domains); returns the new data, or ``(data, summary)`` whose
      summary replaces the partition's in the log and ``partition.txt``.

  Returns:
    The summary that is also written to ``summary.json``.

  Raises:
    ValueError: a bad config or flag combination, or an output directory
      holding another run, before anything is compiled.
    NonFiniteError: a round produced a non-finite value.
    RunInterrupted: SIGINT/SIGTERM; the state after the last round is saved.
  """
  config = validate(config)
  if checkpoint_every < 0:
    raise ValueError(f"--checkpoint_every must be >= 0 (0: never), got "
                     f"{checkpoint_every}")
  resumed = _prepare_output_dir(config, output_dir, resume, overwrite)
  ckpt_root = os.path.join(output_dir, "checkpoints")
  metrics_path = os.path.join(output_dir, "metrics.jsonl")
  start_round = resumed["round"] if resumed else 0
  if resumed and start_round == config.rounds and os.path.exists(
      os.path.join(output_dir, "summary.json")):
    log(f"the run in {output_dir} has done its {config.rounds} rounds; pass "
        "a larger --rounds to continue it")
    with open(os.path.join(output_dir, "summary.json")) as f:
      return json.load(f)

  fed, summary_text = load_federated(config)
  if transform_data is not None:
    fed = transform_data(fed)
    if isinstance(fed, tuple):
      fed, summary_text = fed
  log(summary_text)
  algo, params = build_algorithm(config, fed, log)
  run_key = jax.random.split(jax.random.key(config.seed))[1]
  num_clients = fed.train.num_clients
  state = _committed(algo.init(params, num_clients, run_key))

  # Everything that can fail before training has: now the directory is ours.
  if not resumed:
    _clear_outputs(output_dir)
  os.makedirs(output_dir, exist_ok=True)
  _write_json(os.path.join(output_dir, "config.json"), {
      **dataclasses.asdict(config),
      "algorithm_config": dataclasses.asdict(
          config_lib.algorithm_config(config))})
  with open(os.path.join(output_dir, "partition.txt"), "w") as f:
    f.write(summary_text + "\n")
  history, train_losses, offset = [], [], 0.0
  if resumed:
    path = checkpoint.step_path(ckpt_root, start_round)
    state = _committed(
        checkpoint.restore(path, like={"state": state})[0]["state"])
    train_losses = list(resumed["pending_train_losses"])
    offset = resumed["seconds"]
    history = _read_history(metrics_path, start_round)
    log(f"resuming from round {start_round} ({path})")
  with open(metrics_path, "w") as f:  # without records past the checkpoint
    f.writelines(json.dumps(r) + "\n" for r in history)

  def save(round_: int, state_: Any) -> str:
    return checkpoint.save_step(ckpt_root, round_, {"state": state_}, {
        "round": round_, "config": dataclasses.asdict(config),
        "pending_train_losses": train_losses,
        "seconds": offset + time.perf_counter() - start})

  start = time.perf_counter()
  progress = Progress(config.rounds, done=start_round)
  last_line = 0.0
  first_round_seconds = None
  saved_round = start_round if resumed else None
  writer = _summary_writer(os.path.join(output_dir, "tb"),
                           start_round + 1 if resumed else None)
  with open(metrics_path, "a") as metrics_file, writer, \
      _StopSignals() as stop:
    for r in range(start_round + 1, config.rounds + 1):
      t0 = time.perf_counter()
      participants = sample_participants(
          config.seed, r, num_clients, config.clients_per_round)
      new_state, metrics = algo.round(state, fed.train, participants)
      if not bool(_all_finite(_float_leaves((metrics, new_state)))):
        report = _nonfinite_report(metrics, new_state, participants,
                                   num_clients)
        path = (save(r - 1, state) if saved_round != r - 1 else
                checkpoint.step_path(ckpt_root, r - 1))
        raise NonFiniteError(
            f"round {r}: non-finite {report}. Stopped; the last good state "
            f"(round {r - 1}) is in {path}. Lower the step sizes (--alpha, "
            "--lr, --beta) or raise --rho, or check those clients' data")
      state = new_state
      scalars = _scalars(jax.device_get(metrics))
      loss = scalars["loss"]
      if first_round_seconds is None:
        first_round_seconds = time.perf_counter() - t0
      train_losses.append(loss)
      progress.step()
      for name, value in scalars.items():
        writer.add_scalar(f"train/{name}", value, r)
      line = f"round {r:4d}/{config.rounds}  train loss {loss:.4f}"
      evaluating = r % config.eval_every == 0 or r == config.rounds
      if evaluating:
        ev_all = jax.device_get(algo.evaluate(state, fed.test))
        ev = _scalars(ev_all)
        record = {"round": r, "train_loss": float(np.mean(train_losses)),
                  "accuracy": ev["accuracy"],
                  "accuracy_std": ev["accuracy_std"],
                  "test_loss": ev["loss"],
                  "client_accuracy": [
                      float(a) for a in ev_all["client_accuracy"]],
                  "seconds": offset + time.perf_counter() - start}
        train_losses = []
        history.append(record)
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()
        for name in ("accuracy", "accuracy_std", "loss"):
          writer.add_scalar(f"eval/{name}", ev[name], r)
        line += (f"  test-client accuracy {100 * ev['accuracy']:.2f}"
                 f" ± {100 * ev['accuracy_std']:.2f} (across clients)")
      if (evaluating or r == start_round + 1 or
          time.perf_counter() - last_line >= LOG_SECONDS):
        log(f"{line}  " + (
            f"{first_round_seconds:.2f} s (compilation included)"
            if r == start_round + 1 else progress.describe("round")))
        last_line = time.perf_counter()
      if checkpoint_every and (r % checkpoint_every == 0 or
                               r == config.rounds):
        save(r, state)
        saved_round = r
      if stop.signum is not None and r < config.rounds:
        name = signal.Signals(stop.signum).name
        path = (save(r, state) if saved_round != r else
                checkpoint.step_path(ckpt_root, r))
        raise RunInterrupted(
            f"{name} after round {r}/{config.rounds}: the run state is saved"
            f" in {path}; continue it with --resume (same flags)",
            stop.signum, r, path)

  session = time.perf_counter() - start
  rounds_done = config.rounds - start_round
  final = history[-1]
  summary = {
      "dataset": config.dataset, "algorithm": config.algorithm,
      "model": config.model, "seed": config.seed, "rounds": config.rounds,
      "final_accuracy": final["accuracy"],
      "final_accuracy_std": final["accuracy_std"],
      "best_accuracy": max(h["accuracy"] for h in history),
      "seconds": offset + session, "first_round_seconds": first_round_seconds,
      "seconds_per_round": ((session - first_round_seconds) /
                            (rounds_done - 1) if rounds_done > 1 else session),
      "resumed_from_round": start_round,
  }
  _write_json(os.path.join(output_dir, "summary.json"), summary)
  log(f"final test-client accuracy {100 * final['accuracy']:.2f} ± "
      f"{100 * final['accuracy_std']:.2f} after {config.rounds} rounds "
      f"({offset + session:.1f} s); results in {output_dir}")
  return summary
