"""benchmarks.conv_forms: the convolution forms it times compute the same
gradient, and the command reports each form per process."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from augfl_jax.models import conv
from benchmarks import conv_forms


def test_the_xla_forward_conv_has_the_patches_values_and_gradients():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 7, 7, 3)), jnp.float32)
  kernel = jnp.asarray(rng.standard_normal((3, 3, 3, 4)), jnp.float32)
  pads = ((1, 1), (1, 1))

  def loss(conv_fn, x, kernel):
    return jnp.sum(jnp.sin(conv_fn(x, kernel, (1, 1), pads)))

  np.testing.assert_allclose(
      conv_forms.xla_forward_conv(x, kernel, (1, 1), pads),
      conv.conv_patches(x, kernel, (1, 1), pads), rtol=1e-5, atol=1e-5)
  for got, want in zip(
      jax.grad(loss, (1, 2))(conv_forms.xla_forward_conv, x, kernel),
      jax.grad(loss, (1, 2))(conv.conv_patches, x, kernel)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # ... and it is not the patches' forward under another name.
  hlo = jax.jit(lambda x, k: conv_forms.xla_forward_conv(
      x, k, (1, 1), pads)).lower(x, kernel).as_text()
  assert "convolution" in hlo


def test_each_form_is_timed_one_call_and_scanned_with_its_gradient():
  out = conv_forms.measure("tiny_cnn", batch=3, scan=2, repeats=1)
  assert set(out["median_s"]) == {f"{form}/{way}" for form in conv_forms.FORMS
                                  for way in ("one", "scan")}
  assert all(s > 0 for s in out["median_s"].values())
  assert out["matmul_gflop"] > 0
  assert out["gradient_difference"]["patches"] == 0.0
  for form in ("xla", "xla_forward"):
    assert 0 < out["gradient_difference"][form] < 1e-4


def test_run_measures_each_xla_flags_item_in_its_own_process(tmp_path,
                                                              capsys):
  class Flags:
    model, batch, scan, repeats = "tiny_cnn", 2, 1, 1
    xla_flags = ["", "--xla_cpu_use_thunk_runtime=true"]
    output = str(tmp_path / "forms.json")
  out = conv_forms.run(Flags)
  assert [p["xla_flags"] for p in out["processes"]] == Flags.xla_flags
  assert "XLA_FLAGS='--xla_cpu_use_thunk_runtime=true'" in (
      capsys.readouterr().out)
  assert (tmp_path / "forms.json").exists()


def test_a_process_that_xla_refuses_is_named(tmp_path):
  class Flags:
    model, batch, scan, repeats = "tiny_cnn", 2, 1, 1
    xla_flags = ["--xla_cpu_no_such_flag=1"]
    output = ""
  with pytest.raises(ValueError, match="XLA_FLAGS='--xla_cpu_no_such_flag=1' "
                     "ended with code"):
    conv_forms.run(Flags)
