"""A tiny smooth model whose every quantity can be computed another way.

``params = {"w1": [D, H], "b1": [H], "w2": [H, K], "b2": [K]}``, a tanh MLP with
a masked mean softmax cross-entropy, written with plain ``jnp`` (no Flax) so
the tests check the algorithms, not the models.
"""

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.core.types import ClientData

D, H, K = 5, 4, 3


def init(key, d=D, h=H, k=K):
  k1, k2, k3, k4 = jax.random.split(key, 4)
  return {"w1": jax.random.normal(k1, (d, h)) * 0.5,
          "b1": jax.random.normal(k2, (h,)) * 0.1,
          "w2": jax.random.normal(k3, (h, k)) * 0.5,
          "b2": jax.random.normal(k4, (k,)) * 0.1}


def logits(params, x):
  return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def loss_fn(params, batch):
  logp = jax.nn.log_softmax(logits(params, batch["x"]))
  nll = -jnp.take_along_axis(logp, batch["y"][:, None], axis=1)[:, 0]
  mask = batch["mask"]
  return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def batch(rng, n, pad=0, d=D, k=K):
  """A batch of ``n`` real examples followed by ``pad`` padded rows."""
  x = rng.normal(size=(n + pad, d)).astype(np.float32)
  y = rng.integers(0, k, size=(n + pad,)).astype(np.int32)
  mask = np.concatenate([np.ones(n), np.zeros(pad)]).astype(np.float32)
  x[n:] = 1e3  # garbage in the padding: it must not matter
  return {"x": jnp.asarray(x), "y": jnp.asarray(y), "mask": jnp.asarray(mask)}


def stack(batches):
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *batches)


def client_data(seed=0, num_clients=4, sizes=None, pad_to=12):
  """``ClientData`` for ``num_clients`` clients of different sizes, padded."""
  rng = np.random.default_rng(seed)
  sizes = sizes or [int(s) for s in rng.integers(3, pad_to + 1, num_clients)]
  support = stack([batch(rng, n, pad_to - n) for n in sizes])
  query = stack([batch(rng, n, pad_to - n) for n in sizes])
  return ClientData(support=support, query=query,
                    num_examples=jnp.asarray(sizes, jnp.float32) * 2)
