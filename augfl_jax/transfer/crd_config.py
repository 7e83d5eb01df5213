"""The hyper-parameters of CRD, AugFL's server regulariser R_h (Section V)."""

from __future__ import annotations

import dataclasses

from augfl_jax.core import fields
from augfl_jax.core.fields import field
from augfl_jax.transfer.server_data import AUGMENTATIONS

__all__ = [
    "BANK_DTYPES", "CRDConfig", "LOOPS", "NEGATIVE_SAMPLING", "REFERENCE_NCE_K"
]

LOOPS = ("scan", "python")
NEGATIVE_SAMPLING = ("per_example", "shared")
BANK_DTYPES = ("float32", "bfloat16")
REFERENCE_NCE_K = 16384


@dataclasses.dataclass(frozen=True)
class CRDConfig(fields.Config):
  """Hyper-parameters of the CRD regulariser (RepDistiller's defaults).

  ``loop``: how the minibatches run: ``"scan"`` (one jitted ``lax.scan``),
  ``"python"`` (a Python loop over a jitted minibatch step; same numbers) or
  ``"auto"`` (``transfer.crd.default_loop``: ``"python"`` on CPU when the
  client model's forward pass holds an XLA convolution, ``"scan"``
  otherwise). XLA:CPU runs ``lax.conv`` inside a loop body roughly 10x
  slower than outside one (a CNN round: 14 s vs 1 s of CPU time). A client
  model whose convolutions are matmuls (``conv_impl="patches"``, the CPU
  default) scans well: on a 2-core CPU ``"scan"`` ran the cnn's step 1.35x
  faster than ``"python"`` (benchmarks/RESULTS.md §14). ``experiments.run``
  makes the same choice from the run's ``conv_impl``
  (``training.defaults.crd_loop``).
  """

  feat_dim: int = field(128, "embedding size of the two heads and the banks",
                        ge=1)
  nce_k: int | None = field(
      None, "K, negatives per example, drawn with replacement from other "
      "classes (may exceed the server size; default the reference's 16384; "
      "digits 1024)", ge=1)
  negative_sampling: str = field(
      "per_example", "per_example: K negatives of other classes drawn for "
      "every example (the reference's); shared: K draws for the whole "
      "minibatch, those of an example's own class left out and the rest "
      "reweighted, the same expected loss at a fraction of the cost "
      "(augfl_jax.transfer.shared_negatives)", choices=NEGATIVE_SAMPLING)
  bank_dtype: str = field(
      "float32", "dtype the two memory banks are stored in (float32, the "
      "reference's, or bfloat16: half the memory, read as float32)",
      choices=BANK_DTYPES)
  nce_t: float = field(0.07, "NCE temperature tau", gt=0)
  nce_m: float = field(0.5, "momentum m of the memory banks", ge=0, le=1)
  ce_weight: float = field(1.0, "weight of CE(student, server labels) in "
                           "R_h (the reference's 1.0)", ge=0)
  kd_weight: float = field(0.0, "weight of KD(student, PM) in R_h (the "
                           "reference's 0)", ge=0)
  crd_weight: float = field(0.8, "weight of CRD in R_h (the reference's "
                            "0.8)", ge=0)
  kd_temperature: float = field(4.0, "temperature T of the KD term", gt=0)
  batch_size: int = field(128, "server minibatch size", ge=1)
  kt_steps: int | None = field(
      None, "minibatches per round (default one pass over the server "
      "split, ceil(n / batch_size), the last one partial)", ge=1)
  head_lr: float = field(0.002, "SGD learning rate of the two embedding "
                         "heads (the reference's launcher; RepDistiller's "
                         "own is 0.05)", ge=0, resume="named")
  head_momentum: float = field(0.9, "SGD momentum of the embedding heads",
                               ge=0, lt=1)
  head_weight_decay: float = field(5e-4, "weight decay of the embedding "
                                   "heads", ge=0)
  reset_head_optimizer: bool = field(
      True, "a new SGD (no momentum carried) for the heads every round, as "
      "the reference builds one per round; false carries it across rounds")
  student_lr: float = field(
      0.0, "0: every KT gradient at theta^t (the paper's Eq. 13); > 0: a "
      "copy of the client model takes SGD steps of this size (with the "
      "heads' momentum and weight decay) along the KT minibatches and each "
      "gradient is taken where it is. The authors' code builds such an "
      "optimizer (lr 0.002) but zeroes the copy's gradients before each "
      "step (src/CRD/loops.py), so its copy moves by weight decay alone, "
      "shrinking by under 7e-4 over a pass of 79 minibatches: 0 is the "
      "value closest to it; no value reproduces it", ge=0, resume="named")
  augment: str = field(
      "none", "server images for the KT: none, or crop_flip (the "
      "reference's RandomCrop with padding 4 and a horizontal flip)",
      choices=AUGMENTATIONS)
  loop: str = field("auto", "how the minibatches run: scan, python (same "
                    "numbers) or auto (python on CPU when the client model "
                    "has XLA convolutions, else scan)",
                    choices=LOOPS + ("auto",), resume="free")

  @property
  def negatives(self) -> int:
    """K: ``nce_k``, or the reference's 16384 when it is None."""
    return REFERENCE_NCE_K if self.nce_k is None else self.nce_k

