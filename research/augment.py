"""On-device augmentation: small named ops composed from a config string, run per shard.

A pipeline is written like `"crop(4)|flip_lr|standardize"`. Each op is a factory registered
by name; it returns `op(rng, image) -> image` for ONE float32 image [H, W, C] in [0, 1]
(`standardize` maps to zero mean, unit variance). `build` vmaps the ops over the batch with
one key per example, so the whole pipeline is a jittable function of (rng, images_u8).
Inside the pmapped step every device folds its index into `rng` first, so devices draw
different crops and flips. A fork adds an op by decorating a factory with `@register`.
"""

import ast
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
