"""Pure, method-agnostic building blocks: types, pytree helpers over the
client axis, configuration fields, how the client axis runs, local SGD,
Hessian-vector products, evaluation by fast adaptation, confidence
intervals, progress, and rounds across processes."""
