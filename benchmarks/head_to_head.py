r"""AugFL as the authors' code runs it beside this library's round.

  git clone https://github.com/zerui981105/AugFL /tmp/AugFL
  python -m benchmarks.head_to_head --authors_src=/tmp/AugFL --augfl.lam=0

The same Fashion-MNIST clients for both: the authors' division
(``data.authors``: their 40 training and 10 held-out users, support and
query example for example, clients inside the server split), their CNN
(``src/baseModel_fmnist.py``; ours ``authors_fmnist_cnn``) from the same
initial weights (their ``torch.manual_seed(seed)`` initialisation copied
into our parameters), the same alpha, rho and lam. Each round runs their
``Client.train`` for every client and ``Server.aggregate_parameters`` (or
``aggregate_parameters_CRD``; ``benchmarks.authors_code``), and our
``augfl.make_round``. With ``--augfl.lam > 0`` both get ``grad R_h`` at
their own theta^t from this library's CRD (a cnn PM pretrained on the server
split, two CRD states of the same initialisation, so equal thetas get equal
gradients).

Reports the largest relative difference ``max_leaf ||theta_ours -
theta_theirs|| / ||theta_theirs||`` (and the largest absolute one) after the
rounds of ``--report_rounds``, beside the same difference between our run
and ours from a theta^0 perturbed by ``--perturb`` (how much the rounds
themselves amplify a difference); both runs' accuracy on the 10 held-out users
(one fast-adaptation step at alpha, 95% interval across users) every
``--eval_every`` rounds; after the last round both on
``--eval.test_clients`` clients of the authors' protocol from the test file's
part of the pool (``data.authors.draw_clients``) and their paired
difference. Without a snapshot it says how to get one and exits with code 2.
Flags that are fields of ``experiments.run``'s configuration have its dotted
names (``--augfl.lam``, ``--pm.epochs``, ``--crd.nce_k``, ...).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import flags
import jax
import numpy as np

from augfl_jax.algorithms.augfl import factored
from augfl_jax.algorithms import augfl
from augfl_jax import data, models
from augfl_jax.core import evaluation, intervals
from augfl_jax.pm import pretrain
from augfl_jax import transfer
from augfl_jax.models import authors as authors_models
from benchmarks import authors_code
from benchmarks import command

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined only when it runs)."""
  flags.DEFINE_string("authors_src", None, "a snapshot of the authors' "
                      "repository (its root or src/): "
                      + authors_code.HOW_TO_GET)
  flags.DEFINE_integer("rounds", 100, "rounds")
  flags.DEFINE_float("augfl.lam", 0.0, "lambda; > 0 adds lam grad R_h (CRD) "
                     "to both servers' aggregation (at alpha 0.02, rho 1.0, "
                     "lam 5 makes both runs non-finite by round 8; 1 "
                     "does not)")
  flags.DEFINE_float("augfl.alpha", 0.02, "alpha (the authors' launcher's "
                     "0.02)")
  flags.DEFINE_float("augfl.rho", 1.0, "rho (the authors' launcher's 1.0)")
  flags.DEFINE_enum("augfl.dense_updates", "auto",
                    ["auto", "factored", "materialised"],
                    "our round's dense kernels (augfl.factored)")
  flags.DEFINE_list("report_rounds", ["1", "10", "100"],
                    "rounds after which theta is compared")
  flags.DEFINE_integer("eval_every", 10, "score the held-out users every "
                       "this many rounds")
  flags.DEFINE_integer("eval.test_clients", 1000, "clients from the test "
                       "file scored after the last round (0: none)")
  flags.DEFINE_integer("seed", 0, "torch.manual_seed of the initial weights; "
                       "the seed of the test-file clients and of the CRD",
                       lower_bound=0)
  flags.DEFINE_integer("pm.epochs", 5, "epochs of the cnn PM "
                       "(--augfl.lam > 0)")
  flags.DEFINE_integer("crd.kt_steps", 8, "CRD minibatches of 128 a round")
  flags.DEFINE_integer("crd.nce_k", 4096, "CRD negatives per example")
  flags.DEFINE_string("data.data_dir", None, "where the Fashion-MNIST IDX "
                      "files are (default: the library's search order)")
  flags.DEFINE_boolean("onednn", False, "let PyTorch run its CPU "
                       "convolutions with oneDNN (mkldnn), PyTorch's own "
                       "default; off here, with one thread, for the "
                       "plainest float32 arithmetic")
  flags.DEFINE_boolean("float64", False, "both codes in float64 (ours with "
                       "jax_enable_x64; theirs under torch's float64 default "
                       "dtype, their model's input cast to float64), to "
                       "tell their equations apart from float32 rounding")
  flags.DEFINE_float("perturb", 1e-8, "also run ours from theta^0 times (1 "
                     "+ perturb u), u ~ U[-1, 1] per weight, and report how "
                     "far it drifts from ours: the growth of a difference "
                     "that the rounds themselves cause; with --augfl.lam > 0 "
                     "it takes our run's grad R_h; 0: no such run)",
                     lower_bound=0)
  flags.DEFINE_string("output", None, "also write the results as JSON here")
  for name in ("rounds", "augfl.lam", "augfl.alpha", "augfl.rho",
               "eval_every", "eval.test_clients", "pm.epochs", "crd.kt_steps",
               "crd.nce_k"):
    command.config_rule(name)
  command.integers("report_rounds", 0)
  command.output()


def _flag(name: str):
  """The value of flag ``name``; the run's fields by their dotted names
  (``augfl.lam``), which attribute access cannot spell."""
  return FLAGS[name].value


def relative_difference(ours, theirs) -> tuple[float, float]:
  """``(max_leaf ||a - b|| / ||b||, max |a - b|)`` over the parameters
  (``nan`` where either is not finite)."""
  rel, absolute = [], []
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    rel.append(np.linalg.norm(a - b) / np.linalg.norm(b))
    absolute.append(np.abs(a - b).max())
  return float(np.max(rel)), float(np.max(absolute))


def scored(correct, counts, clip: bool = True) -> dict:
  """Accuracy (or a paired difference) with its 95% interval across
  clients (``intervals.ratio_interval``)."""
  interval = intervals.ratio_interval(correct, counts)
  interval = interval.clipped() if clip else interval
  return {"accuracy": interval.mean, "interval": [interval.low,
                                                  interval.high],
          "client_correct": np.asarray(correct).tolist()}


def regularizer(fed, student_apply):
  """``(init_rh, grad_rh)``: CRD with a cnn PM (GroupNorm, ``--pm.epochs``
  on the server split), ``--crd.kt_steps`` minibatches and
  ``--crd.nce_k`` negatives."""
  epochs = _flag("pm.epochs")
  pm = models.create_model("cnn", fed.num_classes, norm="group")
  variables, metrics = pretrain.pretrain(
      pm, fed.server, pretrain.PretrainConfig(model="cnn", epochs=epochs))
  print(f"PM: cnn, {epochs} epochs, held-out accuracy "
        f"{100 * metrics['heldout_accuracy']:.2f}%", flush=True)
  return transfer.make_regularizer(
      "crd", student_apply=student_apply,
      teacher_apply=lambda x, mask: pm.apply(variables, x, mask=mask),
      server=fed.server, config=transfer.CRDConfig(
          nce_k=_flag("crd.nce_k"), kt_steps=_flag("crd.kt_steps")),
      teacher_per_example=True)


class Runs:
  """Both codes on the same clients from the same weights."""

  def __init__(self, code):
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = FLAGS.onednn
    if FLAGS.float64:
      jax.config.update("jax_enable_x64", True)
      torch.set_default_dtype(torch.float64)
      code = authors_code.in_float64(code)
    self.torch, self.code = torch, code
    self.fed, pool = data.authors.load_federated(
        "fashion_mnist",
        location=data.locate("fashion_mnist", _flag("data.data_dir")),
        num_clients=50, M=20,
        classes_per_client=2, server_size=10000, support_fraction=0.2,
        server_overlap=True, test_clients=_flag("eval.test_clients"),
        seed=FLAGS.seed)
    if FLAGS.float64:
      cast, split = lambda t: jax.tree.map(_float64, t), self.fed.test_split
      self.fed = dataclasses.replace(
          self.fed, train=cast(self.fed.train), test=cast(self.fed.test),
          server=cast(self.fed.server), test_split=split and
          dataclasses.replace(split, clients=cast(split.clients)))
    self.x, self.y, self.k = pool.x, pool.y, self.fed.num_classes
    part = self.fed.partition
    self.heldout = [(part.support[u], part.query[u])
                    for u in part.test_clients]
    torch.manual_seed(FLAGS.seed)
    torch_model = code.BaseModel()
    params = authors_models.params_from_torch(
        authors_code.state_dict(torch_model))
    model = models.create_model("authors_fmnist_cnn", self.k)
    loss_fn = models.make_loss_fn(model)
    config = augfl.AugFLConfig(
        alpha=_flag("augfl.alpha"), rho=_flag("augfl.rho"),
        lam=_flag("augfl.lam"), dense_updates=_flag("augfl.dense_updates"))
    self.round_fn = factored.make_configured_round(loss_fn, config)
    start = lambda p: factored.configured_state(config, loss_fn, p,
                                                self.fed.train)
    self.state = start(params)
    self.perturbed = None
    if FLAGS.perturb > 0:
      keys = jax.random.split(jax.random.key(FLAGS.seed),
                              len(jax.tree.leaves(params)))
      leaves = [leaf * (1 + FLAGS.perturb * jax.random.uniform(
          k, leaf.shape, leaf.dtype, -1.0, 1.0)) for k, leaf in zip(
              keys, jax.tree.leaves(params))]
      self.perturbed = start(
          jax.tree.unflatten(jax.tree.structure(params), leaves))
    clients = authors_code.make_clients(
        code, torch_model, self.x, self.y,
        [(part.support[u], part.query[u]) for u in part.train_clients],
        alpha=_flag("augfl.alpha"), rho=_flag("augfl.rho"),
        num_classes=self.k)
    self.server = authors_code.make_server(
        code, torch_model, clients, rho=_flag("augfl.rho"),
        lam=_flag("augfl.lam"))
    self.evaluate = evaluation.make_evaluator(
        loss_fn, models.make_eval_fn(model), alpha=_flag("augfl.alpha"))
    if _flag("augfl.lam") > 0:
      init_rh, self.grad_rh = regularizer(self.fed,
                                          models.make_features_fn(model))
      self.rh = [init_rh(jax.random.key(FLAGS.seed), params)] * 2

  def theirs(self):
    """Their global model as our parameters."""
    return authors_models.params_from_torch(
        authors_code.state_dict(self.server.global_model))

  def round(self) -> None:
    """One round of each code."""
    reg = grad = None
    if _flag("augfl.lam") > 0:
      reg, self.rh[0], _ = self.grad_rh(self.state.params, self.rh[0])
      their_reg, self.rh[1], _ = self.grad_rh(self.theirs(), self.rh[1])
      grad = [self.torch.from_numpy(v) for v in
              authors_models.params_to_torch(their_reg).values()]
    self.state, _ = self.round_fn(self.state, self.fed.train, reg)
    if self.perturbed is not None:
      self.perturbed, _ = self.round_fn(self.perturbed, self.fed.train, reg)
    authors_code.run_round(self.server, grad)

  def score(self, ours_clients, their_users) -> dict:
    """Both models adapted on each client's support set, scored on its
    query set; with the paired difference ours - theirs."""
    ours = evaluation.score_in_chunks(self.evaluate, self.state.params,
                                      ours_clients)
    correct, counts = authors_code.fast_adapt_correct(
        self.code, self.server.global_model, self.x, self.y, their_users,
        alpha=_flag("augfl.alpha"), num_classes=self.k)
    assert np.array_equal(counts, ours["client_count"])
    return {"ours": scored(ours["client_correct"], counts),
            "theirs": scored(correct, counts),
            "ours_minus_theirs": scored(
                ours["client_correct"] - correct, counts, clip=False)}


def head_to_head(code) -> dict:
  """Runs both codes side by side (module docstring); the results."""
  runs = Runs(code)
  report = {int(r) for r in FLAGS.report_rounds}
  out = {"flags": {n: FLAGS[n].value for n in (
      "rounds", "augfl.lam", "augfl.alpha", "augfl.rho",
      "augfl.dense_updates", "seed", "eval.test_clients", "pm.epochs",
      "crd.kt_steps", "crd.nce_k", "onednn", "float64")}, "theta": {}, "heldout": []}
  for t in range(FLAGS.rounds + 1):
    if t:
      runs.round()
    if t in report:
      rel, absolute = relative_difference(runs.state.params, runs.theirs())
      out["theta"][t] = {"relative": rel, "absolute": absolute}
      line = (f"round {t:4d}: theta max relative difference {rel:.3e}, max "
              f"absolute {absolute:.3e}")
      if runs.perturbed is not None:
        drift, _ = relative_difference(runs.perturbed.params,
                                       runs.state.params)
        out["theta"][t]["ours_perturbed"] = drift
        line += (f"; ours from theta^0 perturbed by {FLAGS.perturb:g}: "
                 f"{drift:.3e}")
      print(line, flush=True)
    if t % FLAGS.eval_every == 0 or t == FLAGS.rounds:
      row = {"round": t, **runs.score(runs.fed.test, runs.heldout)}
      out["heldout"].append(row)
      print(f"round {t:4d}: held-out users: ours {_fmt(row['ours'])}, "
            f"theirs {_fmt(row['theirs'])}, ours - theirs "
            f"{_fmt(row['ours_minus_theirs'])}", flush=True)
  split = runs.fed.test_split
  if split is not None:
    out["test_file_clients"] = runs.score(
        split.clients, list(zip(split.support, split.query)))
    row = out["test_file_clients"]
    print(f"round {FLAGS.rounds}: {split.num_clients} test-file clients: "
          f"ours {_fmt(row['ours'])}, theirs {_fmt(row['theirs'])}, ours - "
          f"theirs {_fmt(row['ours_minus_theirs'])}", flush=True)
  return out


def _float64(leaf):
  return leaf.astype(np.float64) if leaf.dtype == np.float32 else leaf


def _fmt(result: dict) -> str:
  low, high = result["interval"]
  return (f"{100 * result['accuracy']:.2f} [{100 * low:.2f}, "
          f"{100 * high:.2f}]")


def main(argv):
  del argv
  try:
    code = authors_code.import_snapshot(FLAGS.authors_src)
  except authors_code.SnapshotMissing as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  out = head_to_head(code)
  if FLAGS.output:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    command.write_json(FLAGS.output, out)


if __name__ == "__main__":
  command.run(define_flags, main)
