"""Inception-v3 (Szegedy et al. 2015, "Rethinking the Inception Architecture"), as in Keras
applications `InceptionV3` and TF-slim `inception_v3`.

299×299 input → stem → 3 × Inception-A (35×35) → grid reduction → 4 × Inception-B with
factorised 1×7/7×1 convolutions (17×17) → grid reduction → 2 × Inception-C (8×8) → global
average pool → dropout → dense. Every convolution has no bias and is followed by BatchNorm
without scale (epsilon 1e-3) and ReLU. At 1000 classes without the auxiliary head this has
Keras' 23,817,352 trainable parameters and 34,432 BatchNorm statistics.

model_config fields:
  num_classes; dtype ('float32' | 'bfloat16': compute dtype; logits are returned in at least
  float32); param_dtype (params and BatchNorm statistics: 'float32'); aux_logits (the
  auxiliary classifier on the 17×17 features, as in TF-slim; in training its logits are sown
  as `intermediates` `auxiliary_logits`, and the loss `auxiliary_cross_entropy` adds their
  cross-entropy weighted by the config's `aux_loss_weight`, 0.4 in the reference);
  dropout_rate (0.2 = slim's keep probability 0.8); bn_momentum (0.9997 as slim; Keras uses
  0.99); width (channel multiplier, 1.0 = the reference; smaller only for tests); blocks (how
  many Inception-A, -B and -C blocks: (3, 4, 2) is the reference; fewer, each type still
  present, only for tests).
"""

import functools

import flax.linen as nn
import jax.numpy as jnp

from research.errors import UserError
from research.fields import View, in_ranges
from research.models.base import at_least_float32, register


class ConvBN(nn.Module):
  """Convolution without bias → BatchNorm (no scale) → ReLU, Keras' `conv2d_bn`."""

  features: int
  kernel: tuple[int, int]
  strides: int = 1
  padding: str = "SAME"
  norm: functools.partial = None
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(
      self.features,
      self.kernel,
      strides=self.strides,
      padding=self.padding,
      use_bias=False,
      dtype=x.dtype,
      param_dtype=self.param_dtype,
    )(x)
    return nn.relu(self.norm()(x))


def _avg_pool_same(x):
  pooled = nn.avg_pool(x, (3, 3), strides=(1, 1), padding="SAME", count_include_pad=False)
  return pooled.astype(x.dtype)  # the divisor counts are float32; keep the compute dtype


def _max_pool_reduce(x):
  return nn.max_pool(x, (3, 3), strides=(2, 2), padding="VALID")


REFERENCE_BLOCKS = (3, 4, 2)  # Inception-A at 35×35, -B at 17×17, -C at 8×8


class InceptionV3(nn.Module):
  num_classes: int
  aux_logits: bool = True
  dropout_rate: float = 0.2
  bn_momentum: float = 0.9997
  width: float = 1.0
  blocks: tuple[int, int, int] = REFERENCE_BLOCKS
  axis_name: str | None = None
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def _conv(self, norm):
    def conv(x, features, kernel, strides=1, padding="SAME", name=None):
      features = max(1, round(features * self.width))
      return ConvBN(features, kernel, strides, padding, norm, self.param_dtype, name=name)(x)

    return conv

  @nn.compact
  def __call__(self, x, train: bool):
    norm = functools.partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=self.bn_momentum,
      epsilon=1e-3,
      use_scale=False,
      axis_name=self.axis_name,  # statistics averaged over all replicas
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      force_float32_reductions=self.param_dtype != jnp.float64,  # float64 params: float64 stats
    )
    conv = self._conv(norm)
    blocks = tuple(self.blocks)
    counts = zip(blocks, REFERENCE_BLOCKS, strict=True)  # zipped only once the lengths match
    if len(blocks) != len(REFERENCE_BLOCKS) or not all(1 <= n <= most for n, most in counts):
      raise UserError(
        f"model.blocks={blocks} must count 1-3 Inception-A, 1-4 Inception-B and 1-2 "
        f"Inception-C blocks; {REFERENCE_BLOCKS} is the reference"
      )
    if min(x.shape[1:3]) < 75:
      raise UserError(f"Inception-v3 needs images of at least 75×75; got {x.shape[1:3]}")
    x = x.astype(self.dtype)

    # Stem: 299 → 149 → 147 → 147 → 73 → 73 → 71 → 35.
    x = conv(x, 32, (3, 3), strides=2, padding="VALID")
    x = conv(x, 32, (3, 3), padding="VALID")
    x = conv(x, 64, (3, 3))
    x = _max_pool_reduce(x)
    x = conv(x, 80, (1, 1), padding="VALID")
    x = conv(x, 192, (3, 3), padding="VALID")
    x = _max_pool_reduce(x)

    for pool_features in (32, 64, 64)[: blocks[0]]:  # mixed0-2: Inception-A, 35×35
      x = jnp.concatenate(
        [
          conv(x, 64, (1, 1)),
          conv(conv(x, 48, (1, 1)), 64, (5, 5)),
          conv(conv(conv(x, 64, (1, 1)), 96, (3, 3)), 96, (3, 3)),
          conv(_avg_pool_same(x), pool_features, (1, 1)),
        ],
        axis=-1,
      )

    x = jnp.concatenate(  # mixed3: grid reduction 35 → 17
      [
        conv(x, 384, (3, 3), strides=2, padding="VALID"),
        conv(conv(conv(x, 64, (1, 1)), 96, (3, 3)), 96, (3, 3), strides=2, padding="VALID"),
        _max_pool_reduce(x),
      ],
      axis=-1,
    )

    for c7 in (128, 160, 160, 192)[: blocks[1]]:  # mixed4-7: Inception-B, factorised 1×7 / 7×1
      branch7x7 = conv(conv(conv(x, c7, (1, 1)), c7, (1, 7)), 192, (7, 1))
      branch7x7dbl = conv(x, c7, (1, 1))
      for features, kernel in ((c7, (7, 1)), (c7, (1, 7)), (c7, (7, 1)), (192, (1, 7))):
        branch7x7dbl = conv(branch7x7dbl, features, kernel)
      x = jnp.concatenate(
        [conv(x, 192, (1, 1)), branch7x7, branch7x7dbl, conv(_avg_pool_same(x), 192, (1, 1))],
        axis=-1,
      )

    aux = None
    if self.aux_logits and min(x.shape[1:3]) < 5:
      raise UserError(
        f"the auxiliary head needs images of at least 107×107 (its 5×5 pool sees "
        f"{x.shape[1]}×{x.shape[2]} features); set model.aux_logits=False or use larger images"
      )
    if self.aux_logits:  # on the 17×17×768 features, as TF-slim; built in eval mode too so
      # that init (which runs in eval mode) creates its parameters; sown in training only
      aux = nn.avg_pool(x, (5, 5), strides=(3, 3), padding="VALID")  # 17 → 5
      aux = conv(aux, 128, (1, 1), name="aux_conv0")
      aux = conv(aux, 768, aux.shape[1:3], padding="VALID", name="aux_conv1")  # 5×5 → 1×1
      aux_head = nn.Dense(
        self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype, name="aux_logits"
      )
      aux = aux_head(aux.mean((1, 2)))

    x = jnp.concatenate(  # mixed8: grid reduction 17 → 8
      [
        conv(conv(x, 192, (1, 1)), 320, (3, 3), strides=2, padding="VALID"),
        conv(
          conv(conv(conv(x, 192, (1, 1)), 192, (1, 7)), 192, (7, 1)),
          192,
          (3, 3),
          strides=2,
          padding="VALID",
        ),
        _max_pool_reduce(x),
      ],
      axis=-1,
    )

    for _ in range(blocks[2]):  # mixed9-10: Inception-C with 1×3 / 3×1 splits, 8×8
      branch3x3 = conv(x, 384, (1, 1))
      branch3x3dbl = conv(conv(x, 448, (1, 1)), 384, (3, 3))
      x = jnp.concatenate(
        [
          conv(x, 320, (1, 1)),
          conv(branch3x3, 384, (1, 3)),
          conv(branch3x3, 384, (3, 1)),
          conv(branch3x3dbl, 384, (1, 3)),
          conv(branch3x3dbl, 384, (3, 1)),
          conv(_avg_pool_same(x), 192, (1, 1)),
        ],
        axis=-1,
      )

    x = x.mean(axis=(1, 2))  # global average pool: [batch, 2048]
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    logits = nn.Dense(
      self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype, name="logits"
    )(x)
    kept = at_least_float32(logits)
    if train and aux is not None:  # for `loss`, below
      self.sow("intermediates", "auxiliary_logits", aux.astype(kept))
    return logits.astype(kept)


RANGES = (
  ("width", "> 0", lambda x: x > 0),
  ("bn_momentum", "in [0, 1)", lambda x: 0 <= x < 1),
  ("dropout_rate", "in [0, 1)", lambda x: 0 <= x < 1),
)


@register(
  "inception_v3",
  fields={
    "aux_logits": True,
    "dropout_rate": 0.2,
    "bn_momentum": 0.9997,
    "width": 1.0,
    "blocks": (3, 4, 2),
    "param_dtype": "float32",
  },
  check=lambda model_config: in_ranges(model_config, RANGES),  # the fields it declares
)
def create(model_config: View, axis_name: str | None) -> nn.Module:
  return InceptionV3(
    num_classes=model_config.num_classes,
    aux_logits=model_config.aux_logits,
    dropout_rate=model_config.dropout_rate,
    bn_momentum=model_config.bn_momentum,
    width=model_config.width,
    blocks=tuple(model_config.blocks),
    axis_name=axis_name,
    dtype=jnp.dtype(model_config.dtype),
    param_dtype=jnp.dtype(model_config.param_dtype),
  )
