"""What every dataset module shares: the registry of datasets held whole in memory, the
dataset they load (`ImageDataset`), where data is kept (`CACHE`) and its fingerprint. The
package (research/data/__init__.py) re-exports them; its modules import them from here."""

import dataclasses
import hashlib
import os
from pathlib import Path

import numpy as np

from research.registry import Registry

DATASETS = Registry("dataset", "dataset", "research.data")
register = DATASETS.register  # register(name, num_classes=N): N checked before loading

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
  # The classes' names in label order (recorded with the run: predict and trained.load name
  # the classes by them); () for the labels as text
  classes: tuple = ()
  skipped_files: list = dataclasses.field(default_factory=list)  # undecodable, skipped
  resized: int = 0  # images brought to the dataset's one size (image folders)


def fingerprint(*arrays: np.ndarray) -> str:
  """A short digest of array contents: tells whether a resumed run sees the same data."""
  digest = hashlib.sha1()
  for a in arrays:
    digest.update(str((a.dtype, a.shape)).encode())
    digest.update(np.ascontiguousarray(a).data)
  return digest.hexdigest()[:16]
