"""Pure, method-agnostic building blocks; none knows a run's configuration
or touches a file.

Public modules: :mod:`.types` (the batch and client-data conventions),
:mod:`.tree` (pytrees over a leading client axis), :mod:`.fields`
(configuration fields with their rules), :mod:`.client_axis` (how the
client axis runs: vmap, lax.map, chunks, shards), :mod:`.distributed`
(a round across processes), :mod:`.local` (minibatch SGD on padded
client data), :mod:`.hvp` (Hessian-vector products), :mod:`.evaluation`
(fast adaptation of held-out clients), :mod:`.intervals` (95% confidence
intervals), :mod:`.progress` (time per step and time left), :mod:`.jit`
(jitted programs that take closed-over arrays as arguments) and
:mod:`.checks` (input checks every round shares).
"""

__all__ = ["checks", "client_axis", "distributed", "evaluation", "fields",
           "hvp", "intervals", "jit", "local", "progress", "tree", "types"]
