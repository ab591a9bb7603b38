"""Data sources. Datasets held whole in memory (CIFAR-sized) are found by name: `config.dataset`
names one registered with `@research.data.register("name")` on `load(config) -> ImageDataset`
(uint8 arrays, checked by `load` below), here or in a fork's module of `config.modules`; it is
handed its view of the config: a dataset's fields (`data_dir`, `seed`, the sizes, ...) and those
it declares, `register(name, fields={...})`.
Image folders (`folder`) and TFDS datasets that stream (STREAMED) are read by their modules."""

import numpy as np

from research.data.base import (  # the package's public names, its modules' shared ones
  CACHE as CACHE,
)
from research.data.base import (
  DATASETS as DATASETS,
)
from research.data.base import (
  ImageDataset as ImageDataset,
)
from research.data.base import (
  fingerprint as fingerprint,
)
from research.data.base import (
  register as register,
)
from research.errors import UserError
from research.fields import of_part

STREAMED = ("imagenet2012", "imagenette")  # tfds array_record, research/data/streaming.py
READ = (*STREAMED, "folder")  # read by their modules; folder: resident or streamed
PLACEMENTS = ("auto", "resident", "streamed")
STREAMED_CLASSES = {"imagenet2012": 1000, "imagenette": 10}  # a folder's: its directories
CIFAR10_NAMES = (
  "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"
)  # fmt: skip


def class_names(dataset: str, num_classes: int, given=None) -> tuple[str, ...]:
  """The names of the classes, in label order: those the data gives (a folder's class
  directories, a registered dataset's `classes`), CIFAR-10's names, or the labels as text."""
  if given:
    return tuple(given)
  if dataset == "cifar10" and num_classes == len(CIFAR10_NAMES):
    return CIFAR10_NAMES
  return tuple(str(label) for label in range(num_classes))


def check_num_classes(where: str, classes: int, num_classes: int) -> None:
  """The model's outputs are the data's classes, one for one."""
  if num_classes != classes:
    raise UserError(
      f"{where} has {classes} classes but model.num_classes={num_classes}; "
      f"pass --config.model.num_classes={classes}"
    )


def known_classes(dataset: str) -> int | None:
  """The class count of `dataset` where known before it is loaded."""
  if dataset in DATASETS.parts:
    return DATASETS.options[dataset].get("num_classes")
  return STREAMED_CLASSES.get(dataset)


def check_name(dataset: str, modules=()) -> None:
  """A user error unless `dataset` is registered (by the shipped modules or `modules`) or read
  by its module."""
  if dataset not in READ and dataset not in DATASETS.parts:
    raise UserError(DATASETS.unknown(dataset, modules, also=READ))


def load(fields) -> ImageDataset:
  """The registered dataset `fields.dataset`, whole on the host, checked: uint8 images
  [N, H, W, C] of one size in both splits, int labels of the model's classes. Its loader is
  handed its view of `fields` (a dataset's fields and its own: research/fields.py)."""
  data = DATASETS.get(fields.dataset)(of_part(DATASETS, fields.dataset, fields))
  where = f"dataset {fields.dataset!r}"
  if not isinstance(data, ImageDataset):
    raise UserError(f"{where} loaded {type(data).__name__}, not a research.data.ImageDataset")
  for split in ("train", "test"):
    images, labels = getattr(data, f"{split}_images"), getattr(data, f"{split}_labels")
    if not (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 4):
      raise UserError(f"{where}: {split}_images must be a uint8 array [N, H, W, C]")
    if not len(images):
      use = "training takes its batches" if split == "train" else "every eval counts"
      raise UserError(f"{where}: its {split} split is empty, where {use} examples; give it some")
    if images.shape[1:] != data.train_images.shape[1:]:
      raise UserError(
        f"{where}: test images {images.shape[1:]} are not the train images' "
        f"{data.train_images.shape[1:]}"
      )
    labels = np.asarray(labels)
    if labels.shape != (len(images),) or not np.issubdtype(labels.dtype, np.integer):
      raise UserError(f"{where}: {split}_labels must be {len(images)} integers, one per image")
    if len(labels) and not 0 <= labels.min() <= labels.max() < data.num_classes:
      raise UserError(f"{where}: {split}_labels must lie in [0, {data.num_classes})")
    setattr(data, f"{split}_labels", labels.astype(np.int32))
  if data.name != "synthetic":  # a synthetic stand-in has the labels the model has
    check_num_classes(where, data.num_classes, fields.model.num_classes)
  names = tuple(data.classes)
  if names and (len(names) != data.num_classes or not all(isinstance(n, str) for n in names)):
    raise UserError(
      f"{where}: classes={names!r} must be {data.num_classes} names (strings), one per label"
    )
  return data


# What the stored examples' size is read from (`stored_size`).
STORED = ("dataset", "synthetic_image_size", "host_image_size")


def stored_size(fields) -> int:
  """The side of the square uint8 examples a run stores (`fields`: STORED): what its
  augmentation and eval preprocessing start from."""
  sizes = {"cifar10": 32, "synthetic": fields.synthetic_image_size}
  return sizes.get(fields.dataset, fields.host_image_size)


def stored_shape(fields) -> tuple | None:
  """(H, W, C) of the uint8 examples a run stores, known before any image is read; None for a
  registered dataset (its arrays say, once loaded)."""
  if fields.dataset in DATASETS.parts:
    return None
  return (stored_size(fields), stored_size(fields), 3)


# The shipped datasets register themselves on import.
from research.data import cifar10, synthetic  # noqa: E402, F401
