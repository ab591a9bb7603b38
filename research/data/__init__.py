"""Data sources. In-memory datasets (CIFAR-sized) come back whole as uint8 arrays."""

import dataclasses

import numpy as np


@dataclasses.dataclass
class ImageDataset:
  """A whole dataset in host memory, ready to be uploaded once to the devices."""

  name: str  # the dataset actually used: "cifar10" or "synthetic"
  source: str  # where it was read from, for the run metadata
  train_images: np.ndarray  # uint8 [N, H, W, C]
  train_labels: np.ndarray  # int32 [N]
  test_images: np.ndarray  # uint8 [M, H, W, C]
  test_labels: np.ndarray  # int32 [M]
  num_classes: int
  fallback_reason: str = ""  # why synthetic data replaced the requested dataset, if it did
