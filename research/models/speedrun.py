"""The network of the fastest known CIFAR-10 training: airbench94_muon (K. Jordan,
github.com/KellerJordan/cifar10-airbench; the method in arXiv 2404.00498).

A 2×2 patch-whitening convolution whose filters come from the training images
(`init_from_data`; the config's parameter groups freeze them) → GELU → three conv groups
(conv, 2×2 max-pool, BatchNorm, GELU, conv, BatchNorm, GELU) → 3×3 max-pool → a bias-free
linear head whose logits are divided by its width. Convolution kernels start as identities on
their first `in` filters (Dirac), the rest as PyTorch initialises them; BatchNorm has no scale
(it stays 1), eps 1e-12, and its running averages keep 0.6 of themselves at each step
(`norm_momentum`); `activation` "silu" puts SiLU in the conv groups (hiverge's recipe).

model_config fields: num_classes; widths (the three groups' channels); whiten_eps (added to
the patch covariance's eigenvalues); init_examples (from how many training images, a random
sample, the whitening is computed); dtype ('float32' | 'bfloat16' compute; logits are at least
float32); param_dtype (parameters and BatchNorm statistics: 'float32'; 'float64' with dtype
'float64' for the suite's equivalence checks, docs/testing.md); activation, norm_momentum.
Each declared with its default (`register(..., fields=)`): runs recorded before a field was
have it so.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from research.cpu_forms import max_pool  # nn.max_pool, its gradient faster on CPU
from research.errors import UserError
from research.fields import View, in_ranges
from research.models.base import at_least_float32, register

WHITEN = 2  # pixels per side of the whitening patches


def _torch_uniform(key, shape, dtype, fan_in: int):
  """PyTorch's default init of conv and linear layers: uniform in ±1/sqrt(fan_in)."""
  bound = 1 / np.sqrt(fan_in)
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def dirac_init(key, shape, dtype=jnp.float32):
  """[kh, kw, in, out]: PyTorch's default init, its first `in` output filters replaced by
  identities (the centre tap of input channel i feeds output channel i)."""
  kh, kw, channels, features = shape
  kernel = _torch_uniform(key, shape, dtype, kh * kw * channels)
  n = min(channels, features)
  identity = jnp.zeros((kh, kw, channels, n), dtype).at[kh // 2, kw // 2].set(jnp.eye(channels, n))
  return kernel.at[..., :n].set(identity)


def unit_std_init(key, shape, dtype=jnp.float32):
  """Uniform with standard deviation 1: the head as airbench rescales PyTorch's init."""
  return jax.random.uniform(key, shape, dtype, -np.sqrt(3), np.sqrt(3))


ACTIVATIONS = {"gelu": functools.partial(nn.gelu, approximate=False), "silu": nn.silu}


class ConvGroup(nn.Module):
  features: int
  norm: functools.partial
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  activation: str = "gelu"

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(
      nn.Conv,
      self.features,
      (3, 3),
      use_bias=False,
      kernel_init=dirac_init,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
    )
    act = ACTIVATIONS[self.activation]
    x = max_pool(conv(name="conv1")(x), 2)
    x = act(self.norm(name="norm1")(x))
    return act(self.norm(name="norm2")(conv(name="conv2")(x)))


class SpeedrunNet(nn.Module):
  num_classes: int
  widths: tuple
  axis_name: str | None = None
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  activation: str = "gelu"  # the conv groups' (ACTIVATIONS); after the whitening, GELU
  norm_momentum: float = 0.6  # what BatchNorm's running averages keep of themselves a step

  @nn.compact
  def __call__(self, x, train: bool):
    norm = functools.partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=self.norm_momentum,
      epsilon=1e-12,
      use_scale=False,
      axis_name=self.axis_name,  # statistics over the global batch
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      force_float32_reductions=self.param_dtype != jnp.float64,  # float64 params: float64 stats
    )
    channels = 2 * x.shape[-1] * WHITEN**2  # each eigenvector and its negative
    fan_in = x.shape[-1] * WHITEN**2
    whiten = nn.Conv(
      channels,
      (WHITEN, WHITEN),
      padding="VALID",
      bias_init=lambda key, shape, dtype: _torch_uniform(key, shape, dtype, fan_in),
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="whiten",
    )
    x = nn.gelu(whiten(x.astype(self.dtype)), approximate=False)  # [batch, 31, 31, 24]
    for i, width in enumerate(self.widths):  # 31 → 15 → 7 → 3 pixels
      x = ConvGroup(
        width, norm, self.dtype, self.param_dtype, self.activation, name=f"group{i + 1}"
      )(x)
    x = max_pool(x, 3).reshape(x.shape[0], -1)  # [batch, widths[-1]]
    head = nn.Dense(
      self.num_classes,
      use_bias=False,
      kernel_init=unit_std_init,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="head",
    )
    logits = head(x) / x.shape[-1]
    return logits.astype(at_least_float32(logits))


def data_statistics(model_config, images):
  """Each image's 2×2 patches (on the device, float32): their mean [N, 12] and their
  covariance about it [N, 12, 12], over (row, column, channel).

  The filters divide by the roots of eigenvalues 1e5 times smaller than the largest, so they
  move by 2e-4 with a covariance merely rounded to float32: the sums are kept short instead.
  Each image's patches are centred and summed a row of patches at a time, then the rows, and
  `init_from_data` sums the images in float64: within 1e-4 of a float64 computation
  (tests/test_speedrun.py; one float32 product over all patches misses by 2e-3).
  """
  n, h, w, channels = images.shape
  rows, columns = h - WHITEN + 1, w - WHITEN + 1
  views = [images[:, i : i + rows, j : j + columns] for i in range(WHITEN) for j in range(WHITEN)]
  patches = jnp.stack(views, axis=3).reshape(n, rows, columns, WHITEN * WHITEN * channels)
  mean = patches.mean(axis=(1, 2))
  centred = patches - mean[:, None, None]
  per_row = jnp.einsum("nrpi,nrpj->nrij", centred, centred, precision=lax.Precision.HIGHEST)
  return {"mean": mean, "covariance": per_row.sum(axis=1) / (rows * columns)}


def init_from_data(model_config, params, statistics):
  """`params` with the whitening filters computed from the training images' `statistics`
  (`data_statistics`): the eigenvectors of the 2×2 patches' covariance (about zero), each
  divided by the root of its eigenvalue (+ whiten_eps), and their negatives."""
  mean = np.asarray(statistics["mean"], np.float64)
  per_image = np.asarray(statistics["covariance"], np.float64) + mean[:, :, None] * mean[:, None]
  covariance = per_image.mean(axis=0)  # [12, 12]
  channels = mean.shape[1] // WHITEN**2
  eigenvalues, eigenvectors = np.linalg.eigh(covariance)
  scaled = eigenvectors / np.sqrt(eigenvalues + model_config.whiten_eps)  # a filter per column
  kernel = np.concatenate([scaled, -scaled], axis=1).reshape(WHITEN, WHITEN, channels, -1)
  whiten = {**params["whiten"], "kernel": jnp.asarray(kernel, model_config.param_dtype)}
  return {**params, "whiten": whiten}


RANGES = (
  ("whiten_eps", "> 0", lambda x: x > 0),
  ("init_examples", ">= 1", lambda x: x >= 1),
)


def check(model_config: View) -> None:
  """The fields this model declares: the whitening's numbers and a known activation."""
  in_ranges(model_config, RANGES)
  if model_config.activation not in ACTIVATIONS:
    raise UserError(
      f"{model_config.name_of('activation')}={model_config.activation!r} is not one of "
      + ", ".join(map(repr, ACTIVATIONS))
    )


@register(
  "speedrun",
  fields={
    "widths": (64, 256, 256),
    "whiten_eps": 5e-4,
    "init_examples": 5000,
    "activation": "gelu",
    "norm_momentum": 0.6,
    "param_dtype": "float32",
  },
  check=check,
  data_statistics=data_statistics,
  init_from_data=init_from_data,
)
def create(model_config: View, axis_name: str | None) -> nn.Module:
  return SpeedrunNet(
    num_classes=model_config.num_classes,
    widths=tuple(model_config.widths),
    axis_name=axis_name,
    dtype=jnp.dtype(model_config.dtype),
    param_dtype=jnp.dtype(model_config.param_dtype),
    activation=model_config.activation,
    norm_momentum=model_config.norm_momentum,
  )
