"""Chooses the in-memory dataset a config asks for, falling back to synthetic data loudly."""

import ml_collections

from research.data import IN_MEMORY, ImageDataset, cifar10, synthetic
from research.errors import UserError


def _synthetic(config, train_size, test_size, fallback_reason=""):
  return synthetic.make(
    train_size,
    test_size,
    num_classes=min(config.model.num_classes, synthetic.CLASSES),  # labels the model has
    image_size=config.synthetic_image_size,
    noise=config.synthetic_noise,
    seed=config.seed,
    fallback_reason=fallback_reason,
  )


def load_in_memory(config: ml_collections.ConfigDict) -> ImageDataset:
  """Returns the whole dataset as uint8 arrays on the host."""
  if config.dataset == "synthetic":
    return _synthetic(config, config.synthetic_train_size, config.synthetic_test_size)
  if config.dataset != "cifar10":
    raise UserError(f"dataset={config.dataset!r} is not an in-memory dataset {IN_MEMORY}")
  if config.data_dir:
    return cifar10.load_from(config.data_dir)  # the user named it: no fallback
  try:
    return cifar10.load_cached()
  except cifar10.NotAvailable as e:
    if not config.data_fallback:
      raise UserError(f"CIFAR-10 not found offline: {e}; {cifar10.ways_to_supply()}") from None
    reason = f"{e}. To train on CIFAR-10: {cifar10.ways_to_supply()}"
    return _synthetic(config, 50_000, 10_000, fallback_reason=reason)  # CIFAR-10's sizes
