"""The authors' client CNNs: parameter counts, and the same outputs as a
PyTorch transcription of their modules (zerui981105/AugFL
src/baseModel_fmnist.py and src/baseModel.py) on the same weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax import models
from augfl_jax.models import authors

torch = pytest.importorskip("torch")
nn = torch.nn


class FmnistBaseModel(nn.Module):
  """src/baseModel_fmnist.py's BaseModel, its forward as written."""

  def __init__(self):
    super().__init__()
    self.active_func = nn.ELU()
    self.conv_1 = nn.Conv2d(1, 32, kernel_size=3, stride=1, padding="same",
                            bias=True)
    self.pool_1 = nn.MaxPool2d(kernel_size=(3, 3), stride=(2, 2),
                               ceil_mode=True)
    self.conv_2 = nn.Conv2d(32, 64, kernel_size=3, stride=1, padding="same",
                            bias=True)
    self.pool_2 = nn.MaxPool2d(kernel_size=(3, 3), stride=(2, 2),
                               ceil_mode=True)
    self.linear = nn.Linear(3136, 10)
    for m in self.modules():
      if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.trunc_normal_(m.weight, std=0.1, a=-0.2, b=0.2)
        nn.init.constant_(m.bias, val=0.1)

  def forward(self, x):
    x = self.pool_1(self.active_func(self.conv_1(x)))
    x = self.pool_2(self.active_func(self.conv_2(x)))
    s = x.size()
    return self.linear(x.reshape(-1, s[1] * s[2] * s[3]))


class CifarBaseModel(nn.Module):
  """src/baseModel.py's BaseModel (active_func: max(x, 0.2 x))."""

  def __init__(self):
    super().__init__()
    self.conv_1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, padding="same")
    self.pool_1 = nn.MaxPool2d(kernel_size=(3, 3), stride=(2, 2),
                               ceil_mode=True)
    self.conv_2 = nn.Conv2d(32, 64, kernel_size=3, stride=1, padding="same")
    self.pool_2 = nn.MaxPool2d(kernel_size=(3, 3), stride=(2, 2),
                               ceil_mode=True)
    self.conv_3 = nn.Conv2d(64, 128, kernel_size=3, stride=1, padding="same")
    self.avgpool = nn.AvgPool2d(kernel_size=(3, 3), stride=(2, 2),
                                ceil_mode=True)
    self.linear = nn.Linear(2048, 10)
    for m in self.modules():
      if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.normal_(m.weight, std=0.1)
        nn.init.constant_(m.bias, val=0.1)

  def forward(self, x):
    act = lambda v: torch.maximum(v, 0.2 * v)
    x = self.pool_1(act(self.conv_1(x)))
    x = self.pool_2(act(self.conv_2(x)))
    x = self.avgpool(act(self.conv_3(x)))
    s = x.size()
    feat = x.reshape(-1, s[1] * s[2] * s[3])
    return feat, self.linear(feat)


CASES = [("authors_fmnist_cnn", FmnistBaseModel, (28, 28, 1), 50186),
         ("authors_cifar_cnn", CifarBaseModel, (32, 32, 3), 113738)]


@pytest.mark.parametrize("name,torch_model,shape,count", CASES)
def test_parameter_counts(name, torch_model, shape, count):
  model = models.create_model(name, 10)
  params = models.init_params(model, jax.random.key(0), shape)
  assert models.num_params(params) == count
  assert sum(p.numel() for p in torch_model().parameters()) == count


@pytest.mark.parametrize("conv_impl", ["xla", "patches"])
@pytest.mark.parametrize("name,torch_model,shape,count", CASES)
def test_outputs_equal_the_authors_module(name, torch_model, shape, count,
                                          conv_impl):
  del count
  torch.manual_seed(0)
  module = torch_model()
  state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
  params = authors.params_from_torch(state)
  x = np.random.default_rng(1).normal(size=(5,) + shape).astype(np.float32)
  expected = module(torch.from_numpy(x.transpose(0, 3, 1, 2)))
  features, logits = models.create_model(name, 10, conv_impl=conv_impl).apply(
      {"params": params}, jnp.asarray(x))
  if isinstance(expected, tuple):
    np.testing.assert_allclose(features, expected[0].detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    expected = expected[1]
  np.testing.assert_allclose(logits, expected.detach().numpy(), rtol=1e-4,
                             atol=1e-5)
  back = authors.params_to_torch(params)
  assert all(np.array_equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("kind,size", [("max", 28), ("max", 14), ("avg", 8),
                                       ("avg", 7), ("max", 9)])
def test_pool_ceil_is_pytorchs(kind, size):
  x = np.random.default_rng(2).normal(size=(2, size, size, 3)).astype(
      np.float32)
  pool = (nn.MaxPool2d if kind == "max" else nn.AvgPool2d)(
      3, 2, ceil_mode=True)
  expected = pool(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
  np.testing.assert_allclose(
      authors.pool_ceil(jnp.asarray(x), 3, 2, kind),
      expected.transpose(0, 2, 3, 1), rtol=1e-6, atol=1e-6)


def test_initialisation_is_the_authors():
  params = models.init_params(models.create_model("authors_fmnist_cnn", 10),
                              jax.random.key(3), (28, 28, 1))
  kernel = np.asarray(params["linear"]["kernel"])
  assert np.abs(kernel).max() <= 0.2
  assert 0.085 < kernel.std() < 0.09  # std 0.1 truncated at 2 sigma: 0.088
  for layer in params.values():
    np.testing.assert_array_equal(layer["bias"], np.float32(0.1))
  cifar = models.init_params(models.create_model("authors_cifar_cnn", 10),
                             jax.random.key(3), (32, 32, 3))
  assert np.abs(np.asarray(cifar["conv_3"]["kernel"])).max() > 0.3


def test_padded_rows_change_nothing():
  model = models.create_model("authors_fmnist_cnn", 10)
  params = models.init_params(model, jax.random.key(0), (28, 28, 1))
  x = jax.random.normal(jax.random.key(1), (4, 28, 28, 1))
  padded = jnp.concatenate([x, jnp.full((2, 28, 28, 1), jnp.inf)])
  mask = jnp.array([1, 1, 1, 1, 0, 0], jnp.float32)
  _, logits = model.apply({"params": params}, x)
  _, padded_logits = model.apply({"params": params}, padded, mask=mask)
  np.testing.assert_allclose(padded_logits[:4], logits, rtol=1e-6)
  assert np.isfinite(np.asarray(padded_logits)).all()
