"""Data as the training loop sees it: device-ready batches, the step that eats them, eval.

Two kinds, one interface:
  - resident (CIFAR-sized): the whole split lives on the devices as uint8; each step
    gathers its batch on device, so the host hands over the same shard every step, with
    the epoch's order of it (computed once per epoch, ahead of the epoch).
  - streamed (ImageNet-sized): host workers decode fixed-size uint8 batches that are
    prefetched to the devices while the previous step runs (research/data/streaming.py).
"""

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator

import jax
import numpy as np

from research import steps
from research.data import ImageDataset, fingerprint
from research.errors import UserError
from research.placement import first_replica, pad_for_eval, replicate, upload_shards
from research.steps import AXIS


@dataclasses.dataclass
class Inputs:
  name: str  # the dataset actually used
  source: str
  fallback_reason: str  # non-empty when synthetic data replaced the requested dataset
  fingerprint: str  # digest of the data's content (or file list), checked when a run resumes
  num_classes: int
  example_shape: tuple  # [H, W, C] uint8 as stored; the model sees augment(example)
  steps_per_epoch: int
  train_step: Callable  # single-device step(state, batch) -> (state, metrics), to be pmapped
  batches: Callable[[int], Iterator]  # first step -> device-ready batches, one per step
  evaluate: Callable[[object], dict]  # replicated state -> eval totals on the host
  preview: Callable[[int, object], np.ndarray]  # (step, its batch) -> augmented [N, h, w, C]
  skipped_images: Callable[[], int] = lambda: 0  # undecodable files skipped so far


def check_shard(config, n_examples: int, n_devices: int, per_device_batch: int) -> int:
  """Examples per device; a user error if a device would not fill one batch."""
  shard_size = n_examples // n_devices  # the remainder (< n_devices) is not used
  if shard_size < per_device_batch:
    raise UserError(
      f"batch_size={config.batch_size} needs {per_device_batch} examples per device but each "
      f"of the {n_devices} devices holds {shard_size}; lower batch_size"
    )
  return shard_size


def resident(
  config, data: ImageDataset, *, step_kwargs, preprocess, keys, per_device_batch
) -> Inputs:
  """Uploads `data` once, sharded over all devices, and gathers every batch on device."""
  n_devices = jax.device_count()
  shard_size = check_shard(config, len(data.train_labels), n_devices, per_device_batch)
  shuffle_key, step_key = keys
  batch_kwargs = dict(step_key=step_key, per_device_batch=per_device_batch)
  train_shard = upload_shards((data.train_images, data.train_labels), shard_size)
  steps_per_epoch = shard_size // per_device_batch
  epoch_order = jax.jit(
    functools.partial(steps.epoch_order, shuffle_key=shuffle_key, shard_size=shard_size)
  )

  def batches(start_step):
    """(the shard, its epoch's order) for steps start_step, start_step + 1, ...: the same
    arrays within an epoch. The next epoch's order is computed while this one trains, so
    fetching it at the epoch's start does not wait (nor count as input wait)."""
    next_order = epoch_order(start_step // steps_per_epoch)
    for step in itertools.count(start_step):
      if step == start_step or step % steps_per_epoch == 0:
        order = replicate(np.asarray(next_order))  # [devices, shard_size] int32
        next_order = epoch_order(step // steps_per_epoch + 1)  # dispatched, not awaited
      yield train_shard, order

  test = pad_for_eval(data.test_images, data.test_labels, config.eval_batch_size)
  test_shard = upload_shards(test, len(test[1]) // n_devices)
  p_eval = jax.pmap(
    functools.partial(
      steps.resident_eval,
      preprocess=preprocess,
      per_device_batch=config.eval_batch_size // n_devices,
    ),
    axis_name=AXIS,
  )
  p_preview = jax.pmap(
    functools.partial(
      steps.preview_augmented, augment=step_kwargs["augment"], batch_kwargs=batch_kwargs, count=8
    ),
    axis_name=AXIS,
  )

  def preview(step, batch):  # batch: step `step`'s, from batches()
    images = p_preview(replicate(np.int32(step)), batch)  # [devices, 8, H, W, C]
    local = np.concatenate([np.asarray(s.data) for s in images.addressable_shards[:4]])
    return local.reshape(-1, *local.shape[2:])

  return Inputs(
    name=data.name,
    source=data.source,
    fallback_reason=data.fallback_reason,
    fingerprint=fingerprint(
      data.train_images, data.train_labels, data.test_images, data.test_labels
    ),
    num_classes=data.num_classes,
    example_shape=data.train_images.shape[1:],
    steps_per_epoch=steps_per_epoch,
    train_step=functools.partial(
      steps.resident_train_step, batch_kwargs=batch_kwargs, **step_kwargs
    ),
    batches=batches,
    evaluate=lambda rstate: first_replica(p_eval(rstate, test_shard)),
    preview=preview,
    skipped_images=lambda: len(data.skipped_files),
  )
