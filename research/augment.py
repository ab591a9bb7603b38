"""On-device augmentation: small named ops composed from a config string, run per shard.

A pipeline is written like `"crop(4)|flip_lr|standardize"`. Each op is a factory registered
by name; it returns `op(rng, image) -> image` for ONE float32 image [H, W, C] in [0, 1]
(`standardize` maps to zero mean, unit variance). `build` vmaps the ops over the batch with
one key per example, so the whole pipeline is a jittable function of (rng, images_u8).
Inside the pmapped step every device folds its index into `rng` first, so devices draw
different crops and flips. A fork adds an op by decorating a factory with `@register`.
"""

import ast
import functools
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp

from research.errors import UserError

Op = Callable[[jax.Array, jax.Array], jax.Array]
_REGISTRY: dict[str, Callable[..., Op]] = {}


def register(name: str):
  """Registers an op factory under `name` for use in pipeline strings."""

  def wrap(factory):
    _REGISTRY[name] = factory
    return factory

  return wrap


@register("crop")
def crop(pad: int, mode: str = "constant") -> Op:
  """Pads by `pad` pixels (zeros, or 'reflect'/'edge') and crops back at a random offset."""

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


@register("brightness")
def brightness(max_delta: float) -> Op:
  """Adds one uniform offset in [-max_delta, max_delta] (of the [0, 1] range), clipped."""

  def op(rng, image):
    delta = jax.random.uniform(rng, (), minval=-max_delta, maxval=max_delta)
    return jnp.clip(image + delta, 0.0, 1.0)

  return op


@register("contrast")
def contrast(lower: float, upper: float) -> Op:
  """Scales each channel's distance from its mean by a factor in [lower, upper], clipped."""

  def op(rng, image):
    factor = jax.random.uniform(rng, (), minval=lower, maxval=upper)
    mean = image.mean(axis=(0, 1), keepdims=True)
    return jnp.clip((image - mean) * factor + mean, 0.0, 1.0)

  return op


@register("standardize")
def standardize() -> Op:
  """Per-image standardization as tf.image.per_image_standardization: zero mean, unit std."""

  def op(rng, image):
    del rng
    std = jnp.maximum(image.std(), 1.0 / jnp.sqrt(image.size))
    return (image - image.mean()) / std

  return op


@register("scale")
def scale(low: float, high: float) -> Op:
  """Maps the [0, 1] range linearly to [low, high] (Inception wants [-1, 1])."""

  def op(rng, image):
    del rng
    return low + (high - low) * image

  return op


def _resize_window(image, top, left, height, width, size: int):
  """Bilinear resize of the window [top:top+height, left:left+width] to size × size."""
  scale_yx = jnp.stack([size / height, size / width])
  translation = -jnp.stack([top, left]) * scale_yx
  return jax.image.scale_and_translate(
    image, (size, size, image.shape[-1]), (0, 1), scale_yx, translation, "linear", antialias=True
  )


def sample_crop_window(
  rng, height, width, area_range, aspect_range, attempts: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(top, left, crop_height, crop_width) covering a random share of the image in
  `area_range` with aspect ratio (width / height) in `aspect_range`. Of `attempts`
  candidates the first that fits inside the image is used; if none fits, the whole image."""
  k_area, k_aspect, k_y, k_x = jax.random.split(rng, 4)
  area = (
    height
    * width
    * jax.random.uniform(k_area, (attempts,), minval=area_range[0], maxval=area_range[1])
  )
  log_aspect = jax.random.uniform(
    k_aspect, (attempts,), minval=jnp.log(aspect_range[0]), maxval=jnp.log(aspect_range[1])
  )
  crop_w = jnp.sqrt(area * jnp.exp(log_aspect))
  crop_h = jnp.sqrt(area / jnp.exp(log_aspect))
  fits = (crop_w <= width) & (crop_h <= height)
  pick = jnp.argmax(fits)  # the first candidate that fits
  crop_h = jnp.where(fits[pick], crop_h[pick], height)
  crop_w = jnp.where(fits[pick], crop_w[pick], width)
  top = jax.random.uniform(k_y) * (height - crop_h)
  left = jax.random.uniform(k_x) * (width - crop_w)
  return top, left, crop_h, crop_w


@register("inception_crop")
def inception_crop(
  size: int,
  area_min: float = 0.05,
  area_max: float = 1.0,
  aspect_min: float = 3 / 4,
  aspect_max: float = 4 / 3,
  attempts: int = 10,
) -> Op:
  """Inception's distorted crop (the whole image as bounding box), resized to size × size."""

  def op(rng, image):
    window = sample_crop_window(
      rng, image.shape[0], image.shape[1], (area_min, area_max), (aspect_min, aspect_max), attempts
    )
    return _resize_window(image, *window, size)

  return op


@register("central_crop")
def central_crop(size: int, fraction: float = 0.875) -> Op:
  """The central `fraction` of the image (each side), resized to size × size: Inception eval."""

  def op(rng, image):
    del rng
    h, w = image.shape[0], image.shape[1]
    return _resize_window(
      image, (1 - fraction) * h / 2, (1 - fraction) * w / 2, fraction * h, fraction * w, size
    )

  return op


def _rgb_to_hsv(rgb):
  r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
  value = rgb.max(-1)
  delta = value - rgb.min(-1)
  safe = jnp.where(delta > 0, delta, 1.0)
  saturation = jnp.where(value > 0, delta / jnp.where(value > 0, value, 1.0), 0.0)
  hue = jnp.where(
    value == r, (g - b) / safe, jnp.where(value == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe)
  )
  hue = jnp.where(delta > 0, (hue / 6.0) % 1.0, 0.0)
  return hue, saturation, value


def _hsv_to_rgb(hue, saturation, value):
  k = (jnp.array([5.0, 3.0, 1.0]) + hue[..., None] * 6.0) % 6.0
  weight = jnp.clip(jnp.minimum(k, 4.0 - k), 0.0, 1.0)
  return value[..., None] - value[..., None] * saturation[..., None] * weight


@register("color_distort")
def color_distort(
  brightness: float = 32 / 255, saturation: float = 0.5, hue: float = 0.2, contrast: float = 0.5
) -> Op:
  """Inception's colour distortion: brightness ±32/255, saturation and contrast ×[0.5, 1.5],
  hue ±0.2 (of the colour circle), in one of four random orders; clipped to [0, 1]."""

  def op(rng, image):
    k_order, k_b, k_s, k_h, k_c = jax.random.split(rng, 5)
    delta_b = jax.random.uniform(k_b, (), minval=-brightness, maxval=brightness)
    factor_s = jax.random.uniform(k_s, (), minval=1 - saturation, maxval=1 + saturation)
    delta_h = jax.random.uniform(k_h, (), minval=-hue, maxval=hue)
    factor_c = jax.random.uniform(k_c, (), minval=1 - contrast, maxval=1 + contrast)

    def b(x):
      return jnp.clip(x + delta_b, 0.0, 1.0)

    def s(x):
      h, sat, v = _rgb_to_hsv(x)
      return _hsv_to_rgb(h, jnp.clip(sat * factor_s, 0.0, 1.0), v)

    def h(x):
      hh, sat, v = _rgb_to_hsv(x)
      return _hsv_to_rgb((hh + delta_h) % 1.0, sat, v)

    def c(x):
      mean = x.mean(axis=(0, 1), keepdims=True)
      return jnp.clip((x - mean) * factor_c + mean, 0.0, 1.0)

    orders = [(b, s, h, c), (s, b, c, h), (c, h, b, s), (h, s, c, b)]  # as TF's distort_color
    branches = [lambda x, o=o: functools.reduce(lambda y, f: f(y), o, x) for o in orders]
    return jnp.clip(jax.lax.switch(jax.random.randint(k_order, (), 0, 4), branches, image), 0, 1)

  return op


_CALL = re.compile(r"^(?P<name>\w+)(\((?P<args>.*)\))?$")


def parse(spec: str) -> list[Op]:
  """Turns `"crop(4)|flip_lr"` into ops, with a user error for unknown names or bad args."""
  ops = []
  for part in filter(None, (p.strip() for p in spec.split("|"))):
    match = _CALL.match(part)
    name = match and match["name"]
    if name not in _REGISTRY:
      raise UserError(
        f"augmentation op {part!r} is unknown; available: {', '.join(sorted(_REGISTRY))}"
      )
    try:
      args = ast.literal_eval(f"({match['args']},)") if match["args"] else ()
      ops.append(_REGISTRY[name](*args))
    except (ValueError, SyntaxError, TypeError) as e:
      raise UserError(f"augmentation op {part!r} has bad arguments: {e}") from None
  return ops


def build(spec: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """Returns `augment(rng, images_u8 [B, H, W, C]) -> float32 [B, H, W, C]`."""
  ops = parse(spec)

  def one(rng, image):
    for op, key in zip(ops, jax.random.split(rng, max(len(ops), 1)), strict=False):
      image = op(key, image)
    return image

  def augment(rng, images_u8):
    images = images_u8.astype(jnp.float32) / 255.0
    return jax.vmap(one)(jax.random.split(rng, images.shape[0]), images)

  return augment
