"""Data sources. In-memory datasets (CIFAR-sized) come back whole as uint8 arrays."""

import dataclasses
import hashlib
import os
from pathlib import Path

import numpy as np

from research.errors import UserError

IN_MEMORY = ("cifar10", "synthetic")  # loaded whole by research/data/load.py
STREAMED = ("imagenet2012", "imagenette")  # tfds array_record, research/data/streaming.py
DATASETS = (*IN_MEMORY, *STREAMED, "folder")  # folder: resident or streamed (data_placement)
PLACEMENTS = ("auto", "resident", "streamed")
CLASSES = {"cifar10": 10, "imagenet2012": 1000, "imagenette": 10}  # a folder's: its directories
CIFAR10_NAMES = (
  "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"
)  # fmt: skip


def class_names(dataset: str, num_classes: int, folder_classes=None) -> tuple[str, ...]:
  """The names of the classes, in label order: a folder's class directories, CIFAR-10's
  names, or the labels as text."""
  if folder_classes is not None:
    return tuple(folder_classes)
  if dataset == "cifar10" and num_classes == len(CIFAR10_NAMES):
    return CIFAR10_NAMES
  return tuple(str(label) for label in range(num_classes))


# Where downloaded archives and decoded image folders are kept.
CACHE = Path(os.environ.get("RESEARCH_DATA_CACHE", Path.home() / ".cache" / "research"))


@dataclasses.dataclass
class ImageDataset:
  """A whole dataset in host memory, ready to be uploaded once to the devices."""

  name: str  # the dataset actually used: "cifar10", "folder" or "synthetic"
  source: str  # where it was read from, for the run metadata
  train_images: np.ndarray  # uint8 [N, H, W, C]
  train_labels: np.ndarray  # int32 [N]
  test_images: np.ndarray  # uint8 [M, H, W, C]
  test_labels: np.ndarray  # int32 [M]
  num_classes: int
  fallback_reason: str = ""  # why synthetic data replaced the requested dataset, if it did
  skipped_files: list = dataclasses.field(default_factory=list)  # undecodable, skipped
  resized: int = 0  # images brought to the dataset's one size (image folders)


def fingerprint(*arrays: np.ndarray) -> str:
  """A short digest of array contents: tells whether a resumed run sees the same data."""
  digest = hashlib.sha1()
  for a in arrays:
    digest.update(str((a.dtype, a.shape)).encode())
    digest.update(np.ascontiguousarray(a).data)
  return digest.hexdigest()[:16]


def check_num_classes(where: str, classes: int, num_classes: int) -> None:
  """The model's outputs are the data's classes, one for one."""
  if num_classes != classes:
    raise UserError(
      f"{where} has {classes} classes but model.num_classes={num_classes}; "
      f"pass --config.model.num_classes={classes}"
    )
