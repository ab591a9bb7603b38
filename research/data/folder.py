"""Image folders as datasets: `DIR/train/<class>/*` and `DIR/{val,validation,test}/<class>/*`.

Class index = position of the class directory among the sorted directory names of `train`,
and every file with an extension PIL reads anywhere under a class directory is an example of
it, subfolders included (as torchvision's ImageFolder). Hidden files and folders and files of
other kinds are passed over and counted. Every image becomes uint8 RGB as a viewer shows it
(`as_rgb`): EXIF orientation applied, 16-bit and float pixels scaled, transparency over white.

  - resident (CIFAR-sized): `load_resident` decodes every file once (in parallel on worker
    processes, one pool for both splits, when there are more than `CHUNK`), caches the
    uint8 arrays in the data cache (keyed by the file list, sizes and mtimes) and hands them to
    the same device-resident path as cifar10 (research/inputs.py).
  - streamed (ImageNet-sized): `FileImages` is a random-access source that research/data/
    streaming.py reads on `data_workers` processes; each image is decoded straight to its
    host size (JPEG: libjpeg decodes at 1/2–1/8 scale when that still covers it).
"""

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import tqdm
from PIL import ExifTags, Image

from research import host_workers
from research.data.base import CACHE, ImageDataset
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
  passed_over: list[str]  # hidden files and folders and non-images, relative to root


def class_dirs(split_dir: Path) -> list[str]:
  """The class directories of a split, sorted: label = index here (hidden ones passed over)."""
  return sorted(d.name for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))


def files_under(directory: Path) -> tuple[list[str], list[str]]:
  """(images, passed over) under `directory`, subfolders included, as sorted paths relative to
  it. Hidden files and folders (a name starting with ".": .DS_Store, .ipynb_checkpoints/) and
  files whose extension PIL does not read (Thumbs.db, notes.txt) are passed over."""
  images, other = [], []
  for parent, dirs, files in os.walk(directory, followlinks=True):
    rel = Path(parent).relative_to(directory)
    other += [f"{rel / d}/" for d in dirs if d.startswith(".")]
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    for name in files:
      readable = not name.startswith(".") and Path(name).suffix.lower() in EXTENSIONS
      (images if readable else other).append(str(rel / name))
  return sorted(images), sorted(other)


def _split(root: Path, name: str, classes: list[str], skip_bad: bool = False):
  """Every image file under root/name/<class>/, sorted by class then path, and the files
  passed over under root/name (loose files beside the class directories included).

  For the train split (`classes` are its directories), a class directory without images is
  an error, or with `skip_bad` a warning: the class keeps its index and counts in the class
  count, it just has no training examples.
  """
  paths, labels = [], []
  passed_over = [
    f"{name}/{e.name}" for e in os.scandir(root / name) if not e.is_dir() or e.name[0] == "."
  ]
  for label, cls in enumerate(classes):
    class_dir = root / name / cls
    if not class_dir.is_dir():
      continue
    files, other = files_under(class_dir)
    passed_over += [f"{name}/{cls}/{f}" for f in other]
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
  split = Split(name, np.asarray(paths, dtype=bytes), np.asarray(labels, np.int32))
  return split, sorted(passed_over)


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
  classes = class_dirs(root / "train")
  if not classes:
    raise UserError(f"{root / 'train'} has no class directories; an image folder is {layout}")
  eval_name = next((s for s in EVAL_SPLITS if (root / s).is_dir()), None)
  if eval_name is None:
    raise UserError(f"data_dir={data_dir} has no val/, validation/ or test/ directory ({layout})")
  missing = sorted(set(class_dirs(root / eval_name)) - set(classes))
  if missing:
    raise UserError(
      f"{root / eval_name} has classes that train/ lacks: {', '.join(missing[:5])}"
      f"{' …' if len(missing) > 5 else ''}; every eval class needs a train/<class> directory"
    )
  train, passed_over = _split(root, "train", classes, skip_bad)
  test, passed_over_eval = _split(root, eval_name, classes)
  return Folder(root, classes, train, test, passed_over + passed_over_eval)


def summary(folder: Folder, skipped: int | None, resized: int = 0, size: int = 0) -> str:
  """What a run found in `folder` and what it left out, in one line (`skipped`: undecodable
  files, None where they are found only as the files are read; `resized`: images brought to
  size × size)."""
  n_train, n_eval = len(folder.train.paths), len(folder.eval.paths)
  line = (
    f"{folder.root}: train {n_train:,} images in {len(folder.classes)} classes, "
    f"{folder.eval.name} {n_eval:,}"
  )
  left_out = []
  if folder.passed_over:
    n = len(folder.passed_over)
    left_out.append(f"passed over {n:,} non-image or hidden file{'s' if n > 1 else ''}")
  if skipped:
    left_out.append(f"skipped {skipped:,} undecodable")
  if resized:
    line += f"; {resized:,} brought to {size}×{size} (shorter side resized, center cropped)"
  return line + (f"; {', '.join(left_out)}" if left_out else "")


ORIENTATION = ExifTags.Base.Orientation
# EXIF orientation -> the transpose that shows the image upright (as ImageOps.exif_transpose)
UPRIGHT = {
  2: Image.Transpose.FLIP_LEFT_RIGHT,
  3: Image.Transpose.ROTATE_180,
  4: Image.Transpose.FLIP_TOP_BOTTOM,
  5: Image.Transpose.TRANSPOSE,
  6: Image.Transpose.ROTATE_270,
  7: Image.Transpose.TRANSVERSE,
  8: Image.Transpose.ROTATE_90,
}
WIDE_GRAY = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": 65535, "F": 1}


def as_rgb(image: Image.Image) -> Image.Image:
  """`image` as 8-bit RGB, as a viewer shows it.

  16-bit grayscale (and 32-bit integer pixels, read as 16-bit) is scaled by 255 / 65535 and
  rounded, float pixels in [0, 1] by 255; pixels outside those ranges have no sensible 8-bit
  form, and the file counts as undecodable (ValueError). Transparency (an alpha channel, or a
  palette's or grayscale's transparent value) is composited over white. 16-bit RGB PNGs reach
  here as 8-bit RGB (Pillow keeps each sample's high byte); CMYK and YCbCr convert as Pillow
  converts them; a mode Pillow cannot convert raises ValueError.
  """
  if image.mode in WIDE_GRAY:
    top = WIDE_GRAY[image.mode]
    pixels = np.asarray(image).astype(np.float64)
    if not (np.isfinite(pixels).all() and pixels.min() >= 0 and pixels.max() <= top):
      raise ValueError(f"mode {image.mode} pixels outside [0, {top}] have no 8-bit form")
    gray = np.rint(pixels * (255 / top)).astype(np.uint8)
    return Image.fromarray(np.repeat(gray[..., None], 3, axis=-1), "RGB")
  if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255,) * 4), rgba).convert("RGB")
  return image if image.mode == "RGB" else image.convert("RGB")


def gray(rgb: np.ndarray) -> np.ndarray:
  """uint8 [h, w, 3] as one channel, [h, w, 1]: PIL's luma (L = R·299/1000 + G·587/1000 +
  B·114/1000)."""
  return np.asarray(Image.fromarray(rgb, "RGB").convert("L"))[..., None]


def read_rgb(path, max_side: int = 0, cover: int = 0) -> np.ndarray:
  """Decodes one file (or a PIL image) to uint8 [h, w, 3] upright (`as_rgb`); with max_side,
  its longer side resized to max_side; with cover, its shorter side resized to cover and its
  center cropped to cover × cover (an image of that size already is kept as it is)."""
  if isinstance(path, Image.Image):
    return _decode(path.copy(), max_side, cover)  # draft and resize leave the caller's as it is
  with Image.open(path) as image:
    return _decode(image, max_side, cover)


def _decode(image: Image.Image, max_side: int = 0, cover: int = 0) -> np.ndarray:
  """read_rgb of an opened file.

  `Image.draft` lets libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale while the result still
  covers the target, so big images cost a fraction of a full decode; the resize does the rest.
  """
  orientation = image.getexif().get(ORIENTATION, 1)
  side = max_side or cover
  if side and image.size != (cover, cover):
    scale = side / (max(image.size) if max_side else min(image.size))
    target = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    image.draft("RGB", target)  # a no-op for formats other than JPEG
  else:
    target = image.size
  rgb = as_rgb(image)
  if rgb.size != target:
    rgb = rgb.resize(target, Image.BILINEAR, reducing_gap=2.0)
  if orientation in UPRIGHT:
    rgb = rgb.transpose(UPRIGHT[orientation])
  if cover:
    left, top = (rgb.width - cover) // 2, (rgb.height - cover) // 2
    rgb = rgb.crop((left, top, left + cover, top + cover))
  return np.asarray(rgb)


def bad_file_error(path, e: Exception) -> UserError:
  return UserError(
    f"cannot decode {path} ({type(e).__name__}: {e}); remove or replace it, or pass "
    "--config.skip_bad_images=True to skip such files (their count goes into metadata.jsonl)"
  )


def _read_square(path: str, size: int):
  """(the image at size × size, whether it had another size), or the exception for a file that
  cannot be decoded (runs in worker processes)."""
  try:
    with Image.open(path) as image:
      return _decode(image, cover=size), image.size != (size, size)
  except DECODE_ERRORS as e:
    return e


DECODER = 2  # part of the cache key: a change to how files decode makes caches anew


def _cache_key(folder: Folder, size: int) -> str:
  digest = hashlib.sha256(f"{folder.root.resolve()} {DECODER} {size}".encode())
  for split in (folder.train, folder.eval):
    for rel in split.paths:
      stat = (folder.root / rel.decode()).stat()
      digest.update(b"%s %d %d\n" % (rel, stat.st_size, stat.st_mtime_ns))
  digest.update(json.dumps(folder.classes).encode())
  return digest.hexdigest()[:20]


CHUNK = 256  # files a decode worker takes at a time


@contextlib.contextmanager
def _decoder(files: int):
  """`map` of a function over paths: on as many spawned workers as the host has cores (at most
  16), but no more than there are chunks of files; in this process when one chunk holds them
  all (a worker's start, its imports, costs more than decoding a few hundred small files)."""
  workers = min(os.cpu_count() or 1, 16, -(-files // CHUNK))
  if workers <= 1:
    yield map
    return
  with host_workers.pool(workers) as pool:
    yield functools.partial(pool.map, chunksize=CHUNK)


def _decode_split(folder: Folder, split: Split, skip_bad: bool, decode, size: int):
  """uint8 [N, size, size, 3], labels, the files skipped and how many images were resized, of
  one split, decoded by `decode` (`_decoder`'s map)."""
  paths = [str(folder.root / p.decode()) for p in split.paths]
  decoded = list(
    tqdm.tqdm(
      decode(functools.partial(_read_square, size=size), paths),
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
  empty = np.zeros((0, size, size, 3), np.uint8)
  images = np.stack([decoded[i][0] for i in keep]) if keep else empty
  return images, split.labels[keep], skipped, sum(decoded[i][1] for i in keep)


def load_resident(folder: Folder, skip_bad: bool, size: int) -> ImageDataset:
  """The whole folder as uint8 arrays of size × size images, decoded once and then read from
  the data cache. Each image of another size is brought to it: its shorter side resized to
  `size`, its center cropped (`read_rgb`)."""
  cache = CACHE / f"folder-{_cache_key(folder, size)}-{'skip' if skip_bad else 'strict'}.npz"
  source = f"folder:{folder.root} ({len(folder.classes)} classes; cached in {cache})"
  if cache.is_file():
    with np.load(cache) as f:
      arrays = [f[k] for k in ("train_images", "train_labels", "test_images", "test_labels")]
      skipped, resized = [str(p) for p in f["skipped"]], int(f["resized"])
    return ImageDataset(
      "folder", source, *arrays, len(folder.classes), skipped_files=skipped, resized=resized
    )
  with _decoder(len(folder.train.paths) + len(folder.eval.paths)) as decode:  # both splits
    train = _decode_split(folder, folder.train, skip_bad, decode, size)
    test = _decode_split(folder, folder.eval, skip_bad, decode, size)
  skipped, resized = train[2] + test[2], train[3] + test[3]
  cache.parent.mkdir(parents=True, exist_ok=True)
  # A name of its own: processes on one host, or hosts sharing the cache, may decode at once.
  fd, partial = tempfile.mkstemp(dir=cache.parent, prefix=f"{cache.stem}.", suffix=".partial")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(
        f,
        train_images=train[0],
        train_labels=train[1],
        test_images=test[0],
        test_labels=test[1],
        skipped=np.asarray(skipped, dtype=str),
        resized=resized,
      )
    os.replace(partial, cache)  # a cache file is always complete; the last of equal ones stays
  except BaseException:  # Ctrl-C or a full disk: no partial file is left behind
    Path(partial).unlink(missing_ok=True)
    raise
  return ImageDataset(
    "folder",
    source,
    *train[:2],
    *test[:2],
    len(folder.classes),
    skipped_files=skipped,
    resized=resized,
  )


def fits_on_devices(folder: Folder, max_gb: float, size: int) -> bool:
  """Whether the train split decoded at size × size is at most max_gb."""
  return len(folder.train.paths) * size * size * 3 <= max_gb * 2**30


class FileImages:
  """A split as a random-access source of host-size images, for grain (runs in workers).

  Item i is the image resized so its longer side is `size`, at the top-left of a size × size
  array whose rest repeats the edge pixels, its valid (height, width), and its label. With
  `skip_bad`, a file that cannot be decoded is replaced by the next one that can (the count
  of files passed over and the record read instead travel with the item, so that the host
  names each skipped file once), and batches keep their size and order.
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
        continue
      item = dict(pad_to_square(image, self.size), label=self.split.labels[i])
      return dict(item, skipped=skipped, index=i)
    raise UserError(f"no file of {self.root}/{self.split.name} can be decoded")


def pad_to_square(image: np.ndarray, size: int) -> dict:
  """uint8 [h, w, 3] with max(h, w) == size → {"image": [size, size, 3], "size": [h, w]}."""
  h, w = image.shape[:2]
  padded = np.pad(image, ((0, size - h), (0, size - w), (0, 0)), mode="edge")
  return {"image": padded, "size": np.asarray([h, w], np.int32)}
