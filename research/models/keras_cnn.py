"""The Keras `cifar10_cnn.py` example network, as used in the Keras multi-GPU write-up.

conv32(SAME)-conv32(VALID)-pool-dropout.25-conv64(SAME)-conv64(VALID)-pool-dropout.25-
dense512-dropout.5-dense10, ReLU everywhere: 1,250,858 parameters at 32×32×3 and 10 classes.
model_config fields: `num_classes`, `dtype`, `param_dtype` ('float32'; 'float64' for the
suite's equivalence checks). No BatchNorm, so `axis_name` is unused.
"""

import functools

import flax.linen as nn
import jax.numpy as jnp

from research.cpu_forms import max_pool  # nn.max_pool, its gradient faster on CPU
from research.fields import View
from research.models.base import register


class KerasCNN(nn.Module):
  num_classes: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    conv = functools.partial(nn.Conv, dtype=self.dtype, param_dtype=self.param_dtype)
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    x = x.astype(self.dtype)
    for features in (32, 64):
      x = nn.relu(conv(features, (3, 3), padding="SAME")(x))
      x = nn.relu(conv(features, (3, 3), padding="VALID")(x))
      x = max_pool(x, 2)
      x = nn.Dropout(0.25, deterministic=not train)(x)
    x = x.reshape((x.shape[0], -1))  # [batch, 6 * 6 * 64] at 32×32 input
    x = nn.relu(dense(512)(x))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return dense(self.num_classes)(x)


@register("keras_cnn", fields={"param_dtype": "float32"})
def create(model_config: View, axis_name: str | None) -> nn.Module:
  del axis_name  # no BatchNorm
  return KerasCNN(
    num_classes=model_config.num_classes,
    dtype=jnp.dtype(model_config.dtype),
    param_dtype=jnp.dtype(model_config.param_dtype),
  )
