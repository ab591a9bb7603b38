"""Layers the models share: convolution and pooling that run well on CPU, dropout that
micro-batches.

Profiled on a 2-core CPU (Keras CIFAR CNN, batch 128, per example): forward convolutions
1.9 ms, input gradients 0.5 ms, KERNEL gradients 7.8 ms. XLA:CPU lowers the kernel gradient
to a convolution whose contraction runs over batch × height × width, and it slows down as
the batch grows. Here that gradient is one matrix product instead: the kh × kw shifted
(strided) views of the padded input, stacked channels-first, times the output gradient,
contracting batch and space (3.4× faster at batch 128, 1.9× at 16, same value to float
rounding). The forward pass and the input gradient stay XLA's.

`Conv` is `nn.Conv` with that kernel gradient when JAX runs on CPU; elsewhere (cuDNN on
GPU) it is `nn.Conv` unchanged. Dilated, grouped or non-NHWC convolutions always use XLA's.
At stride 1, a convolution with less than SAME padding (VALID) runs as a SAME one cropped:
XLA:CPU ran the VALID forward pass ~3× slower per example than the SAME one of equal size.

`Dropout` draws each example's mask from the step's key and the example's index in the
device batch, so a step that splits its batch into micro-batches (research/steps.py) drops
exactly the units the whole batch would.
"""

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

NHWC = ("NHWC", "HWIO", "NHWC")


def _patches(lhs, kernel_hw, strides, pads):
  """The input pixels each kernel tap multiplies, stacked channels-first: [kh*kw*C, B, Ho, Wo].

  The input is moved channels-first by a product with the identity (exact: each output is one
  input times 1 plus zeros; an inf would make NaNs of its pixel's other channels). A product
  is never fused into its consumers, so the input is transposed once and each tap is a plain
  slice of it. A transpose instead was fused into all kh*kw slices, and an
  `optimization_barrier` did not stop that on XLA:CPU.
  """
  (kh, kw), (sh, sw) = kernel_hw, strides
  no_pad = (0, 0, 0)
  padded = lax.pad(lhs, jnp.zeros((), lhs.dtype), [no_pad, (*pads[0], 0), (*pads[1], 0), no_pad])
  b, h, w, c = padded.shape
  eye = jnp.eye(c, dtype=lhs.dtype)
  planes = lax.dot_general(eye, padded, (((1,), (3,)), ((), ())), precision="highest")  # [C,B,H,W]
  ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
  views = [
    lax.slice(
      planes, (0, 0, i, j), (c, b, i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1), (1, 1, sh, sw)
    )
    for i in range(kh)
    for j in range(kw)
  ]
  return views[0] if len(views) == 1 else lax.concatenate(views, 0)


def _forward(lhs, rhs, strides, pads, precision):
  """The convolution, in the form XLA:CPU runs fastest for its shape."""
  kh, kw, channels, features = rhs.shape
  if lhs.shape[1] < kh or lhs.shape[2] < kw:  # e.g. 3×3 on 2×2: XLA's generic loop, ~100× slower
    patches = _patches(lhs, (kh, kw), strides, pads)
    kernel = rhs.reshape(kh * kw * channels, features)
    return lax.dot_general(patches, kernel, (((0,), (0,)), ((), ())), precision=precision)
  conv = functools.partial(lax.conv_general_dilated, dimension_numbers=NHWC, precision=precision)
  same = [((k - 1) // 2, k // 2) for k in (kh, kw)]
  extra = [(s[0] - p[0], s[1] - p[1]) for s, p in zip(same, pads, strict=True)]
  if strides != (1, 1) or min(min(e) for e in extra) < 0 or max(max(e) for e in extra) == 0:
    return conv(lhs, rhs, strides, pads)
  out = conv(lhs, rhs, (1, 1), same)  # stride 1, less than SAME padding: SAME, cropped
  (top, bottom), (left, right) = extra
  return out[:, top : out.shape[1] - bottom, left : out.shape[2] - right]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv(lhs, rhs, strides, pads, precision):
  return _forward(lhs, rhs, strides, pads, precision)


def _conv_fwd(lhs, rhs, strides, pads, precision):
  return _forward(lhs, rhs, strides, pads, precision), (lhs, rhs)


def _conv_bwd(strides, pads, precision, residuals, g):
  lhs, rhs = residuals  # [B, H, W, C], [kh, kw, C, O]; g: [B, Ho, Wo, O]
  _, input_vjp = jax.vjp(lambda x: _forward(x, rhs, strides, pads, precision), lhs)
  (lhs_grad,) = input_vjp(g)  # XLA's transposed convolution (dead code for the first layer)
  kh, kw, channels, features = rhs.shape
  patches = _patches(lhs, (kh, kw), strides, pads)
  rhs_grad = lax.dot_general(patches, g, (((1, 2, 3), (0, 1, 2)), ((), ())), precision=precision)
  return lhs_grad, rhs_grad.reshape(kh, kw, channels, features).astype(rhs.dtype)


_conv.defvjp(_conv_fwd, _conv_bwd)


def conv_general_dilated(
  lhs,
  rhs,
  window_strides,
  padding,
  lhs_dilation=None,
  rhs_dilation=None,
  dimension_numbers=None,
  feature_group_count=1,
  batch_group_count=1,
  precision=None,
  preferred_element_type=None,
):
  """`lax.conv_general_dilated` with the matrix-product kernel gradient where it applies."""
  plain = (
    lhs.ndim == 4
    and all(d in (None, (1, 1)) for d in (lhs_dilation, rhs_dilation))
    and feature_group_count == batch_group_count == 1
    and preferred_element_type is None
    and lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    == lax.conv_dimension_numbers(lhs.shape, rhs.shape, NHWC)
  )
  if not plain:
    return lax.conv_general_dilated(
      lhs,
      rhs,
      window_strides,
      padding,
      lhs_dilation,
      rhs_dilation,
      dimension_numbers,
      feature_group_count,
      batch_group_count,
      precision,
      preferred_element_type,
    )
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
  pads = tuple(tuple(int(p) for p in pair) for pair in padding)
  return _conv(lhs, rhs, tuple(window_strides), pads, precision)


_xla_only = False  # set by plain_xla()


def _cpu_forms() -> bool:
  """Whether layers use their CPU forms: on CPU, outside `plain_xla()`."""
  return jax.default_backend() == "cpu" and not _xla_only


@contextlib.contextmanager
def plain_xla():
  """Models traced inside use XLA's own convolution and pooling on CPU too (the baseline)."""
  global _xla_only
  _xla_only = True
  try:
    yield
  finally:
    _xla_only = False


def Conv(*args, **kwargs) -> nn.Conv:  # noqa: N802 (a module constructor, like nn.Conv)
  """`nn.Conv`, with the faster kernel gradient when JAX runs on CPU."""
  if _cpu_forms():
    kwargs.setdefault("conv_general_dilated", conv_general_dilated)
  return nn.Conv(*args, **kwargs)


EXAMPLES = "examples"  # variable collection: {"index": [batch] int32} position in the device batch


class Dropout(nn.Module):
  """Inverted dropout; an example's mask depends only on the key and its `EXAMPLES` index."""

  rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    if self.deterministic or self.rate == 0:
      return x
    if self.rate == 1:  # as nn.Dropout: no division by a zero keep probability
      return jnp.zeros_like(x)
    root = self.scope.root  # the index is given once, at the top: model.apply(variables)
    index = (
      root.get_variable(EXAMPLES, "index")
      if root.has_variable(EXAMPLES, "index")
      else jnp.arange(x.shape[0])
    )
    key = self.make_rng("dropout")
    draw = lambda i: jax.random.bernoulli(jax.random.fold_in(key, i), 1 - self.rate, x.shape[1:])
    keep = jax.vmap(draw)(index)  # [batch, ...] one mask per example
    return jnp.where(keep, x / (1 - self.rate), jnp.zeros_like(x))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max_pool(x, window: int):
  return nn.max_pool(x, (window, window), strides=(window, window))


def _max_pool_fwd(x, window):
  y = _max_pool(x, window)
  return y, (x, y)


def _max_pool_bwd(window, residuals, g):
  """The gradient goes to the first maximum of each window (row-major), as in XLA."""
  x, y = residuals  # [B, H, W, C], [B, H // window, W // window, C]
  b, ho, wo, c = y.shape
  tiles = x[:, : ho * window, : wo * window].reshape(b, ho, window, wo, window, c)
  taken = jnp.zeros(y.shape, bool)
  grads = []
  for i in range(window):
    for j in range(window):
      first = (tiles[:, :, i, :, j] == y) & ~taken
      grads.append(jnp.where(first, g, jnp.zeros_like(g)))
      taken |= first
  tiles_grad = jnp.stack(grads, 3).reshape(b, ho, wo, window, window, c)  # [B,Ho,Wo,i,j,C]
  x_grad = tiles_grad.transpose(0, 1, 3, 2, 4, 5).reshape(b, ho * window, wo * window, c)
  pad = [(0, 0), (0, x.shape[1] - ho * window), (0, x.shape[2] - wo * window), (0, 0)]
  return (jnp.pad(x_grad, pad),)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


def max_pool(x, window: int):
  """`nn.max_pool` with window = stride (non-overlapping), VALID; its gradient as a mask.

  XLA:CPU computes the max-pool gradient with a scatter over index arrays the size of the
  input (18% of the Keras CNN's CPU step); the same gradient is a select per window here.
  """
  if _cpu_forms():
    return _max_pool(x, window)
  return nn.max_pool(x, (window, window), strides=(window, window))
