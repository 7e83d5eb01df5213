"""AugFL with and without the PM on real Fashion-MNIST, at equal rounds.

A short version of the paper's comparison, small enough for a CPU (marked
slow: ``python -m pytest -m slow``): 20 clients, a 2,000-example server
split, a cnn PM pretrained for 3 epochs on it (eval mode), 15 rounds, seeds
0 and 1. The PM enters only the server's step (CE on the server's labels +
CRD); at equal rounds it should lift the held-out clients' accuracy.
"""

from __future__ import annotations

import numpy as np
import pytest

from augfl_jax import fields, training
from tests.test_real_data import _fashion_mnist_or_skip

pytestmark = pytest.mark.slow

SHORT = {"dataset": "fashion_mnist", "rounds": 15, "eval_every": 5,
         "data.num_clients": 20, "data.server_size": 2000,
         "pm.model": "cnn", "pm.epochs": 3}


def test_the_pm_lifts_accuracy_at_equal_rounds(tmp_path):
  _fashion_mnist_or_skip()
  accuracy = {}
  for lam in (0.0, 5.0):
    for seed in (0, 1):
      config = fields.replace(training.RunConfig(), seed=seed, **SHORT,
                              **{"augfl.lam": lam,
                                 "pm.dir": str(tmp_path / "pm")})
      summary = training.run(config, str(tmp_path / f"lam{lam}_seed{seed}"),
                             log=lambda line: None)
      accuracy[lam, seed] = summary["final_accuracy"]
  without = np.mean([accuracy[0.0, s] for s in (0, 1)])
  with_pm = np.mean([accuracy[5.0, s] for s in (0, 1)])
  print(f"AugFL after 15 rounds on real Fashion-MNIST: w/o PM "
        f"{100 * without:.2f}, w/ PM {100 * with_pm:.2f} (seeds 0, 1: "
        f"{accuracy})")
  assert with_pm > without
