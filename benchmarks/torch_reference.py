"""A per-client sequential PyTorch AugFL round: the reference being timed.

What the authors' public PyTorch code does, written as directly as PyTorch
allows: for each client in turn, four gradient evaluations with
``torch.autograd.grad`` and a finite-difference Hessian-vector product
(Eqs. (7), (10), (11), (12) of AugFL Algorithm 1), then the server's Eq. (13).

The models mirror ``augfl_jax.models`` exactly (same parameter shapes and
order, NHWC flattening in the CNN, PyTorch-style padding in the ResNet) and
use training-mode batch norm without running statistics. There is no
masking: the benchmark gives every client the same number of real examples
(no padding), so masked and unmasked batch norm agree. ``from_jax`` converts
a JAX parameter tree, so both sides run from identical weights and data and
``tests/test_benchmarks.py`` can check that they compute the same round.

``augfl_round_vmap`` is the same round written with ``torch.func``: one
client's step with ``torch.func.grad`` lifted over the client axis by
``torch.func.vmap`` (PyTorch's counterpart of ``jax.vmap`` over
``augfl.client_update``). Both run on whatever device their tensors are on
(``benchmarks.cells.torch_reference`` puts them on CUDA when it is there).

Importing this module needs ``torch`` (an optional extra: ``bench``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

TorchParams = list[torch.Tensor]
Forward = Callable[[TorchParams, torch.Tensor], torch.Tensor]


def _conv_weight(kernel: np.ndarray) -> torch.Tensor:
  """HWIO (flax) -> OIHW (torch)."""
  return torch.from_numpy(np.ascontiguousarray(
      np.transpose(np.asarray(kernel), (3, 2, 0, 1))))


def _vec(v: Any) -> torch.Tensor:
  return torch.from_numpy(np.array(v, np.float32))


def _bn(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
        ) -> torch.Tensor:
  return F.batch_norm(x, None, None, scale, bias, training=True, eps=1e-5)


def cnn_from_jax(params: Any) -> tuple[TorchParams, Forward]:
  """``augfl_jax.models.CNN(norm="batch")`` in PyTorch (any widths).

  Returns ``(params, forward)`` with ``forward(params, x [n, H, W, C]) ->
  logits [n, K]``; the input is NHWC as in JAX and permuted once.
  """
  flat: TorchParams = []
  stages = sum(1 for k in params if k.startswith("conv"))
  for i in range(stages):
    flat += [_conv_weight(params[f"conv{i + 1}"]["kernel"]),
             _vec(params[f"norm{i + 1}"]["scale"]),
             _vec(params[f"norm{i + 1}"]["bias"])]
  for name in ("fc", "head"):
    flat += [torch.from_numpy(np.ascontiguousarray(
        np.asarray(params[name]["kernel"]).T)), _vec(params[name]["bias"])]

  def forward(p: TorchParams, x: torch.Tensor) -> torch.Tensor:
    x = x.permute(0, 3, 1, 2)
    for i in range(stages):
      w, s, b = p[3 * i:3 * i + 3]
      x = F.max_pool2d(F.relu(_bn(F.conv2d(x, w, padding=1), s, b)), 2)
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # NHWC flatten as JAX
    x = F.relu(F.linear(x, p[-4], p[-3]))
    return F.linear(x, p[-2], p[-1])

  return flat, forward


def resnet_from_jax(params: Any, depth: int = 8,
                    num_filters: Sequence[int] = (32, 64, 128, 256)
                    ) -> tuple[TorchParams, Forward]:
  """``augfl_jax.models.ResNet`` (norm="batch"; default resnet8x4) in torch."""
  flat: TorchParams = []
  plan = []  # per block: (index of its first param, stride, has_shortcut)

  def add_conv_bn(conv: Any, norm: Any) -> None:
    flat.extend([_conv_weight(conv["kernel"]), _vec(norm["scale"]),
                 _vec(norm["bias"])])

  add_conv_bn(params["conv1"], params["norm1"])
  blocks = (depth - 2) // 6
  inplanes = num_filters[0]
  for stage, (width, stride) in enumerate(zip(num_filters[1:], (1, 2, 2))):
    for b in range(blocks):
      block = params[f"layer{stage + 1}_{b}"]
      s = stride if b == 0 else 1
      shortcut = s != 1 or inplanes != width
      plan.append((len(flat), s, shortcut))
      add_conv_bn(block["conv1"], block["norm1"])
      add_conv_bn(block["conv2"], block["norm2"])
      if shortcut:
        add_conv_bn(block["shortcut_conv"], block["shortcut_norm"])
      inplanes = width
  flat += [torch.from_numpy(np.ascontiguousarray(
      np.asarray(params["fc"]["kernel"]).T)), _vec(params["fc"]["bias"])]

  def forward(p: TorchParams, x: torch.Tensor) -> torch.Tensor:
    x = x.permute(0, 3, 1, 2)
    x = F.relu(_bn(F.conv2d(x, p[0], padding=1), p[1], p[2]))
    for start, s, shortcut in plan:
      w1, s1, b1, w2, s2, b2 = p[start:start + 6]
      y = F.relu(_bn(F.conv2d(x, w1, stride=s, padding=1), s1, b1))
      y = _bn(F.conv2d(y, w2, padding=1), s2, b2)
      if shortcut:
        ws, ss, bs = p[start + 6:start + 9]
        x = _bn(F.conv2d(x, ws, stride=s), ss, bs)
      x = F.relu(y + x)
    return F.linear(x.mean(dim=(2, 3)), p[-2], p[-1])

  return flat, forward


def from_jax(model_name: str, params: Any) -> tuple[TorchParams, Forward]:
  """``(torch params, forward)`` mirroring ``create_model(model_name, ...)``."""
  if model_name in ("cnn", "cnn_dense16", "tiny_cnn"):
    return cnn_from_jax(params)
  if model_name == "resnet8x4":
    return resnet_from_jax(params, 8, (32, 64, 128, 256))
  raise ValueError(f"no PyTorch mirror of model {model_name!r}")


def _grad(forward: Forward, p: TorchParams, x: torch.Tensor,
          y: torch.Tensor) -> TorchParams:
  p = [t.detach().requires_grad_(True) for t in p]
  loss = F.cross_entropy(forward(p, x), y)
  return list(torch.autograd.grad(loss, p))


def client_update(forward: Forward, theta: TorchParams, dual: TorchParams,
                  support: tuple[torch.Tensor, torch.Tensor],
                  query: tuple[torch.Tensor, torch.Tensor], *, weight: float,
                  alpha: float, rho: float, delta: float
                  ) -> tuple[TorchParams, TorchParams]:
  """One client, Eqs. (7), (10), (11), (12); returns ``(theta_i, new_dual)``."""
  g_s = _grad(forward, theta, *support)
  with torch.no_grad():
    phi = [t - alpha * g for t, g in zip(theta, g_s)]
  r = _grad(forward, phi, *query)
  with torch.no_grad():
    plus = [t + delta * v for t, v in zip(theta, r)]
    minus = [t - delta * v for t, v in zip(theta, r)]
  g_plus = _grad(forward, plus, *support)
  g_minus = _grad(forward, minus, *support)
  with torch.no_grad():
    theta_i, new_dual = [], []
    for t, y, rv, gp, gm in zip(theta, dual, r, g_plus, g_minus):
      g = (gp - gm) / (2.0 * delta)
      ti = t - (y + weight * (rv - alpha * g)) / rho
      theta_i.append(ti)
      new_dual.append(y + rho * (ti - t))
  return theta_i, new_dual


def augfl_round(forward: Forward, theta: TorchParams,
                duals: list[TorchParams], clients: list[tuple], *,
                weights: Sequence[float], alpha: float, rho: float,
                delta: float) -> tuple[TorchParams, list[TorchParams]]:
  """All clients in sequence, then Eq. (13) with lambda = 0.

  ``clients[i] = ((x_s, y_s), (x_q, y_q))``; returns ``(theta^{t+1}, duals)``.
  """
  total = [torch.zeros_like(t) for t in theta]
  new_duals = []
  for (support, query), dual, w in zip(clients, duals, weights):
    theta_i, y = client_update(forward, theta, dual, support, query,
                               weight=w, alpha=alpha, rho=rho, delta=delta)
    with torch.no_grad():
      for acc, ti, yi in zip(total, theta_i, y):
        acc.add_(yi + rho * ti)
    new_duals.append(y)
  return [acc / (rho * len(clients)) for acc in total], new_duals


def _functional_client(forward: Forward, alpha: float, rho: float,
                       delta: float) -> Callable[..., tuple]:
  """One client's Eqs. (7), (10)-(12) with ``torch.func.grad``: a pure
  function of tensors, so that ``torch.func.vmap`` can lift it."""
  from torch.func import grad  # pylint: disable=g-import-not-at-top

  def loss(params, x, y):
    return F.cross_entropy(forward(params, x), y)

  g = grad(loss)

  def client(theta, dual, xs, ys, xq, yq, weight):
    g_s = g(theta, xs, ys)
    phi = [t - alpha * a for t, a in zip(theta, g_s)]
    r = g(phi, xq, yq)
    g_plus = g([t + delta * v for t, v in zip(theta, r)], xs, ys)
    g_minus = g([t - delta * v for t, v in zip(theta, r)], xs, ys)
    theta_i, new_dual = [], []
    for t, y, rv, gp, gm in zip(theta, dual, r, g_plus, g_minus):
      hvp = (gp - gm) / (2.0 * delta)
      ti = t - (y + weight * (rv - alpha * hvp)) / rho
      theta_i.append(ti)
      new_dual.append(y + rho * (ti - t))
    return theta_i, new_dual

  return client


def augfl_round_vmap(forward: Forward, theta: TorchParams,
                     duals: TorchParams, clients: tuple, *,
                     weights: torch.Tensor, alpha: float, rho: float,
                     delta: float) -> tuple[TorchParams, TorchParams]:
  """The round of ``augfl_round`` with ``torch.func.vmap`` over clients.

  ``duals``: the ``[C, ...]`` stacked y_i (one tensor per parameter);
  ``clients = (x_s [C, n, ...], y_s [C, n], x_q [C, n, ...], y_q [C, n])``;
  ``weights``: ``[C]``. Returns ``(theta^{t+1}, stacked new duals)``.
  """
  from torch.func import vmap  # pylint: disable=g-import-not-at-top
  client = _functional_client(forward, alpha, rho, delta)
  with torch.no_grad():
    thetas, new_duals = vmap(client, in_dims=(None, 0, 0, 0, 0, 0, 0))(
        theta, duals, *clients, weights)
    total = [(y + rho * t).sum(dim=0) for t, y in zip(thetas, new_duals)]
    return [acc / (rho * weights.shape[0]) for acc in total], new_duals


def to_jax_tree(model_name: str, flat: TorchParams, like: Any) -> Any:
  """Inverse of ``from_jax``: the torch parameters in ``like``'s tree layout."""
  import jax  # pylint: disable=g-import-not-at-top
  paths = _param_paths(model_name, like)
  out = jax.tree.map(lambda a: np.asarray(a).copy(), like)
  for (path, kind), t in zip(paths, flat):
    value = t.detach().cpu().numpy()
    if kind == "conv":
      value = np.transpose(value, (2, 3, 1, 0))
    elif kind == "dense":
      value = value.T
    node = out
    for key in path[:-1]:
      node = node[key]
    node[path[-1]] = value
  return out


def _param_paths(model_name: str, params: Any) -> list[tuple[tuple, str]]:
  """The (tree path, kind) of each entry of ``from_jax``'s flat list."""
  paths: list[tuple[tuple, str]] = []

  def conv_bn(prefix: tuple, conv: str, norm: str) -> None:
    paths.extend([(prefix + (conv, "kernel"), "conv"),
                  (prefix + (norm, "scale"), "vec"),
                  (prefix + (norm, "bias"), "vec")])

  if model_name in ("cnn", "cnn_dense16", "tiny_cnn"):
    i = 1
    while f"conv{i}" in params:
      conv_bn((), f"conv{i}", f"norm{i}")
      i += 1
    for name in ("fc", "head"):
      paths.extend([((name, "kernel"), "dense"), ((name, "bias"), "vec")])
    return paths
  conv_bn((), "conv1", "norm1")
  names = sorted((k for k in params if k.startswith("layer")),
                 key=lambda k: tuple(int(v) for v in k[5:].split("_")))
  for name in names:
    conv_bn((name,), "conv1", "norm1")
    conv_bn((name,), "conv2", "norm2")
    if "shortcut_conv" in params[name]:
      conv_bn((name,), "shortcut_conv", "shortcut_norm")
  paths.extend([(("fc", "kernel"), "dense"), (("fc", "bias"), "vec")])
  return paths
