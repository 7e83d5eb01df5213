"""Jitted programs that take the arrays a function closes over as arguments.

A round or a regulariser closes over megabytes of arrays (the server
split, a PM's weights). ``jax.jit`` would bake them into the compiled
program as constants; :func:`hoist` traces the function once and hands
them back as arguments instead, and :func:`hoisted_jit` compiles such a
function, traced once per structure and shapes of its arguments (when
the arguments span several devices, as a sharded round's state does, the
arrays are replicated on those devices once:
``distributed.replicate_beside``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from augfl_jax.core import distributed

__all__ = ["hoist", "hoisted_jit"]


def hoist(fn: Callable[..., Any], *args: Any
         ) -> tuple[Callable[..., Any], list[jax.Array]]:
  """``(pure, consts)`` with ``pure(consts, *a) == fn(*a)`` for arguments
  ``a`` of the structure and shapes of ``args`` (arrays or
  ``jax.ShapeDtypeStruct``), ``fn`` traced once: ``consts`` are the arrays
  ``fn`` closes over."""
  closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
  out_tree = jax.tree.structure(out_shape)

  def pure(consts, *a):
    return jax.tree.unflatten(out_tree, jax.core.eval_jaxpr(
        closed.jaxpr, consts, *jax.tree.leaves(a)))

  return pure, list(closed.consts)


def hoisted_jit(fn: Callable[..., Any], *, donate_first: bool = False
               ) -> Callable[..., Any]:
  """``jax.jit(fn)``, the arrays ``fn`` closes over passed to the compiled
  program as arguments (:func:`hoist`); traced once per structure and
  shapes of the arguments (e.g. a round's ``participants`` None or
  ``[K]``). ``donate_first``: the first argument's buffers are donated (a
  round's state)."""
  compiled = {}

  def call(*args):
    flat, tree = jax.tree.flatten(args)
    key = (tree, tuple((jnp.shape(a), jnp.result_type(a)) for a in flat))
    if key not in compiled:
      pure, consts = hoist(fn, *args)

      def hoisted(first, rest, consts):
        return pure(consts, first, *rest)

      # JAX's logs name the program after ``fn``: hoisted_<fn>.
      hoisted.__name__ = hoisted.__qualname__ = (
          f"hoisted_{getattr(fn, '__name__', 'fn')}")

      compiled[key] = (jax.jit(hoisted, donate_argnums=(0,) if donate_first
                               else ()),
                       distributed.replicate_beside(consts, args))
    run, consts = compiled[key]
    return run(args[0], args[1:], consts)

  return call
