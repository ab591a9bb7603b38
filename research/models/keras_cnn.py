"""The Keras `cifar10_cnn.py` example network, as used in the Keras multi-GPU write-up.

conv32(SAME)-conv32(VALID)-pool-dropout.25-conv64(SAME)-conv64(VALID)-pool-dropout.25-
dense512-dropout.5-dense10, ReLU everywhere: 1,250,858 parameters at 32×32×3 and 10 classes.
model_config fields: `num_classes`, `dtype`. No BatchNorm, so `axis_name` is unused.
"""

import flax.linen as nn
import jax.numpy as jnp

from research import models
from research.cpu_forms import max_pool  # nn.max_pool, its gradient faster on CPU
from research.fields import View


class KerasCNN(nn.Module):
  num_classes: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    x = x.astype(self.dtype)
    for features in (32, 64):
      x = nn.relu(nn.Conv(features, (3, 3), padding="SAME", dtype=self.dtype)(x))
      x = nn.relu(nn.Conv(features, (3, 3), padding="VALID", dtype=self.dtype)(x))
      x = max_pool(x, 2)
      x = nn.Dropout(0.25, deterministic=not train)(x)
    x = x.reshape((x.shape[0], -1))  # [batch, 6 * 6 * 64] at 32×32 input
    x = nn.relu(nn.Dense(512, dtype=self.dtype)(x))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return nn.Dense(self.num_classes, dtype=self.dtype)(x)


@models.register("keras_cnn")
def create(model_config: View, axis_name: str | None) -> nn.Module:
  del axis_name  # no BatchNorm
  return KerasCNN(num_classes=model_config.num_classes, dtype=jnp.dtype(model_config.dtype))
