"""CIFAR-shaped synthetic data that a network can learn: each class has its own smooth pattern.

Images are `0.5 + 0.2 * template[class] + noise`, with one smooth random template per class
(4×4 noise upsampled to the image size, so it survives crops and flips only partly) and
strong per-pixel noise: classes are separable, loss falls and accuracy rises, but not in a
handful of steps. Deterministic in `seed`.
"""

import numpy as np

from research.data.base import ImageDataset, register

CLASSES = 10  # at most: a model with fewer outputs gets as many


def _templates(rng: np.random.Generator, num_classes: int, size: int, channels: int):
  coarse = rng.normal(size=(num_classes, 4, 4, channels))
  reps = -(-size // 4)
  return np.kron(coarse, np.ones((1, reps, reps, 1)))[:, :size, :size, :]  # [classes, H, W, C]


def _images(rng, templates, labels, noise):
  images = np.empty((len(labels), *templates.shape[1:]), np.uint8)
  means = 0.5 + 0.2 * templates
  for start in range(0, len(labels), 4096):  # chunks keep float memory small
    chunk = labels[start : start + 4096]
    x = rng.normal(size=(len(chunk), *templates.shape[1:]))  # in place from here: no copies
    x *= noise
    x += means[chunk]
    x *= 255
    images[start : start + 4096] = np.clip(np.rint(x, out=x), 0, 255, out=x)
  return images


def make(
  train_size: int,
  test_size: int,
  *,
  image_size: int = 32,
  channels: int = 3,
  num_classes: int = CLASSES,
  noise: float = 0.6,
  seed: int = 0,
  fallback_reason: str = "",
) -> ImageDataset:
  rng = np.random.default_rng(seed)
  templates = _templates(rng, num_classes, image_size, channels)
  train_labels = rng.integers(0, num_classes, train_size).astype(np.int32)
  test_labels = rng.integers(0, num_classes, test_size).astype(np.int32)
  return ImageDataset(
    name="synthetic",
    source=f"generated (seed {seed}, noise {noise})",
    train_images=_images(rng, templates, train_labels, noise),
    train_labels=train_labels,
    test_images=_images(rng, templates, test_labels, noise),
    test_labels=test_labels,
    num_classes=num_classes,
    fallback_reason=fallback_reason,
  )


@register("synthetic")
def load(fields) -> ImageDataset:
  """`make` with the config's sizes and noise: the same data whatever the run's seed (the seed
  is the training's: a run's seeds, `config.seeds`, share its data)."""
  return from_fields(fields, fields.synthetic_train_size, fields.synthetic_test_size)


def from_fields(fields, train_size: int, test_size: int, fallback_reason: str = ""):
  """`make` with `fields`' (a dataset's) image size, noise and the model's classes."""
  return make(
    train_size,
    test_size,
    num_classes=min(fields.model.num_classes, CLASSES),  # labels the model has
    image_size=fields.synthetic_image_size,
    noise=fields.synthetic_noise,
    fallback_reason=fallback_reason,
  )
