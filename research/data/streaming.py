"""Streamed datasets (ImageNet-sized): host workers decode, the devices do everything else.

    tfds.data_source (array_record, no TensorFlow) or an image folder (research/data/folder.py)
      → one global shuffle, new every epoch (grain; a function of seed and epoch), of which
        each process reads only its block of every global batch (the same batches on any
        process count)
      → on `data_workers` worker processes: decode, resize the LONGER side to host_image_size
        (aspect ratio kept), edge-pad to a square so batches stack, remember the valid size
      → batches: image uint8 [per-process batch, S, S, 3], size int32 [.., 2], label
      → `prefetch` batches in flight to the devices while the current step runs.
This module is the host side only; research/inputs.py sends the batches to the devices, and
random crops (sampled inside each image's valid size, so the crop sees its true aspect ratio),
flips and colour distortions run on device inside the step (research/augment.py). Batch k of
the stream is a function of (seed, k), so a resumed run starts the stream at its step and sees
exactly the batches an uninterrupted run would.
"""

import atexit
import functools
import logging
import os
import signal
from multiprocessing import resource_tracker

import grain
import numpy as np
from absl import flags
from grain.multiprocessing import SharedMemoryArray
from PIL import Image

from research import environment, host_workers
from research.data import folder
from research.data.base import fingerprint
from research.errors import UserError

EVAL_SPLIT = {"imagenet2012": "validation", "imagenette": "validation"}


def open_source(name: str, split: str, data_dir: str):
  """The tfds array_record source; a clear error if it is not prepared."""
  environment.check(environment.TFDS)
  import tensorflow_datasets as tfds  # slow import: only tfds datasets need it

  absl_log = logging.getLogger("absl")
  level = absl_log.level
  # tfds warns of folders it looked for ("Variant folder … has no dataset_info.json") before
  # failing; the error below says what is missing and what to do.
  absl_log.setLevel(logging.ERROR)
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # tfds raises several types for a missing dataset  # noqa: BLE001
    where = data_dir or "~/tensorflow_datasets"
    why = (str(e).splitlines() or [""])[0][:200]  # tfds' own account, one line
    raise UserError(
      f"dataset {name!r} ({split}) is not prepared in data_dir={where} ({type(e).__name__}: "
      f"{why}); prepare it once with `tfds build {name} --data_dir=DIR "
      "--file_format=array_record` and pass --config.data_dir=DIR"
    ) from None
  finally:
    absl_log.setLevel(level)


class TfdsImages:
  """A tfds source as host-size images: the longer side resized to `size`, edge-padded to
  size × size, with the valid (height, width) — the same items as folder.FileImages."""

  def __init__(self, source, size: int):
    self.source, self.size = source, size

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> dict:
    record = self.source[index]
    image = np.asarray(record["image"], np.uint8)
    if image.ndim == 2 or image.shape[-1] == 1:
      image = np.repeat(image.reshape(*image.shape[:2], 1), 3, axis=-1)
    h, w = image.shape[:2]
    scale = self.size / max(h, w)
    target = (max(1, round(w * scale)), max(1, round(h * scale)))
    if target != (w, h):
      image = np.asarray(Image.fromarray(image).resize(target, Image.BILINEAR, reducing_gap=2.0))
    return dict(folder.pad_to_square(image, self.size), label=np.int32(record["label"]), skipped=0)


def sources(fields, scanned: folder.Folder | None) -> tuple:
  """(train, eval) sources of host-size images, a description and a fingerprint of the data;
  `fields`: research/inputs.py's view of the config; `scanned`: the image folder, scanned and
  checked by research/inputs.py (None for tfds).

  The fingerprint covers the file list and labels (folder) or the prepared version and sizes
  (tfds), not the pixels: reading every file to resume would take as long as an epoch.
  """
  size = fields.host_image_size
  if fields.dataset == "folder":
    train, test = (
      folder.FileImages(scanned.root, split, size, fields.skip_bad_images)
      for split in (scanned.train, scanned.eval)
    )
    description = f"folder:{scanned.root} ({len(train)} train, {len(test)} {scanned.eval.name})"
    content = fingerprint(
      scanned.train.paths, scanned.train.labels, scanned.eval.paths, scanned.eval.labels
    )
    return train, test, description, content
  train = open_source(fields.dataset, "train", fields.data_dir)
  test = open_source(fields.dataset, EVAL_SPLIT[fields.dataset], fields.data_dir)
  where = fields.data_dir or "~/tensorflow_datasets"
  version = getattr(getattr(train, "dataset_info", None), "version", "")
  content = fingerprint(np.array([fields.dataset, str(version), len(train), len(test)]))
  return (
    TfdsImages(train, size),
    TfdsImages(test, size),
    f"tfds:{where} ({len(train)} train)",
    content,
  )


def process_share(source, share=(0, 1)) -> grain.MapDataset:
  """Process `share[0]`'s records of `share[1]` processes: every share[1]-th from its index."""
  index, count = share
  return grain.MapDataset.source(source)[index::count]


def shuffled(source, seed: int) -> grain.MapDataset:
  """All records in one order fixed by the seed, repeated forever and shuffled anew every
  epoch: the training stream every process reads its part of (`batch_stream`)."""
  return grain.MapDataset.source(source).shuffle(seed).repeat(None)


def _iterate(ds: grain.MapDataset, workers: int):
  """Iterates `ds`, its elements computed on `workers` processes (0: in this process)."""
  stream = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  if workers:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; we parse none of ours
      flags.FLAGS.mark_as_parsed()
    # The workers hand batches over in shared memory, which needs multiprocessing's resource
    # tracker. The thread that starts it is left with SIGINT and SIGTERM unblocked, whatever
    # they were, and would start workers a signal can kill (research/preemption.py): started
    # here, with this thread's signal mask put back.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    stream = stream.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=workers),
      worker_init_fn=functools.partial(host_workers.leave_signals_to, os.getpid()),
    )
  return iter(stream)


def _unlink_consumed() -> None:
  """The workers hand elements over in shared memory, which grain unlinks once an element is
  dropped, on a thread of its own. What that thread has not done when the run exits is left to
  multiprocessing's resource tracker, which warns of "leaked shared_memory objects": at exit,
  later drops unlink at once and the thread finishes its queue first."""
  # Private names (grain has no public way to wait): if a grain release renames them, the
  # warning comes back and nothing else changes.
  pending = getattr(SharedMemoryArray, "_del_thread_pool", None)
  getattr(SharedMemoryArray, "_disable_async_del", lambda: None)()
  if pending is not None:
    pending.close()
    pending.join()  # queued unlinks finish; each task's semaphore release then fails, unseen


atexit.register(_unlink_consumed)


def batch_stream(ds: grain.MapDataset, batch: int, start: int, workers: int, share=(0, 1)):
  """Process `share[0]`'s part of global batches `start`, `start + 1`, … of `ds` as numpy,
  decoded on `workers` processes: of each global batch of `batch` × share[1] consecutive
  elements, the share[0]-th block of `batch`, so the global batches are the same for any
  number of processes."""
  index, count = share
  return _iterate(ds.batch(batch, drop_remainder=True)[index::count][start:], workers)


def eval_batches(source, per_process_batch: int, workers: int, share=(0, 1)):
  """The whole eval split, every process the same number of batches, padding masked out.

  A record that stands in for an undecodable file (skip_bad_images: the next file that
  decodes, which has its own record) is masked out too: each decodable file counts once."""
  per_process = -(-len(source) // share[1])
  n_batches = -(-per_process // per_process_batch)
  stream = _iterate(process_share(source, share).batch(per_process_batch), workers)
  try:
    for _ in range(n_batches):
      batch = next(stream, None)
      real = 0 if batch is None else len(batch["label"])
      if batch is None:  # this process's share ended: padding keeps step with the others
        batch = {k: np.asarray(v)[None] for k, v in source[0].items()}
      pad = per_process_batch - len(batch["label"])
      batch = {k: np.concatenate([v, np.repeat(v[:1], pad, axis=0)]) for k, v in batch.items()}
      batch["skipped"][real:] = 0  # padding passed over no file
      counted = (np.arange(per_process_batch) < real) & (batch["skipped"] == 0)
      yield dict(batch, mask=counted.astype(np.float32))
  finally:
    stream.close()  # stop the workers now
