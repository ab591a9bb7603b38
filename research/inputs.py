"""Data as the training loop sees it: device-ready batches, how one device takes a step's
examples from them, and eval over the whole test split.

Two kinds, one interface (`Inputs`):
  - resident (CIFAR-sized): the split lives on the devices as uint8, whole on every device
    (up to replicate_max_gb; larger, each device holds a random part of it); each step gathers
    its examples on device by the epoch's order, so the host hands over the same arrays every
    step, with this device's part of that order (computed once per epoch, while the epoch
    before trains). Device d of N takes positions [d·b, (d+1)·b) of each global batch.
  - streamed (ImageNet-sized): host workers decode fixed-size uint8 batches
    (research/data/streaming.py) that are prefetched to the devices while the step before runs.
The sources in research/data/ yield host arrays; this module is the device side of both, and
arrays go to and from the devices through research/placement.py.
"""

import collections
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from research import data as data_lib
from research import environment, steps
from research.data import (
  STREAMED,
  ImageDataset,
  check_num_classes,
  class_names,
  fingerprint,
  folder,
)
from research.errors import UserError
from research.fields import KINDS
from research.placement import (
  AXIS,
  first_replica,
  replicate,
  to_devices,
  upload_shards,
  upload_whole,
)

# What this module reads of the config (the run's set-up hands it a view of these and of the
# dataset's fields, `reads()`, research/fields.py).
READS = (
  "dataset", "data_dir", "skip_bad_images", "data_placement", "resident_max_gb",
  "replicate_max_gb", "host_image_size", "batch_size", "eval_batch_size", "seed", "augment",
  "eval_preprocess", "data_workers", "prefetch", "model.num_classes",
)  # fmt: skip


def reads() -> tuple:
  """READS, a dataset's fields (fields.KINDS) and those every registered dataset declares: the
  data's loader is handed its view of them (research/data/__init__.py `load`)."""
  declared = [f for d in data_lib.DATASETS.declared.values() for f in d]
  return tuple(dict.fromkeys((*READS, *KINDS["dataset"], *declared)))


@dataclasses.dataclass
class Inputs:
  name: str  # the dataset actually used
  source: str
  fallback_reason: str  # non-empty when synthetic data replaced the requested dataset
  fingerprint: str  # digest of the data's content (or file list), checked when a run resumes
  example_shape: tuple  # [H, W, C] uint8 as stored; the model sees augment(example)
  steps_per_epoch: int
  batches: Callable[[int], Iterator]  # first step -> device-ready batches, one per step
  # For ONE device, inside the pmapped step: (step, its batch) -> steps.Examples
  gather: Callable
  # (replicated state, all_views) -> eval totals on the host; all_views=False: the first view
  evaluate: Callable[[object, bool], dict]
  # (replicated state, the all_views values to come) -> None: compiles those evals ahead, so
  # that an eval's time is its own (resident data; None: the first call compiles)
  compile_evals: Callable[[object, tuple], None] | None = None
  # (n, seed) -> n training images, uint8: a random sample fixed by the seed, the same every call
  first_images: Callable[[int, int], np.ndarray] | None = None
  # several points (seeds, a sweep): the vmap in_axes of a batch over the points (0: one part
  # per point, None: shared by all), as sweep.each_point takes it; None for one run
  point_axes: object = None
  skipped_files: Callable[[], list[str]] = lambda: []  # undecodable files skipped so far
  passed_over: tuple = ()  # image folders: hidden files and non-images, relative paths
  summary: str = ""  # image folders: what was found and left out, in one line
  classes: tuple = ()  # the class names, in label order
  layout: str = ""  # how the training data reaches the devices, and what that means for its order
  order_per_device: bool = False  # True: the training batches depend on the device count


def make(
  fields, runs, *, per_device_batch, augment, preprocess, shuffle_key, step_key, metrics=()
) -> Inputs:
  """The config's data, resident on the devices or streamed from host workers; its evals sum
  `metrics` (research/metrics.py `shapes`) besides loss and accuracy."""
  scanned = None
  if fields.dataset == "folder":
    scanned = folder.scan(fields.data_dir, fields.skip_bad_images)
    check_num_classes(str(scanned.root), len(scanned.classes), fields.model.num_classes)
  placement = fields.data_placement  # folder only; tfds datasets always stream
  if scanned is not None and placement == "auto":
    fits = folder.fits_on_devices(scanned, fields.resident_max_gb, fields.host_image_size)
    placement = "resident" if fits else "streamed"
  if fields.dataset in STREAMED or (scanned is not None and placement == "streamed"):
    if len(runs.points) > 1:
      raise UserError(
        f"{_said(runs)} train on one resident copy of the data, and {fields.dataset} "
        "streams; train one run per launch (--config.seed=N, --config.FIELD=VALUE)"
      )
    for field, pipeline in (("augment", augment), ("eval_preprocess", preprocess)):
      if not pipeline.windowed:  # streamed images are padded squares
        raise UserError(
          f"{field}={fields[field]!r} must start with a window op (inception_crop or "
          "central_crop) for streamed data: the host pads images to squares and the op reads "
          "only each image's valid part"
        )
    inputs = streamed(fields, per_device_batch, preprocess, step_key, scanned, metrics)
  elif scanned is None:
    data = data_lib.load(fields)
    inputs = resident(
      fields, runs, data, per_device_batch, preprocess, shuffle_key, step_key, metrics
    )
  else:
    size = fields.host_image_size
    data = folder.load_resident(scanned, fields.skip_bad_images, size)
    inputs = resident(
      fields, runs, data, per_device_batch, preprocess, shuffle_key, step_key, metrics
    )
    summary = folder.summary(scanned, len(data.skipped_files), data.resized, size)
    inputs = dataclasses.replace(inputs, passed_over=tuple(scanned.passed_over), summary=summary)
  given = scanned.classes if scanned is not None else inputs.classes  # a dataset's own names
  classes = class_names(inputs.name, fields.model.num_classes, given)
  return dataclasses.replace(inputs, classes=classes)


def for_run(fields, checked, runs) -> Inputs:
  """`make` for a run (`fields`: this module's view of its config, `reads()`; `checked` by
  validate.train_config; `runs`: sweep.runs_of), keyed by its seed."""
  _, shuffle_key, step_key = steps.run_keys(fields.seed)
  return make(
    fields,
    runs,
    per_device_batch=checked.per_device_batch,
    augment=checked.augment,
    preprocess=checked.eval_preprocess,
    shuffle_key=shuffle_key,
    step_key=step_key,
    metrics=checked.metrics,
  )


def eval_pipelines(preprocess) -> dict:
  """{all_views: the eval's pipeline}: every view for the final eval (True), the first view
  for periodic evals (False); the same pipeline twice without views."""
  return {True: preprocess, False: preprocess.first_view}


def _once_each(mapping: dict, make) -> dict:
  """{key: make(value)}, `make` called once for each distinct value (by identity): keys that
  share a value share what is made of it."""
  made = {}
  for value in mapping.values():
    if id(value) not in made:
      made[id(value)] = make(value)
  return {key: made[id(value)] for key, value in mapping.items()}


def eval_programs(preprocess, program) -> dict:
  """{all_views: program(the eval's pipeline)}: without views both evals run one pipeline, and
  one program (traced and compiled once)."""
  return _once_each(eval_pipelines(preprocess), program)


def check_shard(batch_size: int, n_examples: int, n_devices: int, per_device_batch: int) -> int:
  """Examples per device; a user error if a device would not fill one batch."""
  shard_size = n_examples // n_devices  # the remainder (< n_devices) is not used
  if shard_size < per_device_batch:
    raise UserError(
      f"batch_size={batch_size} needs {per_device_batch} examples per device but each "
      f"of the {n_devices} devices holds {shard_size}; lower batch_size"
    )
  return shard_size


def global_batches(batch_size: int, n_examples: int) -> int:
  """Global batches per epoch; a user error if the split does not fill one."""
  if n_examples < batch_size:
    raise UserError(
      f"batch_size={batch_size} is more than the {n_examples} training examples; lower batch_size"
    )
  return n_examples // batch_size


# --- resident: the whole split on the devices -------------------------------------------------


def _said(runs) -> str:
  """`4 seeds`, or `6 points of a sweep`: `runs` (sweep.runs_of) in one program, in words."""
  n = len(runs.points)
  return f"{n} points of a sweep" if runs.swept else f"{n} seeds"


def shard_rows(seed: int, n_examples: int) -> np.ndarray:
  """The training split in a random order fixed by the seed: how sharded data is split over
  the devices (an image folder lists its classes one after another, and consecutive slices
  would give each device one or two classes), and the sample `first_images` takes."""
  return np.random.default_rng(seed).permutation(n_examples)


def global_order(epoch, *, shuffle_key, n_examples: int, batch_size: int):
  """Epoch `epoch`'s global batches: [steps_per_epoch, batch_size] example indices, a function
  of the seed and the epoch alone (the last n_examples % batch_size of its order wait for
  another epoch)."""
  steps_per_epoch = n_examples // batch_size
  order = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), n_examples)
  return order[: steps_per_epoch * batch_size].reshape(steps_per_epoch, batch_size)


def device_orders(order, *, devices, n_devices: int):
  """Each of `devices`' (indices among all devices) part of every step's global batch: device
  d of n_devices takes positions [d·b, (d+1)·b), b = batch_size / n_devices.
  order [steps, batch_size] -> [len(devices), steps * b]."""
  steps_per_epoch, batch_size = order.shape
  parts = order.reshape(steps_per_epoch, n_devices, batch_size // n_devices)[:, devices]
  return jnp.moveaxis(parts, 1, 0).reshape(len(devices), -1)


def shard_orders(epoch, *, shuffle_key, shard_size: int, per_device_batch: int, devices):
  """Sharded data's order: each of `devices` orders its own shard per epoch, so the examples
  that meet in a step depend on the device count. [len(devices), steps * per_device_batch]"""
  key = jax.random.fold_in(shuffle_key, epoch)
  used = shard_size // per_device_batch * per_device_batch
  permutation = lambda d: jax.random.permutation(jax.random.fold_in(key, d), shard_size)[:used]
  return jax.vmap(permutation)(devices)


def resident_gather(step, batch, *, step_key, per_device_batch: int, sharded: bool):
  """Step `step`'s examples, gathered on this device from the resident data (never leaving it).

  batch: ((images_u8 [rows, H, W, C], labels [rows]), this device's order of the epoch
  [steps_per_epoch * per_device_batch] of row indices). The rows are the whole split, or with
  `sharded` this device's shard of `shard_rows`. Each example's id is its index in the split
  (sharded: in `shard_rows`' order): the same example has the same id in every epoch.
  """
  (images_u8, labels), order = batch
  steps_per_epoch = order.shape[0] // per_device_batch
  start = step % steps_per_epoch * per_device_batch
  idx = lax.dynamic_slice_in_dim(order, start, per_device_batch)
  return steps.Examples(
    images_u8[idx],
    labels[idx],
    jax.random.fold_in(step_key, step),
    epoch=step // steps_per_epoch,
    ids=lax.axis_index(AXIS) * labels.shape[0] + idx if sharded else idx,
  )


def resident_eval(state, shard, *, preprocess, per_device_batch: int, metrics=()):
  """`steps.eval_sums` over the whole (padded) resident test shard, summed over all devices."""
  images_u8, labels, mask = shard  # [num_batches * per_device_batch, ...]

  def one_batch(totals, start):
    take = lambda x: lax.dynamic_slice_in_dim(x, start, per_device_batch)
    sums = steps.eval_sums(
      state, take(images_u8), take(labels), take(mask), preprocess=preprocess, metrics=metrics
    )
    return jax.tree.map(jnp.add, totals, sums), None

  starts = jnp.arange(0, labels.shape[0], per_device_batch)
  totals, _ = lax.scan(one_batch, steps.zero_totals(preprocess, metrics), starts)
  return lax.psum(totals, AXIS)


def resident(
  fields,
  runs,
  data: ImageDataset,
  per_device_batch: int,
  preprocess,
  shuffle_key,
  step_key,
  metrics=(),
) -> Inputs:
  """Uploads `data` once: the training split whole on every device where it is at most
  replicate_max_gb (every step's global batch then depends on the seed alone), else sharded
  over the devices; every step gathers its batch on device."""
  n_examples = len(data.train_labels)
  train = _resident_train(fields, runs, data, per_device_batch, shuffle_key)
  steps_per_epoch, order_of = train.steps_per_epoch, train.order_of

  def batches(start_step):
    """(the training data, its epoch's order) for steps start_step, start_step + 1, ...: the
    same arrays within an epoch. The next epoch's order is computed while this one trains, so
    fetching it at the epoch's start does not wait (nor count as input wait)."""
    next_order = order_of(start_step // steps_per_epoch)
    for step in itertools.count(start_step):
      if step == start_step or step % steps_per_epoch == 0:
        order = to_devices(np.asarray(next_order))  # [local devices, steps * per device] int32
        next_order = order_of(step // steps_per_epoch + 1)  # dispatched, not awaited
      yield train.rows, order

  evaluate, compile_evals = _resident_evals(fields, runs, data, preprocess, metrics)
  return Inputs(
    name=data.name,
    source=data.source,
    fallback_reason=data.fallback_reason,
    fingerprint=fingerprint(
      data.train_images, data.train_labels, data.test_images, data.test_labels
    ),
    example_shape=data.train_images.shape[1:],
    steps_per_epoch=steps_per_epoch,
    batches=batches,
    gather=functools.partial(
      resident_gather, step_key=step_key, per_device_batch=per_device_batch, sharded=train.sharded
    ),
    evaluate=evaluate,
    compile_evals=compile_evals,
    first_images=lambda n, seed: data.train_images[shard_rows(seed, n_examples)[:n]],
    skipped_files=lambda: list(data.skipped_files),
    layout=train.layout,
    order_per_device=train.sharded,
    classes=tuple(data.classes),
    # (the data, each point's order)
    point_axes=(None, 0) if len(runs.points) > 1 else None,
  )


class _Train(NamedTuple):
  """The training split on the devices, and each epoch's order of it."""

  rows: tuple  # (images_u8, labels) on the devices: whole on each, or this device's shard
  steps_per_epoch: int
  order_of: Callable  # epoch -> [local devices, (seeds,) steps * per device] row indices
  sharded: bool
  layout: str  # in words, for the run's description


def _resident_train(fields, runs, data: ImageDataset, per_device_batch: int, shuffle_key) -> _Train:
  """Uploads the training split, whole on every device or sharded (replicate_max_gb), with the
  order each epoch takes it in (each seed its own)."""
  n_devices, n_local = jax.device_count(), jax.local_device_count()
  n_examples = len(data.train_labels)
  train = (data.train_images, data.train_labels)
  local_devices = jax.process_index() * n_local + np.arange(n_local)
  sharded = sum(a.nbytes for a in train) > fields.replicate_max_gb * 2**30
  seeds = runs.seeds
  if sharded and len(seeds) > 1:
    raise UserError(
      f"{_said(runs)} need the training split whole on every device, and it is larger than "
      f"replicate_max_gb={fields.replicate_max_gb}; raise replicate_max_gb if the devices hold "
      "it, or train one run per launch (--config.seed=N, --config.FIELD=VALUE)"
    )
  if sharded:
    shard_size = check_shard(fields.batch_size, n_examples, n_devices, per_device_batch)
    rows = upload_shards(train, shard_size, shard_rows(fields.seed, n_examples))
    steps_per_epoch = shard_size // per_device_batch
    order_of = functools.partial(
      shard_orders,
      shuffle_key=shuffle_key,
      shard_size=shard_size,
      per_device_batch=per_device_batch,
      devices=local_devices,
    )
    layout = (
      f"training split sharded, a part per device (larger than replicate_max_gb="
      f"{fields.replicate_max_gb}): its batches depend on the device count"
    )
  else:
    steps_per_epoch = global_batches(fields.batch_size, n_examples)
    rows = upload_whole(train)
    in_order = functools.partial(
      global_order, shuffle_key=shuffle_key, n_examples=n_examples, batch_size=fields.batch_size
    )
    order_of = lambda epoch, key=shuffle_key: device_orders(
      in_order(epoch, shuffle_key=key), devices=local_devices, n_devices=n_devices
    )
    layout = "training split whole on every device: the same batches on any device count"
  if len(seeds) > 1:  # each point its seed's order: [local devices, points, steps * per device]
    keys = jnp.stack([steps.run_keys(seed)[1] for seed in seeds])
    one_order = order_of
    order_of = lambda epoch: jnp.moveaxis(jax.vmap(lambda k: one_order(epoch, k))(keys), 0, 1)
    layout += f"; {_said(runs)}, each in its seed's order"
  return _Train(rows, steps_per_epoch, jax.jit(order_of), sharded, layout)


def _resident_evals(
  fields, runs, data: ImageDataset, preprocess, metrics
) -> tuple[Callable, Callable]:
  """(evaluate, compile_evals) of Inputs over the test split, uploaded once, padded to whole
  eval batches and sharded over the devices."""
  n_devices = jax.device_count()
  test = pad_for_eval(data.test_images, data.test_labels, fields.eval_batch_size)
  test_shard = upload_shards(test, len(test[1]) // n_devices)
  eval_batch = fields.eval_batch_size // n_devices

  def eval_fn(pipeline):  # a state with a seed axis: each seed's totals
    fn = functools.partial(
      resident_eval,
      preprocess=pipeline,
      per_device_batch=eval_batch,
      metrics=metrics,
    )
    return jax.vmap(fn, in_axes=(0, None)) if len(runs.points) > 1 else fn

  p_evals = eval_programs(preprocess, lambda pipeline: jax.pmap(eval_fn(pipeline), axis_name=AXIS))

  def compile_evals(rstate, views):  # a program the two evals share compiles once
    wanted = {all_views: p_evals[all_views] for all_views in views}
    p_evals.update(_once_each(wanted, lambda p_eval: p_eval.lower(rstate, test_shard).compile()))

  def evaluate(rstate, all_views=True):
    return first_replica(p_evals[all_views](rstate, test_shard))

  return evaluate, compile_evals


# --- streamed: host workers decode, batches are prefetched to the devices ---------------------

DEVICE_KEYS = ("image", "size", "label", "mask")  # what a streamed batch sends to the devices


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


def streamed_gather(step, batch, *, step_key, steps_per_epoch: int):
  """A streamed batch as it arrived on this device, with step `step`'s key.

  batch: image [per_device_batch, S, S, C] uint8, label [per_device_batch] int32 and, for
  images padded to S × S, size [per_device_batch, 2] int32 (valid height, width). Each
  example's id is its place in the stream (a new one every step).
  """
  n = batch["label"].shape[0]
  place = (step * lax.axis_size(AXIS) + lax.axis_index(AXIS)) * n + jnp.arange(n)
  return steps.Examples(
    batch["image"],
    batch["label"],
    jax.random.fold_in(step_key, step),
    batch.get("size"),
    epoch=step // steps_per_epoch,
    ids=place,
  )


def streamed_eval(state, batch, totals, *, preprocess, metrics=()):
  """Adds one streamed eval batch to the running `totals` (summed over all devices)."""
  images_u8, labels, mask, sizes = (batch.get(k) for k in ("image", "label", "mask", "size"))
  sums = steps.eval_sums(
    state, images_u8, labels, mask, sizes, preprocess=preprocess, metrics=metrics
  )
  return jax.tree.map(jnp.add, totals, lax.psum(sums, AXIS))


def streamed(
  fields, per_device_batch: int, preprocess, step_key, scanned=None, metrics=()
) -> Inputs:
  """A streamed dataset (`scanned`: the image folder, if already listed)."""
  environment.check(environment.STREAMED)
  from research.data import streaming  # grain (and tfds): only streamed datasets need them

  share = (jax.process_index(), jax.process_count())  # each process reads its own part
  n_local = jax.local_device_count()
  train_source, eval_source, description, content = streaming.sources(fields, scanned)
  per_process = per_device_batch * n_local
  steps_per_epoch = global_batches(fields.batch_size, len(train_source))
  train_ds = streaming.shuffled(train_source, fields.seed)
  skipped = {}  # undecodable files passed over so far (skip_bad_images), each said once
  # tfds sources skip nothing
  on_train, on_eval = (
    (_note_skipped(scanned, scanned.train, skipped), _note_skipped(scanned, scanned.eval, skipped))
    if scanned
    else (None, None)
  )

  def batches(start_step):
    stream = streaming.batch_stream(train_ds, per_process, start_step, fields.data_workers, share)
    return prefetch_to_devices(stream, fields.prefetch, on_train)

  eval_per_process = fields.eval_batch_size // share[1]
  pipelines = eval_pipelines(preprocess)

  def eval_program(pipeline):
    fn = functools.partial(streamed_eval, preprocess=pipeline, metrics=metrics)
    return jax.pmap(fn, axis_name=AXIS)

  p_evals = eval_programs(preprocess, eval_program)

  def evaluate(rstate, all_views=True):
    zeros = steps.zero_totals(pipelines[all_views], metrics)
    totals = replicate(jax.device_get(zeros))  # on device
    stream = streaming.eval_batches(eval_source, eval_per_process, fields.data_workers, share)
    for batch in prefetch_to_devices(stream, fields.prefetch, on_eval):
      totals = p_evals[all_views](rstate, batch, totals)
    return first_replica(totals)

  size = fields.host_image_size
  return Inputs(
    name=fields.dataset,
    source=description,
    fallback_reason="",
    fingerprint=content,
    example_shape=(size, size, 3),
    steps_per_epoch=steps_per_epoch,
    batches=batches,
    gather=functools.partial(streamed_gather, step_key=step_key, steps_per_epoch=steps_per_epoch),
    evaluate=evaluate,
    skipped_files=lambda: list(skipped),
    passed_over=tuple(scanned.passed_over) if scanned else (),
    summary=folder.summary(scanned, None) if scanned else "",
    layout="streamed, every process reading its part of one global order",
  )


def _note_skipped(scanned, split, skipped: dict) -> Callable:
  """What says a batch's files passed over, once each, and adds them to `skipped`: an item of
  record `index` that passed over `n` files stands for the file `n` records after its own
  (folder.FileImages)."""

  def note(batch):
    for index, n in zip(batch["index"], batch["skipped"], strict=True):
      for k in range(1, int(n) + 1):
        path = str(scanned.root / split.paths[(index - k) % len(split.paths)].decode())
        if path not in skipped:
          skipped[path] = None
          print(f"warning: skipped {path}, which cannot be decoded (skip_bad_images)", flush=True)

  return note


def pad_for_eval(images, labels, global_batch: int):
  """Pads the test split to whole global batches; the mask marks the real examples."""
  n = len(labels)
  padded = -(-n // global_batch) * global_batch
  pad = lambda a: np.concatenate([a, np.zeros((padded - n, *a.shape[1:]), a.dtype)])
  return pad(images), pad(labels), (np.arange(padded) < n).astype(np.float32)
