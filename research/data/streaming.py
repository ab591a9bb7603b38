"""Streamed datasets (ImageNet-sized): host workers decode, the devices do everything else.

    tfds.data_source (array_record, no TensorFlow) or an image folder (research/data/folder.py)
      → this process's share of the records (each process reads only its own)
      → global shuffle, new order every epoch (grain; a function of seed and epoch)
      → on `data_workers` worker processes: decode, resize the LONGER side to host_image_size
        (aspect ratio kept), edge-pad to a square so batches stack, remember the valid size
      → batches: image uint8 [per-process batch, S, S, 3], size int32 [.., 2], label
      → `prefetch` batches in flight to the devices while the current step runs.
Random crops (sampled inside each image's valid size, so the crop sees its true aspect
ratio), flips and colour distortions then run on device inside the step (research/augment.py).
Batch k of the stream is a function of (seed, k), so a resumed run starts the stream at its
step and sees exactly the batches an uninterrupted run would.
"""

import collections
import functools
import itertools

import grain
import jax
import numpy as np
from absl import flags
from PIL import Image

from research import environment, steps
from research.data import fingerprint, folder
from research.errors import UserError
from research.inputs import Inputs, check_shard
from research.placement import first_replica, replicate, to_devices
from research.steps import AXIS

EVAL_SPLIT = {"imagenet2012": "validation", "imagenette": "validation"}
DEVICE_KEYS = ("image", "size", "label", "mask")  # what a batch sends to the devices


def open_source(name: str, split: str, data_dir: str):
  """The tfds array_record source; a clear error if it is not prepared."""
  environment.check(environment.TFDS)
  import tensorflow_datasets as tfds  # slow import: only tfds datasets need it

  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # tfds raises several types for a missing dataset  # noqa: BLE001
    where = data_dir or "~/tensorflow_datasets"
    raise UserError(
      f"dataset {name!r} ({split}) is not prepared in data_dir={where} ({type(e).__name__}); "
      f"prepare it once with `tfds build {name} "
      f"--data_dir=DIR --file_format=array_record` and pass --config.data_dir=DIR"
    ) from None


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


def sources(config, scanned: folder.Folder | None = None) -> tuple:
  """(train, eval) sources of host-size images, a description and a fingerprint of the data.

  The fingerprint covers the file list and labels (folder) or the prepared version and sizes
  (tfds), not the pixels: reading every file to resume would take as long as an epoch.
  """
  size = config.host_image_size
  if config.dataset == "folder":
    data = scanned or folder.scan(config.data_dir, config.skip_bad_images)
    folder.check_num_classes(data, config.model.num_classes)
    train, test = (
      folder.FileImages(data.root, split, size, config.skip_bad_images)
      for split in (data.train, data.eval)
    )
    description = f"folder:{data.root} ({len(train)} train, {len(test)} {data.eval.name})"
    content = fingerprint(data.train.paths, data.train.labels, data.eval.paths, data.eval.labels)
    return train, test, description, content
  train = open_source(config.dataset, "train", config.data_dir)
  test = open_source(config.dataset, EVAL_SPLIT[config.dataset], config.data_dir)
  where = config.data_dir or "~/tensorflow_datasets"
  version = getattr(getattr(train, "dataset_info", None), "version", "")
  content = fingerprint(np.array([config.dataset, str(version), len(train), len(test)]))
  return (
    TfdsImages(train, size),
    TfdsImages(test, size),
    f"tfds:{where} ({len(train)} train)",
    content,
  )


def process_share(source, seed: int, shuffle: bool) -> grain.MapDataset:
  """This process's records (every process_count-th), shuffled per epoch if asked."""
  ds = grain.MapDataset.source(source)[jax.process_index() :: jax.process_count()]
  return ds.shuffle(seed) if shuffle else ds


def _iterate(ds: grain.MapDataset, workers: int):
  """Iterates `ds`, its elements computed on `workers` processes (0: in this process)."""
  stream = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  if workers:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; we parse none of ours
      flags.FLAGS.mark_as_parsed()
    stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  return iter(stream)


def batch_stream(ds: grain.MapDataset, batch: int, start: int, workers: int):
  """Batches `start`, `start + 1`, … of `ds` as numpy, decoded on `workers` processes."""
  return _iterate(ds.batch(batch, drop_remainder=True)[start:], workers)


def prefetch_to_devices(batches, depth: int, on_host=None):
  """Keeps `depth` batches on their way to the devices ahead of the one handed out.

  Only DEVICE_KEYS travel; `on_host(batch)` sees each whole numpy batch first (counters).
  """
  n_local = jax.local_device_count()
  split = lambda x: x.reshape(n_local, -1, *x.shape[1:])  # [devices, per_device, ...]
  queue = collections.deque()
  try:
    for batch in batches:
      if on_host:
        on_host(batch)
      queue.append({k: to_devices(split(v)) for k, v in batch.items() if k in DEVICE_KEYS})
      if len(queue) > depth:
        yield queue.popleft()
    yield from queue
  finally:  # stop grain's worker processes and free their shared memory now, not at exit
    getattr(batches, "close", lambda: None)()


def eval_batches(source, per_process_batch: int, workers: int):
  """The whole eval split, every process the same number of batches, padding masked out."""
  per_process = -(-len(source) // jax.process_count())
  n_batches = -(-per_process // per_process_batch)
  stream = _iterate(process_share(source, 0, shuffle=False), workers)
  try:
    for _ in range(n_batches):
      records = list(itertools.islice(stream, per_process_batch))
      real = len(records)
      records = records or [source[0]]  # this process's share ended: padding keeps step
      pad = [records[0]] * (per_process_batch - len(records))
      batch = {k: np.stack([r[k] for r in records + pad]) for k in records[0]}
      batch["mask"] = (np.arange(per_process_batch) < real).astype(np.float32)
      yield batch
  finally:
    stream.close()  # stop the workers now


def inputs(config, *, step_kwargs, preprocess, keys, per_device_batch, scanned=None) -> Inputs:
  """A streamed dataset as the training loop sees it (`scanned`: the folder, if already read)."""
  _, step_key = keys  # shuffling is grain's, from config.seed
  n_devices, n_local = jax.device_count(), jax.local_device_count()
  train_source, eval_source, description, content = sources(config, scanned)
  per_process = per_device_batch * n_local
  shard_size = check_shard(config, len(train_source), n_devices, per_device_batch)
  train_ds = process_share(train_source, config.seed, shuffle=True).repeat(None)
  skipped = [0]  # undecodable files passed over so far (skip_bad_images), counted on the host

  def count_skipped(batch):
    skipped[0] += int(batch["skipped"].sum())

  def batches(start_step):
    stream = batch_stream(train_ds, per_process, start_step, config.data_workers)
    return prefetch_to_devices(stream, config.prefetch, count_skipped)

  p_eval = jax.pmap(functools.partial(steps.streamed_eval, preprocess=preprocess), axis_name=AXIS)
  eval_per_process = config.eval_batch_size // jax.process_count()

  def evaluate(rstate):
    totals = replicate(jax.device_get(steps.zero_totals()))  # summed on device, fetched once
    stream = eval_batches(eval_source, eval_per_process, config.data_workers)
    for batch in prefetch_to_devices(stream, config.prefetch):
      totals = p_eval(rstate, batch, totals)
    return first_replica(totals)

  augment = step_kwargs["augment"]
  p_preview = jax.pmap(
    lambda batch, rng: augment(steps.device_rngs(rng)[0], batch["image"], batch["size"])[:8],
    axis_name=AXIS,
  )

  def preview(step, batch):
    rngs = replicate(np.asarray(jax.random.key_data(jax.random.fold_in(step_key, step))))
    out = p_preview(batch, jax.random.wrap_key_data(rngs))
    local = np.concatenate([np.asarray(s.data) for s in out.addressable_shards[:4]])
    return local.reshape(-1, *local.shape[2:])

  size = config.host_image_size
  return Inputs(
    name=config.dataset,
    source=description,
    fallback_reason="",
    fingerprint=content,
    num_classes=config.model.num_classes,
    example_shape=(size, size, 3),
    steps_per_epoch=shard_size // per_device_batch,
    train_step=functools.partial(steps.streamed_train_step, step_key=step_key, **step_kwargs),
    batches=batches,
    evaluate=evaluate,
    preview=preview,
    skipped_images=lambda: skipped[0],
  )
