"""Streamed datasets (ImageNet-sized): host workers decode, the devices do everything else.

    tfds.data_source (array_record, no TensorFlow)
      → this process's share of the records (each process reads only its own)
      → global shuffle, new order every epoch (grain; a function of seed and epoch)
      → decode + resize to host_image_size² on `data_workers` worker processes (so batches stack)
      → batches of uint8 [per-process batch, S, S, 3]
      → `prefetch` batches in flight to the devices while the current step runs.
Random crops, flips and colour distortions then run on device inside the step
(research/augment.py). Batch k of the stream is a function of (seed, k), so a resumed run
starts the stream at its step and sees exactly the batches an uninterrupted run would.
"""

import collections
import functools
import itertools

import grain
import jax
import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from research import steps
from research.errors import UserError
from research.inputs import Inputs, check_shard
from research.placement import first_replica, replicate, to_devices
from research.steps import AXIS

EVAL_SPLIT = {"imagenet2012": "validation", "imagenette": "validation"}


def open_source(name: str, split: str, data_dir: str):
  """The tfds array_record source; a clear error if it is not prepared."""
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # tfds raises several types for a missing dataset  # noqa: BLE001
    where = data_dir or "~/tensorflow_datasets"
    raise UserError(
      f"dataset {name!r} ({split}) is not prepared in data_dir={where} ({type(e).__name__}); "
      f"prepare it once with `tfds build {name} "
      f"--data_dir=DIR --file_format=array_record` and pass --config.data_dir=DIR"
    ) from None


def decode(record: dict, size: int) -> dict:
  """One record → image uint8 [size, size, 3] (bilinear resize of the whole image), label."""
  image = np.asarray(record["image"], np.uint8)
  if image.ndim == 2 or image.shape[-1] == 1:
    image = np.repeat(image.reshape(*image.shape[:2], 1), 3, axis=-1)
  if image.shape[:2] != (size, size):
    image = np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))
  return {"image": image, "label": np.int32(record["label"])}


def process_share(source, seed: int, shuffle: bool) -> grain.MapDataset:
  """This process's records (every process_count-th), shuffled per epoch if asked."""
  ds = grain.MapDataset.source(source)[jax.process_index() :: jax.process_count()]
  return ds.shuffle(seed) if shuffle else ds


def _iterate(ds: grain.MapDataset, workers: int):
  """Iterates `ds`, its elements computed on `workers` processes (0: in this process)."""
  stream = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  if workers:
    stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  return iter(stream)


def batch_stream(ds: grain.MapDataset, batch: int, start: int, workers: int, size: int):
  """Batches `start`, `start + 1`, … of `ds` as numpy, decoded on `workers` processes."""
  batches = ds.map(functools.partial(decode, size=size)).batch(batch, drop_remainder=True)
  return _iterate(batches[start:], workers)


def prefetch_to_devices(batches, depth: int):
  """Keeps `depth` batches on their way to the devices ahead of the one handed out."""
  n_local = jax.local_device_count()
  split = lambda x: x.reshape(n_local, -1, *x.shape[1:])  # [devices, per_device, ...]
  queue = collections.deque()
  for batch in batches:
    queue.append(tuple(to_devices(split(x)) for x in batch.values()))  # image, label[, mask]
    if len(queue) > depth:
      yield queue.popleft()
  yield from queue


def eval_batches(source, per_process_batch: int, workers: int, size: int):
  """The whole eval split, every process the same number of batches, padding masked out."""
  per_process = -(-len(source) // jax.process_count())
  n_batches = -(-per_process // per_process_batch)
  ds = process_share(source, 0, shuffle=False).map(functools.partial(decode, size=size))
  stream = _iterate(ds, workers)
  for _ in range(n_batches):
    records = list(itertools.islice(stream, per_process_batch))
    pad = per_process_batch - len(records)
    images = np.zeros((per_process_batch, size, size, 3), np.uint8)
    labels = np.zeros(per_process_batch, np.int32)
    if records:
      images[: len(records)] = np.stack([r["image"] for r in records])
      labels[: len(records)] = [r["label"] for r in records]
    mask = np.r_[np.ones(len(records)), np.zeros(pad)].astype(np.float32)
    yield {"image": images, "label": labels, "mask": mask}


def inputs(config, *, step_kwargs, preprocess, keys, per_device_batch) -> Inputs:
  """A streamed dataset as the training loop sees it."""
  _, step_key = keys  # shuffling is grain's, from config.seed
  n_devices, n_local = jax.device_count(), jax.local_device_count()
  train_source = open_source(config.dataset, "train", config.data_dir)
  eval_source = open_source(config.dataset, EVAL_SPLIT[config.dataset], config.data_dir)
  per_process = per_device_batch * n_local
  shard_size = check_shard(config, len(train_source), n_devices, per_device_batch)
  size = config.host_image_size
  train_ds = process_share(train_source, config.seed, shuffle=True).repeat(None)

  def batches(start_step):
    stream = batch_stream(train_ds, per_process, start_step, config.data_workers, size)
    return prefetch_to_devices(stream, config.prefetch)  # (images, labels) on the devices

  p_eval = jax.pmap(functools.partial(steps.streamed_eval, preprocess=preprocess), axis_name=AXIS)
  eval_per_process = config.eval_batch_size // jax.process_count()

  def evaluate(rstate):
    totals = replicate(jax.device_get(steps.zero_totals()))  # summed on device, fetched once
    for batch in prefetch_to_devices(
      eval_batches(eval_source, eval_per_process, config.data_workers, size), config.prefetch
    ):
      totals = p_eval(rstate, batch, totals)
    return first_replica(totals)

  augment = step_kwargs["augment"]
  p_preview = jax.pmap(
    lambda images, rng: augment(steps.device_rngs(rng)[0], images)[:8], axis_name=AXIS
  )

  def preview(step):
    images, _ = next(batches(step))
    rngs = replicate(np.asarray(jax.random.key_data(jax.random.fold_in(step_key, step))))
    out = p_preview(images, jax.random.wrap_key_data(rngs))
    local = np.concatenate([np.asarray(s.data) for s in out.addressable_shards[:4]])
    return local.reshape(-1, *local.shape[2:])

  return Inputs(
    name=config.dataset,
    source=f"tfds:{config.data_dir or '~/tensorflow_datasets'} ({len(train_source)} train)",
    fallback_reason="",
    num_classes=config.model.num_classes,
    example_shape=(size, size, 3),
    steps_per_epoch=shard_size // per_device_batch,
    train_step=functools.partial(steps.streamed_train_step, step_key=step_key, **step_kwargs),
    batches=batches,
    evaluate=evaluate,
    preview=preview,
  )
