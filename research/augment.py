"""On-device augmentation: small named ops composed from a config string, run per shard.

A pipeline is written like `"crop(4)|flip_lr|standardize"`. Each op is a factory registered
by name; it returns `op(rng, image) -> image` for ONE float32 image [H, W, C] in [0, 1]
(`standardize` maps to zero mean, unit variance). `build` vmaps the ops over the batch with
one key per example, so the whole pipeline is a jittable function of (rng, images_u8, sizes).
Inside the pmapped step every device folds its index into `rng` first, so devices draw
different crops and flips. A fork adds an op by decorating a factory with `@register`.

Streamed (ImageNet-style) images arrive padded: the host resizes each so its longer side is
`host_image_size`, puts it at the top-left of a fixed S × S array and pads the rest, and
sends the valid (height, width) as `sizes`. Window ops (`@register(name, window=True)`:
`inception_crop`, `central_crop`) return `op(rng, image, valid)` with `valid` the float32
(height, width) of the true image; they read only inside it and output a whole image, so
they must come first in a pipeline and everything after them never sees the padding.

Context ops (`@register(name, context=True)`: `flip_alternating`) return
`op(rng, image, context)`: `context.epoch` is the training epoch and `context.key` a key that
belongs to the example itself (its index in the dataset, with the seed), the same in every
epoch and on any number of devices; resident data gives each example its index, streamed data
each example of each step a new one. A views op (`@register(name, views=True)`: `tta`) ends an
`eval_preprocess`: it returns `Views(fn, weights)` with `fn(image) -> [V, H, W, C]`; the eval
averages the model's logits over the V views with those weights, and periodic evals use the
first view (the image as the ops before it leave it).

Batch ops (`@register(name, batch=True)`: `mixup`, `cutmix`) mix examples and their labels:
they return `op(keys [B], images [B, H, W, C], targets [B, K]) -> (images, targets)`, with
`targets` the class probabilities (one-hot before any mixing) and `keys` each example's key.
They come last in a training pipeline and see one device's examples; each example is mixed
with its neighbour in the batch (positions 2i and 2i + 1; the batch is in random order, and a
training step's per-device batch is even, so the pairs are those of the global batch), its
weight drawn from its own key, and its target mixed with exactly the weights of its pixels.
"""

import ast
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from research.errors import UserError
from research.registry import Registry

Op = Callable[[jax.Array, jax.Array], jax.Array]  # op(rng, image) -> image
WindowOp = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # op(rng, image, valid)
OPS = Registry("augmentation op", "augment", "research.augment")  # {name: op factory}
_WINDOW_OPS: set[str] = set()  # names whose ops read only the valid (height, width) region
_CONTEXT_OPS: set[str] = set()  # names whose ops take the Context
_VIEWS_OPS: set[str] = set()  # names whose factories return Views
_BATCH_OPS: set[str] = set()  # names whose ops mix examples and their targets
VALUE_OPS: set[str] = set()  # names whose ops set the range of the values the model sees


class Context(NamedTuple):
  """What a context op sees besides its key and image."""

  epoch: jax.Array  # int32: the training epoch (0 in eval)
  key: jax.Array  # the example's own key: the same in every epoch


class Views(NamedTuple):
  """A views op: `fn(image) -> [V, H, W, C]`, and the weight of each view's logits; with
  `uncertain` < 1, the views beyond the first only for that share of each eval batch, the
  examples the first view is least confident of (the others keep its logits)."""

  fn: Callable[[jax.Array], jax.Array]
  weights: tuple[float, ...]
  uncertain: float = 1.0


def register(
  name: str,
  window: bool = False,
  context: bool = False,
  views: bool = False,
  values: bool = False,
  batch: bool = False,
):
  """Registers an op factory under `name`: `window=True` if its ops take the valid size,
  `context=True` if they take the Context, `views=True` if it returns Views, `values=True` if
  its ops map the pixel values to the range the model sees (training and eval must agree),
  `batch=True` if its ops mix the examples of a batch and their targets."""

  def wrap(factory):
    OPS.register(name)(factory)
    flags = (
      (window, _WINDOW_OPS),
      (context, _CONTEXT_OPS),
      (views, _VIEWS_OPS),
      (values, VALUE_OPS),
      (batch, _BATCH_OPS),
    )
    for flag, names in flags:
      if flag:
        names.add(name)
    return factory

  return wrap


@register("crop")
def crop(pad: int, mode: str = "constant") -> Op:
  """Pads by `pad` pixels (zeros, or 'reflect'/'edge') and crops back at a random offset."""
  if mode not in ("constant", "reflect", "edge") or pad < 0:
    raise UserError(f"crop({pad}, {mode!r}): pad must be >= 0 and mode constant, reflect or edge")

  def op(rng, image):
    h, w, c = image.shape
    padded = jnp.pad(image, ((pad, pad), (pad, pad), (0, 0)), mode=mode)
    dy, dx = jax.random.randint(rng, (2,), 0, 2 * pad + 1)
    return jax.lax.dynamic_slice(padded, (dy, dx, 0), (h, w, c))

  return op


@register("shift")
def shift(fraction: float) -> Op:
  """Keras-style width/height shift: up to `fraction` of the size, edges repeated ('nearest').

  Keras' ImageDataGenerator shifts by real-valued offsets; we shift by whole pixels.
  """

  def op(rng, image):
    pad = round(fraction * max(image.shape[:2]))
    return crop(pad, "edge")(rng, image) if pad else image

  return op


@register("flip_lr")
def flip_lr() -> Op:
  """Mirrors the image left-right with probability 1/2."""

  def op(rng, image):
    return jnp.where(jax.random.bernoulli(rng), image[:, ::-1, :], image)

  return op


@register("flip_alternating", context=True)
def flip_alternating() -> Callable:
  """airbench's alternating flip: each example is mirrored or not at random once (by its own
  key), and every odd epoch mirrors the whole set, so over two epochs each example is seen
  both ways."""

  def op(rng, image, context):
    del rng
    flip = jax.random.bernoulli(context.key) ^ (context.epoch % 2 == 1)
    return jnp.where(flip, image[:, ::-1, :], image)

  return op


@register("normalize", values=True)
def normalize(dataset: str = "cifar10") -> Op:
  """Subtracts the dataset's per-channel mean and divides by its standard deviation (of the
  [0, 1] pixels): the statistics of NORMALIZE's datasets."""
  if dataset not in NORMALIZE:
    raise UserError(f"normalize({dataset!r}): known datasets are {', '.join(NORMALIZE)}")
  mean, std = (jnp.array(v, jnp.float32) for v in NORMALIZE[dataset])

  def op(rng, image):
    del rng
    return (image - mean) / std

  return op


NORMALIZE = {  # per-channel (mean, std) of the training images, RGB in [0, 1]
  "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


@register("tta", views=True)
def tta(translate: int = 1, uncertain: float = 1.0, weighting: str = "airbench") -> Views:
  """airbench's test-time augmentation: the image and its mirror (weights 1/4 each), and both
  again translated by `translate` pixels up-left and down-right with reflected edges (1/8
  each); `weighting` "mean": the six views weigh 1/6 each (hiverge's). The first view is the
  image itself. `uncertain` < 1: the other views only for that share of each device's eval
  batch, the examples least confident by the first view (hiverge's 0.25, of its whole test
  set; Views): which examples get views, and so the accuracy, then depends a little on the
  device count and eval_batch_size."""
  if weighting not in ("airbench", "mean") or not 0 < uncertain <= 1:
    raise UserError(
      f"tta({translate}, {uncertain}, {weighting!r}): uncertain is a share in (0, 1] and "
      "weighting 'airbench' or 'mean'"
    )

  def fn(image):
    h, w, _ = image.shape
    t = translate
    padded = jnp.pad(image, ((t, t), (t, t), (0, 0)), mode="reflect")
    shifted = [padded[:h, :w], padded[2 * t : 2 * t + h, 2 * t : 2 * t + w]]
    views = [image, image[:, ::-1]] + [v for s in shifted for v in (s, s[:, ::-1])]
    return jnp.stack(views)

  weights = (0.25, 0.25, 0.125, 0.125, 0.125, 0.125) if weighting == "airbench" else (1 / 6,) * 6
  return Views(fn, weights, uncertain)


@register("color_jitter")
def color_jitter(brightness: float, contrast: float) -> Op:
  """hiverge's jitter: adds one uniform offset in ±`brightness`, then multiplies by one uniform
  factor in 1 ± `contrast`, on the values as the ops before it left them (after `normalize`:
  about the dataset's mean), unclipped."""

  def op(rng, image):
    shift, scale = jax.random.uniform(rng, (2,), minval=-1.0, maxval=1.0)
    return (image + shift * brightness) * (1 + scale * contrast)

  return op


@register("brightness")
def brightness(max_delta: float) -> Op:
  """Adds one uniform offset in [-max_delta, max_delta] (of the [0, 1] range), clipped."""

  def op(rng, image):
    delta = jax.random.uniform(rng, (), minval=-max_delta, maxval=max_delta)
    return jnp.clip(image + delta, 0.0, 1.0)

  return op


def _adjust_contrast(image, factor):
  """Scales each channel's distance from its mean by `factor`, as tf.image.adjust_contrast."""
  mean = image.mean(axis=(0, 1), keepdims=True)
  return (image - mean) * factor + mean


@register("contrast")
def contrast(lower: float, upper: float) -> Op:
  """Scales each channel's distance from its mean by a factor in [lower, upper], clipped."""

  def op(rng, image):
    factor = jax.random.uniform(rng, (), minval=lower, maxval=upper)
    return jnp.clip(_adjust_contrast(image, factor), 0.0, 1.0)

  return op


@register("standardize", values=True)
def standardize() -> Op:
  """Per-image standardization as tf.image.per_image_standardization: zero mean, unit std."""

  def op(rng, image):
    del rng
    std = jnp.maximum(image.std(), 1.0 / jnp.sqrt(image.size))
    return (image - image.mean()) / std

  return op


@register("scale", values=True)
def scale(low: float, high: float) -> Op:
  """Maps the [0, 1] range linearly to [low, high] (Inception wants [-1, 1])."""

  def op(rng, image):
    del rng
    return low + (high - low) * image

  return op


def _window_weights(start, length, out_size: int, in_size: int):
  """[out_size, in_size] antialiased bilinear weights resampling pixels [start, start + length)
  of an axis to out_size pixels: jax.image.resize of the sliced window, reading nothing else."""
  scale = length / out_size  # input pixels per output pixel
  centers = start + (jnp.arange(out_size) + 0.5) * scale - 0.5  # in input pixel coordinates
  pixels = jnp.arange(in_size)
  weights = jnp.maximum(0.0, 1.0 - jnp.abs(centers[:, None] - pixels) / jnp.maximum(scale, 1.0))
  weights = jnp.where((pixels >= start) & (pixels < start + length), weights, 0.0)
  return weights / weights.sum(axis=1, keepdims=True)


def _resize_window(image, top, left, height, width, size: int):
  """Bilinear (antialiased) resize of the window [top:top+height, left:left+width] to size²."""
  rows = _window_weights(top, height, size, image.shape[0])  # [size, H]
  cols = _window_weights(left, width, size, image.shape[1])  # [size, W]
  return jnp.einsum("yh,hwc,xw->yxc", rows, image, cols, precision=jax.lax.Precision.HIGHEST)


def _uniform_int(u, n):
  """An integer uniform in [0, n) (0 where n is 0), as float32, from u uniform in [0, 1)."""
  return jnp.minimum(jnp.floor(u * n), jnp.maximum(n - 1, 0))


def _random_crop_shapes(u, image_h, image_w, area_range, aspect):
  """TF's GenerateRandomCrop for each aspect ratio [attempts], u uniform [attempts]: the
  whole-pixel (height, width) and whether they meet the area range and fit in the image."""
  min_area = area_range[0] * image_w * image_h
  max_area = area_range[1] * image_w * image_h
  height = jnp.round(jnp.sqrt(min_area / aspect))  # jnp.round, like lrintf, rounds half to even
  max_height = jnp.round(jnp.sqrt(max_area / aspect))
  widest = jnp.floor((image_w + 0.5) / aspect)  # the tallest crop whose width still fits
  widest = jnp.where(jnp.round(widest * aspect) > image_w, widest - 1, widest)
  max_height = jnp.where(jnp.round(max_height * aspect) > image_w, widest, max_height)
  max_height = jnp.minimum(max_height, image_h)
  height = jnp.minimum(height, max_height)
  height = height + _uniform_int(u, max_height - height + 1)  # in [height, max_height]
  width = jnp.round(height * aspect)
  height = jnp.where(width * height < min_area, height + 1, height)  # undo rounding, as TF
  width = jnp.round(height * aspect)
  height = jnp.where(width * height > max_area, height - 1, height)
  width = jnp.round(height * aspect)
  area = width * height
  fits = (width <= image_w) & (height <= image_h) & (width > 0) & (height > 0)
  return height, width, fits & (area >= min_area) & (area <= max_area)


def sample_crop_window(
  rng,
  valid,
  area_range=(0.05, 1.0),
  aspect_range=(3 / 4, 4 / 3),
  min_object_covered: float = 0.1,
  attempts: int = 100,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """tf.image.sample_distorted_bounding_box with the whole image as the only box, inside the
  valid (height, width): float32 whole-pixel (top, left, crop_height, crop_width).

  Each attempt draws an aspect ratio (width / height) uniformly in `aspect_range` and a
  crop as the TF kernel does; the first whose area is at least `min_object_covered` of the
  image wins. If none does, the whole valid image. All attempts are drawn at once.
  """
  u_aspect, u_height, u_top, u_left = jax.random.uniform(rng, (4, attempts))  # one row each
  image_h, image_w = valid[0], valid[1]
  aspect = aspect_range[0] + (aspect_range[1] - aspect_range[0]) * u_aspect
  height, width, ok = _random_crop_shapes(u_height, image_h, image_w, area_range, aspect)
  covered = width * height / (image_h * image_w)  # the crop's share of the (whole-image) box
  ok = ok & (width * height >= 1) & (covered >= min_object_covered)
  first = jnp.argmax(ok)
  crop_h = jnp.where(ok[first], height[first], image_h)
  crop_w = jnp.where(ok[first], width[first], image_w)
  # Offsets as the kernel: uniform in [0, image - crop), 0 when the crop spans the image.
  top = _uniform_int(u_top[first], image_h - crop_h)
  left = _uniform_int(u_left[first], image_w - crop_w)
  return top, left, crop_h, crop_w


@register("inception_crop", window=True)
def inception_crop(
  size: int,
  area_min: float = 0.05,
  area_max: float = 1.0,
  aspect_min: float = 3 / 4,
  aspect_max: float = 4 / 3,
  min_object_covered: float = 0.1,
  attempts: int = 100,
) -> WindowOp:
  """Inception's distorted crop of the valid image (the whole image as box), resized to size²."""

  def op(rng, image, valid):
    window = sample_crop_window(
      rng, valid, (area_min, area_max), (aspect_min, aspect_max), min_object_covered, attempts
    )
    return _resize_window(image, *window, size)

  return op


@register("central_crop", window=True)
def central_crop(size: int, fraction: float = 0.875) -> WindowOp:
  """The central `fraction` of each side of the valid image, in whole pixels as
  tf.image.central_crop, resized to size × size: Inception's eval."""

  def op(rng, image, valid):
    del rng
    top, left = jnp.floor((valid - valid * fraction) / 2)
    return _resize_window(image, top, left, valid[0] - 2 * top, valid[1] - 2 * left, size)

  return op


def _rgb_to_hcv(rgb):
  """Hue in [0, 1), chroma (max - min) and value (max) of RGB pixels of any real values."""
  r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
  value = rgb.max(-1)
  chroma = value - rgb.min(-1)
  safe = jnp.where(chroma > 0, chroma, 1.0)
  hue = jnp.where(
    value == r, (g - b) / safe, jnp.where(value == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe)
  )
  return jnp.where(chroma > 0, (hue / 6.0) % 1.0, 0.0), chroma, value


def _hcv_to_rgb(hue, chroma, value):
  """Inverse of `_rgb_to_hcv`: each channel is value - chroma × (its weight on the hue circle)."""
  k = (jnp.array([5.0, 3.0, 1.0]) + hue[..., None] * 6.0) % 6.0
  weight = jnp.clip(jnp.minimum(k, 4.0 - k), 0.0, 1.0)
  return value[..., None] - chroma[..., None] * weight


def _adjust_saturation_and_hue(image, factor, delta):
  """tf.image.adjust_saturation(factor) then adjust_hue(delta), in one HSV round trip.

  Saturation (chroma / value, 0 where value <= 0) is scaled and clamped to [0, 1]; value is
  not clamped. The hue shift keeps each pixel's max and min, as TF's kernel does. Saturation
  leaves hue unchanged, so doing both in one round trip equals TF's two ops.
  """
  hue, chroma, value = _rgb_to_hcv(image)
  saturation = jnp.where(value > 0, chroma / jnp.where(value > 0, value, 1.0), 0.0)
  chroma = jnp.clip(saturation * factor, 0.0, 1.0) * jnp.maximum(value, 0.0)
  return _hcv_to_rgb((hue + delta) % 1.0, chroma, value)


@register("color_distort")
def color_distort(
  brightness: float = 32 / 255, saturation: float = 0.5, hue: float = 0.2, contrast: float = 0.5
) -> Op:
  """Inception's distort_color: brightness ±32/255, saturation ×[0.5, 1.5], hue ±0.2 (of the
  colour circle), contrast ×[0.5, 1.5]; no clipping between them, one clip to [0, 1] at the end.

  Per image one of TF's two orders at random: (brightness, saturation, hue, contrast) or
  (brightness, contrast, saturation, hue).
  """

  def op(rng, image):
    u_b, u_s, u_h, u_c, u_order = jax.random.uniform(rng, (5,), minval=-1.0, maxval=1.0)
    delta_b, factor_s = brightness * u_b, 1 + saturation * u_s
    delta_h, factor_c = hue * u_h, 1 + contrast * u_c
    contrast_second = u_order < 0  # else contrast comes last
    image = image + delta_b
    image = jnp.where(contrast_second, _adjust_contrast(image, factor_c), image)
    image = _adjust_saturation_and_hue(image, factor_s, delta_h)
    image = jnp.where(contrast_second, image, _adjust_contrast(image, factor_c))
    return jnp.clip(image, 0.0, 1.0)

  return op


def _neighbours(n: int) -> jax.Array:
  """Each position's partner: 2i and 2i + 1 swap; the last of an odd batch is its own."""
  partner = jnp.arange(n) ^ 1
  return jnp.where(partner < n, partner, jnp.arange(n))


@register("mixup", batch=True)
def mixup(alpha: float) -> Callable:
  """Mixup (Zhang et al. 2018): image and target are lam × themselves + (1 - lam) × their
  neighbour's, lam ~ Beta(alpha, alpha) per example."""
  if alpha <= 0:
    raise UserError(f"mixup({alpha}): alpha must be > 0")

  def op(keys, images, targets):
    lam = jax.vmap(lambda k: jax.random.beta(k, alpha, alpha))(keys)  # [B]
    partner = _neighbours(images.shape[0])
    mix = lambda x, lam: lam * x + (1 - lam) * x[partner]
    return mix(images, lam[:, None, None, None]), mix(targets, lam[:, None])

  return op


@register("cutmix", batch=True)
def cutmix(alpha: float) -> Callable:
  """CutMix (Yun et al. 2019): a box of about (1 - lam) of the image, lam ~ Beta(alpha,
  alpha), is pasted from the neighbour; the target is mixed by the box's exact share of pixels."""
  if alpha <= 0:
    raise UserError(f"cutmix({alpha}): alpha must be > 0")

  def box(key, h, w):  # [H, W] bool: the pixels taken from the neighbour
    k_lam, k_y, k_x = jax.random.split(key, 3)
    side = jnp.sqrt(1 - jax.random.beta(k_lam, alpha, alpha))  # box side / image side
    bh, bw = jnp.round(side * h).astype(jnp.int32), jnp.round(side * w).astype(jnp.int32)
    cy, cx = jax.random.randint(k_y, (), 0, h), jax.random.randint(k_x, (), 0, w)
    top, left = jnp.clip(cy - bh // 2, 0, h), jnp.clip(cx - bw // 2, 0, w)
    bottom, right = jnp.clip(cy + bh - bh // 2, 0, h), jnp.clip(cx + bw - bw // 2, 0, w)
    rows, cols = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
    return (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)

  def op(keys, images, targets):
    h, w = images.shape[1:3]
    boxes = jax.vmap(lambda k: box(k, h, w))(keys)  # [B, H, W]
    partner = _neighbours(images.shape[0])
    images = jnp.where(boxes[..., None], images[partner], images)
    taken = boxes.mean((1, 2))[:, None]  # [B, 1]: the neighbour's share of the pixels
    return images, (1 - taken) * targets + taken * targets[partner]

  return op


class Step(NamedTuple):
  """One parsed op; `window` ops take the valid (height, width) as a third argument,
  `context` ops the Context."""

  op: Callable
  window: bool
  context: bool = False
  value: str | None = None  # a value op as written with every argument: "scale(-1.0, 1.0)"
  batch: bool = False


def _usage(name: str) -> str:
  """`crop(pad: int, mode: str = 'constant')`: what an op takes, for error messages."""
  signature = inspect.signature(OPS.parts[name]).replace(return_annotation=inspect.Signature.empty)
  return f"{name}{signature}"


def _literal(part: str, node: ast.expr, name: str):
  try:
    return ast.literal_eval(node)
  except (ValueError, SyntaxError):
    raise UserError(
      f"augmentation op {part!r}: {ast.unparse(node)} is not a number or a quoted string; "
      f"the op is {_usage(name)}"
    ) from None


def _checked(part: str, name: str, args: list, kwargs: dict) -> dict:
  """The op's arguments by parameter name, each of the type its factory declares."""
  signature = inspect.signature(OPS.parts[name])
  try:
    bound = signature.bind(*args, **kwargs)
  except TypeError as e:
    raise UserError(f"augmentation op {part!r}: {e}; the op is {_usage(name)}") from None
  kinds = {
    int: ((int,), "a whole number"),
    float: ((int, float), "a number"),
    str: ((str,), "a string"),
  }
  for param, value in bound.arguments.items():
    allowed, what = kinds.get(signature.parameters[param].annotation, ((object,), ""))
    if isinstance(value, bool) or not isinstance(value, allowed):
      raise UserError(
        f"augmentation op {part!r}: {param}={value!r} is not {what}; the op is {_usage(name)}"
      )
    if allowed == (int, float):
      bound.arguments[param] = float(value)  # scale(-1, 1) is scale(-1.0, 1.0)
  bound.apply_defaults()
  return bound.arguments


def parse(spec: str) -> list[Step]:
  """Turns `"crop(4)|flip_lr"` into steps, with a user error for unknown names or bad args.

  Arguments are Python literals, by position or by name: `crop(4, mode="reflect")`.
  """
  steps = []
  for part in filter(None, (p.strip() for p in spec.split("|"))):
    try:
      call = ast.parse(part, mode="eval").body
    except SyntaxError:
      call = None
    if isinstance(call, ast.Name):
      call = ast.Call(call, [], [])
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
      raise UserError(
        f"augmentation op {part!r} is not written as NAME or NAME(ARGUMENTS), e.g. crop(4)"
      )
    name = call.func.id
    if name not in OPS.parts:
      raise UserError(f"augmentation op {part!r} is unknown{OPS.choices(name)}")
    if name in _WINDOW_OPS and steps:
      raise UserError(f"augmentation op {part!r} must be first: ops before it would see padding")
    if steps and isinstance(steps[-1].op, Views):
      raise UserError(f"augmentation op {part!r} comes after a views op, which must be last")
    if steps and steps[-1].batch and name not in _BATCH_OPS:
      raise UserError(
        f"augmentation op {part!r} comes after an op that mixes examples "
        f"({', '.join(sorted(_BATCH_OPS))}); those come last"
      )
    args = [_literal(part, node, name) for node in call.args]
    kwargs = {k.arg: _literal(part, k.value, name) for k in call.keywords}
    arguments = _checked(part, name, args, kwargs)
    value = f"{name}({', '.join(map(repr, arguments.values()))})" if name in VALUE_OPS else None
    op = OPS.parts[name](**arguments)
    steps.append(Step(op, name in _WINDOW_OPS, name in _CONTEXT_OPS, value, name in _BATCH_OPS))
  return steps


BATCH_OP_KEYS = 1 << 30  # batch op i's key: the example's key folded with this + i


def identity_key(seed: int) -> jax.Array:
  """The key examples' own keys come from (Context.key): one per run, apart from the others."""
  return jax.random.fold_in(jax.random.key(seed), 3)


def _contexts(n: int, epoch, ids, seed) -> Context:
  """The Context of each of `n` examples: the epoch, and each example's own key from its id
  (None: its position in the batch) and the seed (traced: no eager op)."""
  ids = jnp.arange(n) if ids is None else ids
  keys = jax.vmap(jax.random.fold_in, (None, 0))(identity_key(seed), ids)
  return Context(jnp.broadcast_to(jnp.asarray(epoch, jnp.int32), (n,)), keys)


def _one_example(steps: list, views, rng, image, valid, context):
  """The per-example ops of a pipeline on ONE image, each with its own key; then `views`'s."""
  for step, key in zip(steps, jax.random.split(rng, max(len(steps), 1)), strict=False):
    if step.window:
      image = step.op(key, image, valid)
    elif step.context:
      image = step.op(key, image, context)
    else:
      image = step.op(key, image)
  return views.op.fn(image) if views else image


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """A pipeline string, built (`build`): called as `pipeline(rng, images_u8 [B, S, S, C],
  sizes=None, *, epoch=0, ids=None, positions=None, targets=None, seed=None)`, it gives
  [B, H, W, C] in JAX's default float (float32, float64 with x64), or [V, B, H, W, C] for a
  pipeline that ends in a views op; with `targets`, `(images, targets)`.

  `sizes` (int [B, 2]) is each image's valid (height, width) at the top-left of its padded
  array; None means every image is whole. Only a pipeline that starts with a window op
  accepts sizes, since any other op would see the padding. `ids` (int [B]) identify the
  examples for context ops (None: their positions in the batch); `epoch` is the epoch.
  `seed` (an int, traced or not) replaces the seed the pipeline was built with for the
  examples' own keys: the seeds of a run with `config.seeds` > 1 share one pipeline.
  `positions` (int [B]) are the examples' places in the step's global batch (None: 0, 1, …):
  each example's random draws come from `rng` folded with its position, so a batch split
  over devices draws what the whole batch draws. Batch ops mix `targets` as the images."""

  spec: str  # the string it was built from
  windowed: bool  # it starts with a window op: it may be given padded images and their sizes
  values: str  # its value ops with every argument: "scale(-1.0, 1.0)", or "none"
  mixes: bool  # it mixes examples and targets (mixup, cutmix): for training only
  weights: tuple | None  # the views' weights, where it ends in a views op (else None)
  uncertain: float  # the views' share of the least certain examples that take them (1: all)
  apply: Callable = dataclasses.field(repr=False)  # the function the call runs
  first: "Pipeline | None" = dataclasses.field(default=None, repr=False)  # without the views

  def __call__(self, *args, **kwargs):
    return self.apply(*args, **kwargs)

  @property
  def first_view(self) -> "Pipeline":
    """The pipeline that gives the first view alone, [B, H, W, C] (itself without views)."""
    return self.first or self


def build(spec: str, seed: int = 0) -> Pipeline:
  """The pipeline `spec` names, its examples' keys from `seed` (a Pipeline)."""
  steps = parse(spec)
  windowed = bool(steps) and steps[0].window
  values = "|".join(step.value for step in steps if step.value) or "none"
  views = steps.pop() if steps and isinstance(steps[-1].op, Views) else None
  batch_ops = [step.op for step in steps if step.batch]
  steps = [step for step in steps if not step.batch]
  built_seed = seed  # the examples' keys come from it unless the call names another

  def pipeline(all_views):
    def augment(
      rng, images_u8, sizes=None, *, epoch=0, ids=None, positions=None, targets=None, seed=None
    ):
      if sizes is not None and not windowed:
        raise UserError(
          f"augmentation {spec!r} gets padded images but does not start with a window op "
          f"({', '.join(sorted(_WINDOW_OPS))}), so its ops would see the padding"
        )
      images = images_u8.astype(jnp.result_type(float)) / 255.0  # [B, S, S, C]
      n = images.shape[0]
      if sizes is None:
        sizes = jnp.broadcast_to(jnp.array(images.shape[1:3]), (n, 2))
      valid = jnp.asarray(sizes, jnp.float32)  # [B, 2]
      contexts = _contexts(n, epoch, ids, built_seed if seed is None else seed)
      positions = jnp.arange(n) if positions is None else positions
      example_keys = jax.vmap(jax.random.fold_in, (None, 0))(rng, positions)
      one = functools.partial(_one_example, steps, views if all_views else None)
      out = jax.vmap(one)(example_keys, images, valid, contexts)
      mixed = jnp.zeros((n, 1)) if targets is None else targets  # [B, K]
      for i, op in enumerate(batch_ops):  # each example's key, apart from its own ops' keys
        op_keys = jax.vmap(jax.random.fold_in, (0, None))(example_keys, BATCH_OP_KEYS + i)
        out, mixed = op(op_keys, out, mixed)
      out = jnp.moveaxis(out, 1, 0) if views and all_views else out  # views first
      return out if targets is None else (out, mixed)

    return augment

  made = functools.partial(Pipeline, spec, windowed, values, bool(batch_ops))
  first = made(None, 1.0, pipeline(all_views=False)) if views else None
  weights, uncertain = (views.op.weights, views.op.uncertain) if views else (None, 1.0)
  return made(weights, uncertain, pipeline(all_views=True), first)
