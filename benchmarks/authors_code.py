"""The AugFL authors' PyTorch code, run from a snapshot of their repository.

Their code (https://github.com/zerui981105/AugFL) is never copied here: the
user names a snapshot (a clone, or any directory holding its ``src/``) and
:func:`import_snapshot` imports ``src/clientbase.py`` (``Client``),
``src/ServerMain.py`` (``Server``) and ``src/baseModel_fmnist.py``
(``BaseModel``) from it at run time. Two of their imports are stubbed in
``sys.modules``: ``wandb`` (their logging) and ``CRD.crd_interface`` (their
server-side CRD, which reads its own FashionMNIST download through
torchvision and their teacher checkpoint; the head-to-head feeds both codes
the same ``grad R_h`` instead, see ``benchmarks.head_to_head``).

The rest drives their objects as their launcher does (``Server.train`` and
``Server.train_CRD``), with our partition's examples and the same initial
weights: one round is ``Client.train`` for every training client, then
``Server.aggregate_parameters`` (or ``aggregate_parameters_CRD(grad)``),
then ``Server.send_models``; a held-out user is scored as their
``final_test`` does, by ``Client.fast_adapt`` on a fresh ``Client``.
"""

from __future__ import annotations

import copy
import os
import sys
import types
from typing import Any, Sequence

import numpy as np

HOW_TO_GET = ("git clone https://github.com/zerui981105/AugFL /tmp/AugFL, "
              "then pass --authors_src=/tmp/AugFL")
REQUIRED = ("clientbase.py", "ServerMain.py", "baseModel_fmnist.py")


class SnapshotMissing(RuntimeError):
  """No usable snapshot of the authors' code (the message says why)."""


def _stub(name: str, **attributes: Any) -> None:
  module = types.ModuleType(name)
  module.__dict__.update(attributes)
  sys.modules[name] = module


def _not_run(*_, **__):
  raise RuntimeError("the authors' CRD is not run here (benchmarks."
                     "authors_code): both codes get the same grad R_h")


def import_snapshot(path: str | None) -> types.SimpleNamespace:
  """``Client``, ``Server`` and the Fashion-MNIST ``BaseModel`` of the
  snapshot at ``path`` (its root or its ``src/``).

  Raises:
    SnapshotMissing: no path, or the files are not there.
  """
  if not path:
    raise SnapshotMissing("no snapshot of the authors' code given; "
                          + HOW_TO_GET)
  src = os.path.join(path, "src")
  src = src if os.path.isdir(src) else path
  missing = [f for f in REQUIRED if not os.path.isfile(os.path.join(src, f))]
  if missing:
    raise SnapshotMissing(
        f"{src} is not a snapshot of the authors' code (no "
        f"{', '.join(missing)}); {HOW_TO_GET}")
  _stub("wandb", init=lambda *a, **k: None, log=lambda *a, **k: None,
        run=types.SimpleNamespace(save=lambda *a, **k: None))
  _stub("CRD.crd_interface", CRD=_not_run, run_CRD=_not_run)
  sys.path.insert(0, src)
  import baseModel_fmnist  # pylint: disable=g-import-not-at-top,import-error
  import clientbase  # pylint: disable=g-import-not-at-top,import-error
  import ServerMain  # pylint: disable=g-import-not-at-top,import-error
  return types.SimpleNamespace(Client=clientbase.Client,
                               Server=ServerMain.Server,
                               BaseModel=baseModel_fmnist.BaseModel,
                               src=src)


def in_float64(code) -> types.SimpleNamespace:
  """``code`` with a ``BaseModel`` whose ``forward`` casts its input to
  float64 (their ``get_input`` casts every batch to float32); the rest runs
  in float64 under ``torch.set_default_dtype(torch.float64)``."""
  class BaseModel64(code.BaseModel):
    def forward(self, input):  # pylint: disable=redefined-builtin
      return super().forward(input.double())
  return types.SimpleNamespace(**{**vars(code), "BaseModel": BaseModel64})


def samples(x: np.ndarray, y: np.ndarray, rows: np.ndarray,
            num_classes: int) -> dict[str, np.ndarray]:
  """Their sample format: ``{"x": [n, C, H, W], "y": one-hot [n, K]}``
  (``launch_w_PM.reshapeFmnist`` and ``reshape_label``)."""
  return {"x": x[rows].transpose(0, 3, 1, 2).astype(np.float32),
          "y": np.eye(num_classes, dtype=np.int64)[y[rows]]}


def make_clients(code, model, x, y, users: Sequence[tuple[np.ndarray,
                                                           np.ndarray]], *,
                 alpha: float, rho: float, num_classes: int) -> list[Any]:
  """Their ``Client`` per training user ``(support, query)`` with ``w_i =
  |D_i| / sum_j |D_j|`` as ``Server.set_clients`` computes it."""
  sizes = [len(s) + len(q) for s, q in users]
  return [code.Client(u, samples(x, y, s, num_classes),
                      samples(x, y, q, num_classes),
                      {"alpha": alpha, "rho": rho, "w_i": n / sum(sizes),
                       "seed": 0}, model)
          for u, ((s, q), n) in enumerate(zip(users, sizes))]


def make_server(code, model, clients: list[Any], *, rho: float, lam: float):
  """Their ``Server`` holding ``clients`` and ``model`` as its global model
  (built without ``__init__``, which makes resnet8x4 models and reads their
  data files), every client given the global model (``send_models``)."""
  server = code.Server.__new__(code.Server)
  server.clients, server.rho, server.labmda = clients, rho, lam
  server.global_model = copy.deepcopy(model)
  server.send_models()
  return server


def run_round(server, grad: list[Any] | None = None) -> None:
  """One round of ``Server.train`` (``grad`` None) or ``Server.train_CRD``
  (``grad``: ``grad R_h(theta^t)``, their parameters' order)."""
  for client in server.clients:
    client.train()
  if grad is None:
    server.aggregate_parameters()
  else:
    server.aggregate_parameters_CRD(grad)
  server.send_models()


def fast_adapt_correct(code, global_model, x, y, users, *, alpha: float,
                       num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """``([C] correct, [C] query sizes)``: each user scored as their
  ``final_test`` does (a ``Client`` with ``w_i = 1`` given the global model,
  ``fast_adapt``), with the global model's own architecture."""
  correct, counts = [], []
  for u, (s, q) in enumerate(users):
    client = code.Client(u, samples(x, y, s, num_classes),
                         samples(x, y, q, num_classes),
                         {"alpha": alpha, "rho": 1.0, "w_i": 1, "seed": 0},
                         global_model)
    client.set_parameters(global_model)
    accuracy, n = client.fast_adapt()
    correct.append(int(round(float(accuracy) * n)))
    counts.append(n)
  return np.array(correct), np.array(counts)


def state_dict(model) -> dict[str, np.ndarray]:
  """A torch module's ``state_dict`` as numpy arrays."""
  return {k: v.detach().cpu().numpy().copy()
          for k, v in model.state_dict().items()}
