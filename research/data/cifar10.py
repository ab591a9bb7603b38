"""CIFAR-10 without TensorFlow or network, from whatever the user has.

`data_dir` may be (detected from what is there):
  - the official `cifar-10-python.tar.gz` file,
  - its extracted `cifar-10-batches-py` directory (or a directory that contains it),
  - a TFDS data dir with `cifar10` prepared (read through `tfds.data_source`, array_record).
With no `data_dir`, the archive is looked for in the cache directory and, failing that,
downloaded there from the official site and checked against its MD5.
"""

import hashlib
import os
import pickle
import tarfile
import urllib.request
import zlib
from pathlib import Path

import numpy as np

from research import environment
from research.data import synthetic
from research.data.base import CACHE, ImageDataset, register
from research.errors import UserError

URL = os.environ.get(
  "RESEARCH_CIFAR10_URL", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
)  # a mirror may be given
MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE = "cifar-10-python.tar.gz"
BATCHES_DIR = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILES = ["test_batch"]


class NotAvailable(Exception):
  """CIFAR-10 is not on this machine and could not be downloaded."""


def ways_to_supply() -> str:
  return (
    f"pass --config.data_dir=PATH to {ARCHIVE}, its extracted {BATCHES_DIR} directory, or a "
    f"TFDS data dir with cifar10 prepared; or put {ARCHIVE} in {CACHE}; or run once with "
    f"internet to download it from {URL}"
  )


def _decode_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
  """One Python-2 pickle batch: rows of 3072 bytes (1024 R, 1024 G, 1024 B), any count."""
  batch = pickle.loads(raw, encoding="bytes")
  data = np.asarray(batch[b"data"], np.uint8)
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # [N, 32, 32, 3]
  labels = np.asarray(batch[b"labels"], np.int32)
  if len(images) != len(labels):
    raise ValueError(f"{name} holds {len(images)} images but {len(labels)} labels")
  return images, labels


def _concat(batches):
  images, labels = zip(*batches, strict=True)
  return np.concatenate(images), np.concatenate(labels)


def _read_pickles(read, where: str) -> ImageDataset:
  """`read(name) -> bytes` for each batch file; any damage becomes one clear UserError."""
  try:
    train = _concat(_decode_batch(read(n), n) for n in TRAIN_FILES)
    test = _concat(_decode_batch(read(n), n) for n in TEST_FILES)
  except (
    OSError,
    EOFError,
    KeyError,
    ValueError,
    zlib.error,
    tarfile.TarError,
    pickle.UnpicklingError,
  ) as e:
    raise UserError(
      f"{where} is corrupt or truncated ({type(e).__name__}: {e}); "
      f"replace it with a fresh copy of {URL}"
    ) from None
  return ImageDataset("cifar10", where, *train, *test, num_classes=10)


def _from_tar(path: Path) -> ImageDataset:
  try:
    with tarfile.open(path, "r:gz") as tar:
      members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}

      def read(name):
        return tar.extractfile(members[name]).read()

      return _read_pickles(read, str(path))
  except (OSError, EOFError, zlib.error, tarfile.TarError) as e:
    raise UserError(
      f"{path} is corrupt or truncated ({type(e).__name__}: {e}); "
      f"replace it with a fresh copy of {URL}"
    ) from None


def _from_dir(path: Path) -> ImageDataset:
  return _read_pickles(lambda name: (path / name).read_bytes(), str(path))


def _tfrecord_only(data_dir: Path) -> bool:
  """Whether `data_dir/cifar10` was prepared as TFRecord files, which need TensorFlow to read."""
  files = lambda pattern: any((data_dir / "cifar10").glob(f"*/*.{pattern}*"))
  return files("tfrecord") and not files("array_record")


def _from_tfds(data_dir: Path) -> ImageDataset:
  if _tfrecord_only(data_dir):
    raise UserError(
      f"{data_dir / 'cifar10'} holds no array_record files (TFRecord files need TensorFlow); "
      f"re-prepare it with `tfds build cifar10 --data_dir={data_dir} "
      f"--file_format=array_record`, or pass --config.data_dir=PATH to {ARCHIVE}"
    )
  environment.check(environment.TFDS)
  import tensorflow_datasets as tfds  # slow import; only this source needs it

  def split(name):
    source = tfds.data_source("cifar10", split=name, data_dir=str(data_dir), download=False)
    records = [source[i] for i in range(len(source))]
    images = np.stack([r["image"] for r in records]).astype(np.uint8)
    return images, np.asarray([r["label"] for r in records], np.int32)

  return ImageDataset("cifar10", f"tfds:{data_dir}", *split("train"), *split("test"), 10)


def load_from(data_dir: str) -> ImageDataset:
  """Reads CIFAR-10 from an archive, a batches directory or a TFDS data dir."""
  path = Path(data_dir).expanduser()
  if path.is_file():
    return _from_tar(path)
  if (path / BATCHES_DIR).is_dir():
    path = path / BATCHES_DIR
  if (path / TRAIN_FILES[0]).is_file():
    return _from_dir(path)
  if (path / "cifar10").is_dir():
    return _from_tfds(path)
  if (path / ARCHIVE).is_file():
    return _from_tar(path / ARCHIVE)
  what = "does not exist" if not path.exists() else "holds no CIFAR-10 in a known format"
  raise UserError(f"data_dir={data_dir} {what}: {ways_to_supply()}")


def _md5(path: Path) -> str:
  digest = hashlib.md5()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _download(target: Path, timeout_s: float) -> None:
  """Downloads the official archive to `target`, checked against its MD5."""
  target.parent.mkdir(parents=True, exist_ok=True)
  partial = target.with_suffix(".partial")
  try:
    with urllib.request.urlopen(URL, timeout=timeout_s) as response, open(partial, "wb") as f:
      for block in iter(lambda: response.read(1 << 20), b""):
        f.write(block)
  except OSError as e:
    partial.unlink(missing_ok=True)
    raise NotAvailable(f"no {ARCHIVE} in {CACHE} and the download failed ({e})") from None
  if (got := _md5(partial)) != MD5:
    partial.unlink()
    raise NotAvailable(f"downloaded {ARCHIVE} has MD5 {got}, expected {MD5}")
  partial.rename(target)


def load_cached(download_timeout_s: float = 20.0) -> ImageDataset:
  """Reads the cached archive, downloading it first if needed; raises NotAvailable."""
  tfds_dir = Path.home() / "tensorflow_datasets"
  if (CACHE / ARCHIVE).is_file():
    return _from_tar(CACHE / ARCHIVE)
  if (tfds_dir / "cifar10").is_dir() and not _tfrecord_only(tfds_dir):  # TFRecord: passed over
    return _from_tfds(tfds_dir)
  print(f"CIFAR-10 not found locally; downloading {URL} to {CACHE} ...", flush=True)
  _download(CACHE / ARCHIVE, download_timeout_s)
  return _from_tar(CACHE / ARCHIVE)


@register("cifar10", num_classes=10)
def load(fields) -> ImageDataset:
  """CIFAR-10 from `fields.data_dir`, else the cache (downloading it); with no data and no
  network, synthetic data of CIFAR-10's sizes where `fields.data_fallback` (said loudly)."""
  if fields.data_dir:
    return load_from(fields.data_dir)  # the user named it: no fallback
  try:
    return load_cached()
  except NotAvailable as e:
    if not fields.data_fallback:
      raise UserError(f"CIFAR-10 not found offline: {e}; {ways_to_supply()}") from None
    reason = f"{e}. To train on CIFAR-10: {ways_to_supply()}"
    return synthetic.from_fields(fields, 50_000, 10_000, fallback_reason=reason)
