"""Rotated domains for out-of-distribution evaluation (Rotated-MNIST style).

The domain-generalisation protocol of Ghifary et al. (2015), as FedOA's
"leave one task out" for images: domain d holds images rotated by
``angles[d]`` degrees (default 0, 15, ..., 75); each domain is split among
``clients_per_domain`` clients; one domain is held out, the clients of the
others train, and personal models are scored on the held-out domain.

* ``rotate_images``: bilinear rotation about the image centre, counter-
  clockwise for positive angles (90 degrees is ``np.rot90(x, 1, axes=(1, 2))``),
  written with ``jax.scipy.ndimage.map_coordinates`` (order 1). Pixels that
  come from outside the image take the nearest border pixel
  (``mode="nearest"``, right for standardised images whose background is not
  0) or ``cval`` (``mode="constant"``).
* ``rotated_domains``: the domains. By default every domain draws its own
  base images (``shared_images=False``), so no source example appears in two
  domains; ``shared_images=True`` rotates the same base images in every
  domain, the classic Rotated-MNIST construction.
* ``leave_one_out``: padded ``ClientData`` of the training domains' clients and
  of the held-out domain's clients (``data.pad_stack`` conventions; support /
  query 50/50).
* ``pool_clients``: all real rows of a ``ClientData`` as one masked batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from augfl_jax.data.federated import pad_stack
from augfl_jax.data.sources import Dataset
from augfl_jax.core.types import Batch, ClientData

__all__ = ["RotatedDomain", "rotate_images", "rotated_domains",
           "leave_one_out", "pool_clients", "DEFAULT_ANGLES"]

DEFAULT_ANGLES = (0, 15, 30, 45, 60, 75)
_MODES = ("nearest", "constant")


def _source_coordinates(height: int, width: int, angle: float) -> np.ndarray:
  """``[2, H, W]`` (row, col) input coordinates of every output pixel.

  With Cartesian ``x = col - cx``, ``y = cy - row`` about the centre
  ``(cy, cx) = ((H - 1) / 2, (W - 1) / 2)``, an output point comes from the
  input point rotated by ``-angle``: ``x_in = cos t x + sin t y``,
  ``y_in = -sin t x + cos t y``. Computed in float64.
  """
  t = math.radians(angle)
  cy, cx = (height - 1) / 2.0, (width - 1) / 2.0
  rows, cols = np.meshgrid(np.arange(height, dtype=np.float64),
                           np.arange(width, dtype=np.float64), indexing="ij")
  x, y = cols - cx, cy - rows
  x_in = math.cos(t) * x + math.sin(t) * y
  y_in = -math.sin(t) * x + math.cos(t) * y
  return np.stack([cy - y_in, cx + x_in])


def rotate_images(x: np.ndarray | jax.Array, angle: float, *,
                  mode: str = "nearest", cval: float = 0.0) -> np.ndarray:
  """Rotates images by ``angle`` degrees counter-clockwise, bilinearly.

  Args:
    x: ``[n, H, W, C]`` or ``[n, H, W]`` images.
    angle: degrees; positive is counter-clockwise as displayed (row 0 on top).
    mode: ``"nearest"`` (outside pixels take the nearest border pixel) or
      ``"constant"`` (they take ``cval``).
    cval: the fill value for ``mode="constant"``.

  Returns:
    float32 numpy array of ``x``'s shape.
  """
  if mode not in _MODES:
    raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
  x = np.asarray(x, np.float32)
  if x.ndim not in (3, 4):
    raise ValueError(f"rotate_images expects [n, H, W(, C)] images, got "
                     f"shape {x.shape}")
  if angle % 360 == 0:
    return x.copy()
  coords = jnp.asarray(_source_coordinates(x.shape[1], x.shape[2], angle),
                       jnp.float32)
  planes = jnp.asarray(x if x.ndim == 4 else x[..., None])
  rotated = np.asarray(_rotate(planes, coords, mode, float(cval)), np.float32)
  return rotated if x.ndim == 4 else rotated[..., 0]


@functools.partial(jax.jit, static_argnames=("mode", "cval"))
def _rotate(planes: jax.Array, coords: jax.Array, mode: str,
            cval: float) -> jax.Array:
  """``[n, H, W, C]`` images sampled bilinearly at ``coords [2, H, W]``."""

  def one(image):  # [H, W]
    return jax.scipy.ndimage.map_coordinates(image, [coords[0], coords[1]],
                                             order=1, mode=mode, cval=cval)

  return jax.vmap(jax.vmap(one, in_axes=-1, out_axes=-1))(planes)


@dataclasses.dataclass(frozen=True, eq=False)
class RotatedDomain:
  """One domain: images rotated by ``angle`` and their split among clients.

  Attributes:
    angle: rotation in degrees.
    x: ``[n, H, W, C]`` rotated images.
    y: ``[n]`` int32 labels.
    source_index: ``[n]`` index of each example in the source dataset.
    support: per client, indices into ``x`` of its support set.
    query: per client, indices into ``x`` of its query set.
  """

  angle: float
  x: np.ndarray
  y: np.ndarray
  source_index: np.ndarray
  support: tuple[np.ndarray, ...]
  query: tuple[np.ndarray, ...]

  @property
  def num_clients(self) -> int:
    return len(self.support)


def rotated_domains(dataset: Dataset,
                    angles: Sequence[float] = DEFAULT_ANGLES, *,
                    clients_per_domain: int = 1,
                    examples_per_client: int = 1000,
                    seed: int = 0,
                    shared_images: bool = False,
                    mode: str = "nearest") -> list[RotatedDomain]:
  """Builds one rotated domain per angle from an image dataset.

  Each domain takes ``clients_per_domain * examples_per_client`` examples
  drawn uniformly without replacement (disjoint across domains unless
  ``shared_images``), rotates them by its angle and deals them to its
  clients in consecutive blocks; a client's first ``ceil(m / 2)`` examples
  are its support set, the rest its query set.

  Raises:
    ValueError: non-image data, no angles, bad sizes, or too few examples.
  """
  if dataset.x.ndim not in (3, 4):
    raise ValueError(f"rotated domains need images [n, H, W(, C)], got "
                     f"{dataset.name!r} with shape {dataset.x.shape}")
  if not angles:
    raise ValueError("angles must name at least one domain")
  if clients_per_domain < 1 or examples_per_client < 2:
    raise ValueError("clients_per_domain must be >= 1 and "
                     "examples_per_client >= 2, got "
                     f"{clients_per_domain} and {examples_per_client}")
  per_domain = clients_per_domain * examples_per_client
  needed = per_domain if shared_images else per_domain * len(angles)
  if needed > dataset.num_examples:
    raise ValueError(
        f"{len(angles)} domains of {clients_per_domain} x "
        f"{examples_per_client} examples need {needed} examples"
        f"{'' if shared_images else ' (disjoint across domains)'}; "
        f"{dataset.name!r} has {dataset.num_examples}")
  order = np.random.default_rng(seed).permutation(dataset.num_examples)
  x = dataset.x if dataset.x.ndim == 4 else dataset.x[..., None]
  half = -(-examples_per_client // 2)
  domains = []
  for d, angle in enumerate(angles):
    start = 0 if shared_images else d * per_domain
    index = np.sort(order[start:start + per_domain])
    blocks = [np.arange(k * examples_per_client,
                        (k + 1) * examples_per_client)
              for k in range(clients_per_domain)]
    domains.append(RotatedDomain(
        angle=float(angle),
        x=rotate_images(x[index], float(angle), mode=mode),
        y=np.asarray(dataset.y[index], np.int32),
        source_index=index,
        support=tuple(b[:half] for b in blocks),
        query=tuple(b[half:] for b in blocks)))
  return domains


def _client_data(domains: Sequence[RotatedDomain], pad_to: int) -> ClientData:
  x = np.concatenate([d.x for d in domains])
  y = np.concatenate([d.y for d in domains])
  offsets = np.cumsum([0] + [len(d.y) for d in domains])
  support = [s + o for d, o in zip(domains, offsets) for s in d.support]
  query = [q + o for d, o in zip(domains, offsets) for q in d.query]
  return ClientData(
      support=pad_stack(x, y, support, pad_to=pad_to),
      query=pad_stack(x, y, query, pad_to=pad_to),
      num_examples=jnp.asarray([len(s) + len(q)
                                for s, q in zip(support, query)],
                               jnp.float32))


def leave_one_out(domains: Sequence[RotatedDomain], held_out: int
                 ) -> tuple[ClientData, ClientData]:
  """Leave-one-domain-out split.

  Args:
    domains: from ``rotated_domains``.
    held_out: index into ``domains`` of the test domain.

  Returns:
    ``(train, test)``: ``ClientData`` of the clients of every other domain
    (domain order, then client order) and of the held-out domain's clients;
    both padded to the same length (the longest support or query set).
  """
  if not 0 <= held_out < len(domains):
    raise ValueError(f"held_out must index one of the {len(domains)} "
                     f"domains, got {held_out}")
  if len(domains) < 2:
    raise ValueError("leave-one-out needs at least 2 domains")
  pad_to = max(len(s) for d in domains for s in d.support + d.query)
  train = [d for i, d in enumerate(domains) if i != held_out]
  return _client_data(train, pad_to), _client_data([domains[held_out]],
                                                    pad_to)


def pool_clients(clients: ClientData) -> Batch:
  """Every client's support and query rows as ONE batch ``[2 C P, ...]``.

  Padding rows stay (mask 0), so shapes are static; e.g. the held-out
  domain's data for ``fedoa.make_evaluate_personal``.
  """
  def flat(leaf):
    return leaf.reshape((-1,) + leaf.shape[2:])
  return jax.tree.map(lambda s, q: jnp.concatenate([flat(s), flat(q)]),
                      dict(clients.support), dict(clients.query))
