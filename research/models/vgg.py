"""VGG for 32×32 images (CIFAR): 3×3 conv → BatchNorm → ReLU stages, max-pooled, one linear head.

model_config fields: `depth` (11, 13, 16 or 19: the VGG paper's configurations A, B, D, E),
`width` (multiplies every conv's channels; 1.0 = 64…512), `num_classes`, `dtype`
('float32' or 'bfloat16' compute), `param_dtype` (params and BatchNorm statistics: 'float32';
'float64' with dtype 'float64' for the suite's equivalence checks, docs/testing.md).
"""

import functools

import flax.linen as nn
import jax.numpy as jnp

from research.cpu_forms import max_pool  # nn.max_pool, its gradient faster on CPU
from research.errors import UserError
from research.fields import View, in_ranges
from research.models.base import register

# Channels per conv; "M" is a 2×2 max-pool. Five pools take 32×32 down to 1×1.
STAGES = {
  11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
  13: [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
  16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
  19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M"]
  + [512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


class VGG(nn.Module):
  depth: int
  width: float
  num_classes: int
  axis_name: str | None = None
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    norm = functools.partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=0.9,
      epsilon=1e-5,
      axis_name=self.axis_name,  # batch statistics are averaged over all replicas
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      force_float32_reductions=self.param_dtype != jnp.float64,  # float64 params: float64 stats
    )
    x = x.astype(self.dtype)
    for layer in STAGES[self.depth]:
      if layer == "M":
        x = max_pool(x, 2)
      else:
        features = max(1, round(layer * self.width))
        conv = nn.Conv(
          features, (3, 3), use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype
        )
        x = nn.relu(norm()(conv(x)))
    x = x.reshape((x.shape[0], -1))  # [batch, channels]
    return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype)(x)


def check(model_config: View) -> None:
  """The fields this model declares: a depth of the paper's and a width > 0."""
  if model_config.depth not in STAGES:
    raise UserError(f"model.depth={model_config.depth} is not one of {sorted(STAGES)}")
  in_ranges(model_config, (("width", "> 0", lambda x: x > 0),))


@register("vgg", fields={"depth": 16, "width": 1.0, "param_dtype": "float32"}, check=check)
def create(model_config: View, axis_name: str | None) -> nn.Module:
  return VGG(
    depth=model_config.depth,
    width=model_config.width,
    num_classes=model_config.num_classes,
    axis_name=axis_name,
    dtype=jnp.dtype(model_config.dtype),
    param_dtype=jnp.dtype(model_config.param_dtype),
  )
