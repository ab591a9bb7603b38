"""Image folders as datasets: `DIR/train/<class>/*` and `DIR/{val,validation,test}/<class>/*`.

Class index = position of the class directory among the sorted directory names of `train`
(as torchvision's ImageFolder); every file with an extension PIL reads counts (JPEG, PNG, …;
grayscale, palette and CMYK images become RGB).

  - resident (CIFAR-sized): `load_resident` decodes every file once, in parallel, caches the
    uint8 arrays in the data cache (keyed by the file list, sizes and mtimes) and hands them to
    the same device-resident path as cifar10 (research/inputs.py).
  - streamed (ImageNet-sized): `FileImages` is a random-access source that research/data/
    streaming.py reads on `data_workers` processes; each image is decoded straight to its
    host size (JPEG: libjpeg decodes at 1/2–1/8 scale when that still covers it).
"""

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import tqdm
from PIL import Image

from research import host_workers
from research.data import CACHE, ImageDataset
from research.errors import UserError

EVAL_SPLITS = ("val", "validation", "test")  # the first one present is the eval split
EXTENSIONS = frozenset(Image.registered_extensions())  # ".jpg", ".jpeg", ".png", …
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@dataclasses.dataclass
class Split:
  """One split's files: paths relative to the folder root, and labels."""

  name: str
  paths: np.ndarray  # bytes [N], e.g. b"train/cat/0001.jpg" (numpy: cheap to send to workers)
  labels: np.ndarray  # int32 [N]


@dataclasses.dataclass
class Folder:
  root: Path
  classes: list[str]  # sorted class directory names of train; label = index here
  train: Split
  eval: Split


def _class_dirs(split_dir: Path) -> list[str]:
  return sorted(d.name for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))


def _split(root: Path, name: str, classes: list[str], skip_bad: bool = False) -> Split:
  """Every image file under root/name/<class>/, sorted by class then file name.

  For the train split (`classes` are its directories), a class directory without images is
  an error, or with `skip_bad` a warning: the class keeps its index and counts in the class
  count, it just has no training examples.
  """
  paths, labels = [], []
  for label, cls in enumerate(classes):
    class_dir = root / name / cls
    if not class_dir.is_dir():
      continue
    files = sorted(
      e.name
      for e in os.scandir(class_dir)
      if e.is_file() and not e.name.startswith(".") and Path(e.name).suffix.lower() in EXTENSIONS
    )
    if not files and name == "train":
      if not skip_bad:
        raise UserError(
          f"{class_dir} holds no image files, so class {label} ({cls}) has no training "
          "examples; add its images, remove the directory (one class fewer), or pass "
          "--config.skip_bad_images=True to train with the class empty"
        )
      print(
        f"warning: {class_dir} holds no image files: class {label} ({cls}) has no training "
        f"examples and still counts among the {len(classes)} classes (skip_bad_images)",
        flush=True,
      )
    paths += [f"{name}/{cls}/{f}".encode() for f in files]
    labels += [label] * len(files)
  if not paths:
    raise UserError(
      f"{root / name} holds no image files (expected {name}/<class>/*.jpg or other files PIL reads)"
    )
  return Split(name, np.asarray(paths, dtype=bytes), np.asarray(labels, np.int32))


def scan(data_dir: str, skip_bad: bool = False) -> Folder:
  """Lists the train and eval splits of an image folder; one-line errors for bad layouts
  (`skip_bad`: a train class without images is a warning, see `_split`)."""
  layout = "DIR/train/<class>/* and DIR/val/<class>/* (or validation/, test/)"
  if not data_dir:
    raise UserError(f"dataset=folder needs --config.data_dir=DIR with {layout}")
  root = Path(data_dir).expanduser()
  if not (root / "train").is_dir():
    if not root.exists():
      what = "does not exist"
    elif not root.is_dir():
      what = "is a file, not a directory (extract an archive first)"
    else:
      what = "has no train/ directory"
    raise UserError(f"data_dir={data_dir} {what}; an image folder is {layout}")
  classes = _class_dirs(root / "train")
  if not classes:
    raise UserError(f"{root / 'train'} has no class directories; an image folder is {layout}")
  eval_name = next((s for s in EVAL_SPLITS if (root / s).is_dir()), None)
  if eval_name is None:
    raise UserError(f"data_dir={data_dir} has no val/, validation/ or test/ directory ({layout})")
  missing = sorted(set(_class_dirs(root / eval_name)) - set(classes))
  if missing:
    raise UserError(
      f"{root / eval_name} has classes that train/ lacks: {', '.join(missing[:5])}"
      f"{' …' if len(missing) > 5 else ''}; every eval class needs a train/<class> directory"
    )
  train = _split(root, "train", classes, skip_bad)
  return Folder(root, classes, train, _split(root, eval_name, classes))


def read_rgb(path: str, max_side: int = 0) -> np.ndarray:
  """Decodes one file to uint8 [h, w, 3]; with max_side, its longer side resized to max_side.

  `Image.draft` lets libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale while the result still
  covers the target, so big images cost a fraction of a full decode; the resize does the rest.
  """
  with Image.open(path) as image:
    if max_side:
      scale = max_side / max(image.size)
      target = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
      image.draft("RGB", target)  # a no-op for formats other than JPEG
    if image.mode != "RGB":  # grayscale, palette, CMYK, RGBA, …; a no-op copy otherwise
      image = image.convert("RGB")
    if max_side and image.size != target:
      image = image.resize(target, Image.BILINEAR, reducing_gap=2.0)
    return np.asarray(image)


def bad_file_error(path, e: Exception) -> UserError:
  return UserError(
    f"cannot decode {path} ({type(e).__name__}: {e}); remove or replace it, or pass "
    "--config.skip_bad_images=True to skip such files (their count goes into metadata.jsonl)"
  )


def _read_or_none(path: str):
  """read_rgb, or the exception for a file that cannot be decoded (runs in worker processes)."""
  try:
    return read_rgb(path)
  except DECODE_ERRORS as e:
    return e


def _cache_key(folder: Folder) -> str:
  digest = hashlib.sha256(str(folder.root.resolve()).encode())
  for split in (folder.train, folder.eval):
    for rel in split.paths:
      stat = (folder.root / rel.decode()).stat()
      digest.update(b"%s %d %d\n" % (rel, stat.st_size, stat.st_mtime_ns))
  digest.update(json.dumps(folder.classes).encode())
  return digest.hexdigest()[:20]


def _decode_split(folder: Folder, split: Split, skip_bad: bool, workers: int):
  """uint8 [N, H, W, 3] and labels of one split, decoded on `workers` processes."""
  paths = [str(folder.root / p.decode()) for p in split.paths]
  with host_workers.pool(workers) as pool:
    decoded = list(
      tqdm.tqdm(
        pool.map(_read_or_none, paths, chunksize=256),
        total=len(paths),
        desc=f"decoding {folder.root / split.name}",
        unit="img",
        mininterval=2.0,
      )
    )
  keep, skipped = [], []
  for i, result in enumerate(decoded):
    if isinstance(result, Exception):
      if not skip_bad:
        raise bad_file_error(paths[i], result)
      skipped.append(paths[i])
    else:
      keep.append(i)
  shapes = {decoded[i].shape for i in keep}
  if len(shapes) > 1:
    first = decoded[keep[0]].shape
    odd = next(i for i in keep if decoded[i].shape != first)
    raise UserError(
      f"{folder.root / split.name} holds images of different sizes ({paths[keep[0]]} is "
      f"{first[1]}×{first[0]}, {paths[odd]} is {decoded[odd].shape[1]}×{decoded[odd].shape[0]});"
      " a resident dataset needs one size: pass --config.data_placement=streamed"
    )
  images = np.stack([decoded[i] for i in keep]) if keep else np.zeros((0, 1, 1, 3), np.uint8)
  return images, split.labels[keep], skipped


def load_resident(folder: Folder, skip_bad: bool) -> ImageDataset:
  """The whole folder as uint8 arrays, decoded once and then read from the data cache."""
  cache = CACHE / f"folder-{_cache_key(folder)}-{'skip' if skip_bad else 'strict'}.npz"
  source = f"folder:{folder.root} ({len(folder.classes)} classes; cached in {cache})"
  if cache.is_file():
    with np.load(cache) as f:
      arrays = [f[k] for k in ("train_images", "train_labels", "test_images", "test_labels")]
      skipped = [str(p) for p in f["skipped"]]
    return ImageDataset("folder", source, *arrays, len(folder.classes), skipped_files=skipped)
  workers = max(1, min(os.cpu_count() or 1, 16))
  train_images, train_labels, skipped = _decode_split(folder, folder.train, skip_bad, workers)
  test_images, test_labels, skipped_test = _decode_split(folder, folder.eval, skip_bad, workers)
  if train_images.shape[1:] != test_images.shape[1:]:
    raise UserError(
      f"{folder.root}: train images are {train_images.shape[2]}×{train_images.shape[1]} but "
      f"{folder.eval.name} images are {test_images.shape[2]}×{test_images.shape[1]}; "
      "pass --config.data_placement=streamed"
    )
  cache.parent.mkdir(parents=True, exist_ok=True)
  # A name of its own: processes on one host, or hosts sharing the cache, may decode at once.
  fd, partial = tempfile.mkstemp(dir=cache.parent, prefix=f"{cache.stem}.", suffix=".partial")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(
        f,
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        skipped=np.asarray(skipped + skipped_test, dtype=str),
      )
    os.replace(partial, cache)  # a cache file is always complete; the last of equal ones stays
  except BaseException:  # Ctrl-C or a full disk: no partial file is left behind
    Path(partial).unlink(missing_ok=True)
    raise
  return ImageDataset(
    "folder",
    source,
    train_images,
    train_labels,
    test_images,
    test_labels,
    len(folder.classes),
    skipped_files=skipped + skipped_test,
  )


def fits_on_devices(folder: Folder, max_gb: float) -> bool:
  """Whether the decoded train split (estimated from its first image) is at most max_gb."""
  with Image.open(folder.root / folder.train.paths[0].decode()) as image:
    width, height = image.size
  return len(folder.train.paths) * width * height * 3 <= max_gb * 2**30


class FileImages:
  """A split as a random-access source of host-size images, for grain (runs in workers).

  Item i is the image resized so its longer side is `size`, at the top-left of a size × size
  array whose rest repeats the edge pixels, its valid (height, width), and its label. With
  `skip_bad`, a file that cannot be decoded is replaced by the next one that can (the count
  of files passed over travels with the item), so batches keep their size and order.
  """

  def __init__(self, root: Path, split: Split, size: int, skip_bad: bool):
    self.root, self.split, self.size, self.skip_bad = str(root), split, size, skip_bad

  def __len__(self) -> int:
    return len(self.split.labels)

  def __getitem__(self, index: int) -> dict:
    for skipped in range(len(self)):
      i = (index + skipped) % len(self)
      path = os.path.join(self.root, self.split.paths[i].decode())
      try:
        image = read_rgb(path, self.size)
      except DECODE_ERRORS as e:
        if not self.skip_bad:
          raise bad_file_error(path, e) from None
        print(f"warning: skipping {path}, which cannot be decoded ({e})", flush=True)
        continue
      return dict(pad_to_square(image, self.size), label=self.split.labels[i], skipped=skipped)
    raise UserError(f"no file of {self.root}/{self.split.name} can be decoded")


def pad_to_square(image: np.ndarray, size: int) -> dict:
  """uint8 [h, w, 3] with max(h, w) == size → {"image": [size, size, 3], "size": [h, w]}."""
  h, w = image.shape[:2]
  padded = np.pad(image, ((0, size - h), (0, size - w), (0, 0)), mode="edge")
  return {"image": padded, "size": np.asarray([h, w], np.int32)}
