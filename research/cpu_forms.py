"""Forms of convolution and max-pool that run faster than XLA's own ops on XLA:CPU (and one
on GPUs), applied to any flax model from outside it.

On CPU (tests, smoke runs, CI, laptops) `research.models.apply_fn` traces every model inside
`cpu_forms_applied()`: every `nn.Conv` then takes another form of the same computation where
XLA:CPU's own is slow (flax's `nn.intercept_methods` hands it this module's
`conv_general_dilated`); each form has the same values and gradients to float rounding
(tests/test_train_step.py) and is kept only while it gains at least 5% in a shipped default
step (docs/cpu_step.md says why each is faster; BENCHMARKS.md, what each gains). On a GPU the
forms `DEFAULT_FORMS["gpu"]` names are on (the max-pool's gradient); `with_forms(*forms)`
switches others on, as the benchmark does to measure them there.

- kernel_gradient: the kernel's gradient is one matrix product, the kh × kw shifted views
  of the padded input stacked channels-first times the output gradient, where XLA:CPU runs a
  convolution over batch × height × width. Dilated, grouped or non-NHWC convolutions use XLA's.
- small_input: a convolution whose kernel is larger than its input (3×3 on 2×2) is the same
  product of views, where XLA:CPU runs a generic loop.
- max_pool_gradient: the gradient of a non-overlapping max-pool is a select per window,
  where XLA scatters through index arrays (on GPU too: `DEFAULT_FORMS`).
- max_pool_forward: with max_pool_gradient, its forward is a reshape and a max, where XLA
  runs a reduce-window (off by default: measured where a lease allows).

`without_cpu_forms(*forms)` traces models with XLA's own ops instead (the benchmarks' baseline;
default: all forms); `with_forms(*forms)` traces them with these forms on any backend.
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
  input times 1 plus zeros; an inf would make NaNs of its pixel's other channels). XLA never
  fuses a product into its consumers, so the input is transposed once and each tap is a plain
  slice of it; XLA:CPU fuses a transpose into every slice instead.
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
  """The convolution: XLA's, or for a kernel larger than the input the patches' product."""
  kh, kw, channels, features = rhs.shape
  small = lhs.shape[1] < kh or lhs.shape[2] < kw
  if small and _uses("small_input"):
    patches = _patches(lhs, (kh, kw), strides, pads)
    kernel = rhs.reshape(kh * kw * channels, features)
    return lax.dot_general(patches, kernel, (((0,), (0,)), ((), ())), precision=precision)
  return lax.conv_general_dilated(
    lhs, rhs, strides, pads, dimension_numbers=NHWC, precision=precision
  )


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
  if not _uses("kernel_gradient"):  # XLA differentiates the forward form
    return _forward(lhs, rhs, tuple(window_strides), pads, precision)
  return _conv(lhs, rhs, tuple(window_strides), pads, precision)


FORMS = ("kernel_gradient", "small_input", "max_pool_gradient", "max_pool_forward")
# The forms on by default, per backend, each where it measured faster in a shipped default step
# (BENCHMARKS.md): on a GPU the max-pool's gradient as a select per window gained 1.083 in the
# speedrun's step on one H200 (docs/gpu_hosts.md), where XLA runs a select-and-scatter.
DEFAULT_FORMS = {
  "cpu": ("kernel_gradient", "small_input", "max_pool_gradient"),
  "gpu": ("max_pool_gradient",),
}
CPU_FORMS = DEFAULT_FORMS["cpu"]
_off: set = set()  # forms switched off by `without_cpu_forms`
_on: set = set()  # forms switched on by `with_forms`


def _uses(form: str) -> bool:
  """Whether layers traced now use `form`: where the backend's defaults name it, unless
  `without_cpu_forms` switched it off; anywhere `with_forms` switched it on."""
  default = form in DEFAULT_FORMS.get(jax.default_backend(), ())
  return form not in _off and (default or form in _on)


def _conv_in_cpu_form(next_fun, args, kwargs, context):
  """An interceptor (`nn.intercept_methods`): an `nn.Conv` that uses XLA's convolution runs
  `conv_general_dilated` of this module instead; every other method call runs as it is."""
  conv = context.module
  plain = isinstance(conv, nn.Conv) and context.method_name == "__call__"
  if not plain or conv.conv_general_dilated is not None or conv.conv_general_dilated_cls:
    return next_fun(*args, **kwargs)
  object.__setattr__(conv, "conv_general_dilated", conv_general_dilated)  # while it traces
  try:
    return next_fun(*args, **kwargs)
  finally:
    object.__setattr__(conv, "conv_general_dilated", None)


def cpu_forms_applied():
  """A context in which models trace with the convolution forms the backend uses (`_uses`): on
  CPU, unless `without_cpu_forms` switched them off; elsewhere those `with_forms` switched on."""
  if any(_uses(form) for form in ("kernel_gradient", "small_input")):
    return nn.intercept_methods(_conv_in_cpu_form)
  return contextlib.nullcontext()


@contextlib.contextmanager
def without_cpu_forms(*forms: str):
  """Models traced inside use XLA's own ops instead of these forms (default: all of them): the
  baselines the benchmarks measure the forms against."""
  before = set(_off)
  _off.update(forms or FORMS)
  try:
    yield
  finally:
    _off.clear()
    _off.update(before)


@contextlib.contextmanager
def with_forms(*forms: str):
  """Models traced inside use these forms on any backend (on CPU they are on already): how the
  benchmark measures a form against XLA's own ops on a GPU."""
  before = set(_on)
  _on.update(forms)
  try:
    yield
  finally:
    _on.clear()
    _on.update(before)


def _tiles(x, window: int):
  """x [B, H, W, C] as its whole windows [B, Ho, window, Wo, window, C] (a remainder dropped)."""
  b, h, w, c = x.shape
  ho, wo = h // window, w // window
  return x[:, : ho * window, : wo * window].reshape(b, ho, window, wo, window, c)


def _windows_max(x, window: int):
  """The max-pool's forward as a reshape and a max over each window's axes (no reduce-window):
  the same values, exactly."""
  return jnp.max(_tiles(x, window), axis=(2, 4))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _max_pool(x, window: int, reshaped: bool):
  if reshaped:
    return _windows_max(x, window)
  return nn.max_pool(x, (window, window), strides=(window, window))


def _max_pool_fwd(x, window, reshaped):
  return _max_pool(x, window, reshaped), x


def _max_pool_bwd(window, reshaped, x, g):
  """The gradient goes to the first maximum of each window (row-major), as in XLA: found by one
  argmax over the window's values, so that no two computations of them (which XLA may fuse
  and round apart) are compared for equality."""
  del reshaped  # the forward's form: the same values either way
  b, ho, wo, c = g.shape  # x: [B, H, W, C]
  flat = _tiles(x, window).transpose(0, 1, 3, 2, 4, 5).reshape(b, ho, wo, window * window, c)
  first = jnp.argmax(flat, axis=3)  # [B, Ho, Wo, C]
  taps = lax.broadcasted_iota(first.dtype, flat.shape, 3)
  tiles_grad = jnp.where(
    taps == first[:, :, :, None], g[:, :, :, None], jnp.zeros_like(g)[:, :, :, None]
  )
  tiles_grad = tiles_grad.reshape(b, ho, wo, window, window, c)  # [B,Ho,Wo,i,j,C]
  x_grad = tiles_grad.transpose(0, 1, 3, 2, 4, 5).reshape(b, ho * window, wo * window, c)
  pad = [(0, 0), (0, x.shape[1] - ho * window), (0, x.shape[2] - wo * window), (0, 0)]
  return (jnp.pad(x_grad, pad),)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


def max_pool(x, window: int):
  """`nn.max_pool` with window = stride (non-overlapping), VALID. With the form
  max_pool_gradient its gradient is a select per window (`_max_pool_bwd`, no scatter), and
  with max_pool_forward besides its forward a reshape and a max (`_windows_max`, no
  reduce-window); max_pool_forward alone changes nothing (jnp.max's own gradient would share
  a tie among the window's maxima, where XLA's and ours give it to the first)."""
  if _uses("max_pool_gradient"):
    return _max_pool(x, window, _uses("max_pool_forward"))
  return nn.max_pool(x, (window, window), strides=(window, window))
