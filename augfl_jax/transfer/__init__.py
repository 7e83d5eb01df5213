"""Server-side knowledge transfer: the regulariser R_h of AugFL (Section V).

The server computes ``reg_grad = grad_theta R_h(theta^t, theta_p)`` for
Eq. (13); the pretrained model (PM) and the server data never reach a client.
Every regulariser is a pair of functions, as an optax transformation is
(:class:`Regularizer`, which unpacks as the pair):

* ``init_fn(key, student_params) -> state`` (a pytree, possibly None), to be
  carried in the server state;
* ``grad_fn(student_params, state) -> (reg_grad, state, metrics)``, with
  ``reg_grad`` a tree like ``student_params`` and ``metrics["r_h"]`` the value;

and says whether ``grad_fn`` can be traced into a larger jitted program
(``traceable``; CRD's ``loop="python"`` runs a Python loop of jitted steps).

``"crd"``: contrastive representation distillation (the paper's choice,
:mod:`augfl_jax.transfer.crd`); ``"l2"``: ``||theta - theta_p||^2`` (same
architecture only); ``"none"``: R_h = 0 ("AugFL w/o PM", lambda = 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import jax.numpy as jnp
import optax

from augfl_jax.transfer.crd import (
    CRDConfig, CRDState, StudentApply, TeacherApply, make_crd_regularizer)
from augfl_jax.transfer.nce import crd_loss
from augfl_jax.transfer.l2 import l2_grad, l2_value, make_l2_regularizer
from augfl_jax.core.types import Batch, Params, PRNGKey

__all__ = [
    "REGULARIZERS", "Regularizer", "make_regularizer", "CRDConfig", "CRDState",
    "make_crd_regularizer", "crd_loss", "make_l2_regularizer", "l2_grad",
    "l2_value", "make_none_regularizer",
]

REGULARIZERS = ("crd", "l2", "none")

InitFn = Callable[[PRNGKey, Params], Any]
GradFn = Callable[[Params, Any], tuple[Params, Any, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Regularizer:
  """A server regulariser: ``init_fn, grad_fn = regularizer`` unpacks it.

  Attributes:
    init_fn: ``init_fn(key, student_params) -> state``.
    grad_fn: ``grad_fn(student_params, state) -> (reg_grad, state,
      metrics)``.
    traceable: ``grad_fn`` can run inside another ``jax.jit``.
  """

  init_fn: InitFn
  grad_fn: GradFn
  traceable: bool = True

  def __iter__(self) -> Iterator[Callable[..., Any]]:
    return iter((self.init_fn, self.grad_fn))


def make_none_regularizer() -> Regularizer:
  """R_h = 0: state None, ``reg_grad`` zeros, ``metrics["r_h"] = 0``."""

  def init_fn(key: PRNGKey, student_params: Params) -> None:
    del key, student_params
    return None

  def grad_fn(student_params: Params, state: Any = None):
    return (optax.tree.zeros_like(student_params), state,
            {"r_h": jnp.zeros((), jnp.float32)})

  return Regularizer(init_fn, grad_fn)


def make_regularizer(name: str, *, student_apply: StudentApply | None = None,
                     teacher_apply: TeacherApply | None = None,
                     pm_params: Params | None = None,
                     server: Batch | None = None,
                     config: CRDConfig | None = None,
                     teacher_per_example: bool = False
                    ) -> Regularizer:
  """The :class:`Regularizer` called ``name`` (``init_fn, grad_fn =``
  unpacks it).

  Args:
    name: one of ``REGULARIZERS``.
    student_apply: ``(params, x, mask) -> (features, logits)`` ("crd").
    teacher_apply: ``(x, mask) -> (features, logits)``, the PM ("crd").
    pm_params: theta_p ("l2").
    server: the server split Batch ("crd").
    config: :class:`CRDConfig` ("crd"; default the reference's).
    teacher_per_example: the PM's output for an example does not depend on
      the rest of its batch ("crd": then it runs over the server split once;
      :func:`~augfl_jax.transfer.crd.make_crd_regularizer`).

  Raises:
    ValueError: unknown name or a missing argument.
  """
  if name not in REGULARIZERS:
    raise ValueError(
        f"Unknown regularizer {name!r}; choose one of {REGULARIZERS}.")
  if name == "none":
    return make_none_regularizer()
  if name == "l2":
    if pm_params is None:
      raise ValueError("the l2 regulariser needs pm_params (theta_p)")
    return Regularizer(*make_l2_regularizer(pm_params))
  missing = [arg for arg, value in (("student_apply", student_apply),
                                    ("teacher_apply", teacher_apply),
                                    ("server", server)) if value is None]
  if missing:
    raise ValueError(f"the crd regulariser needs {', '.join(missing)}")
  config = config or CRDConfig()
  return Regularizer(
      *make_crd_regularizer(student_apply, teacher_apply, server, config,
                            teacher_per_example=teacher_per_example),
      traceable=config.loop == "scan")  # "auto" may choose the Python loop
