"""Data-parallel training: a train step written for ONE device, pmapped over all local devices.

The dataset is uploaded once as uint8, sharded over the devices. Each step, on every device:
take this step's indices from a per-epoch permutation of the local shard, gather the batch,
augment it with the device's own random stream, run the model, average the gradients over
all devices (`lax.pmean`) and apply the optax update. The host only dispatches steps and
fetches metrics every `log_every_steps`.
"""

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from flax.training import train_state
from jax import lax

from research import augment as augment_lib
from research import checkpoint, models, optim
from research import workdir as workdir_lib
from research.data import ImageDataset
from research.data.load import load_in_memory
from research.errors import UserError
from research.metrics import MetricsLog
from research.preemption import Preempted, Preemption

AXIS = "devices"  # the one pmap axis: every lax.pmean/psum and every BatchNorm names it


class TrainState(train_state.TrainState):
  batch_stats: Any  # BatchNorm running statistics; identical on every replica


def cross_entropy(logits, labels, num_classes: int, label_smoothing: float):
  """Mean softmax cross-entropy in float32, with optional label smoothing."""
  targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets).mean()


def device_rngs(rng):
  """This device's (augment, dropout) keys: the step's key with the device index folded in."""
  return jax.random.split(jax.random.fold_in(rng, lax.axis_index(AXIS)))


def train_step(
  state, images_u8, labels, rng, *, augment, num_classes, label_smoothing, aux_loss_weight
):
  """One optimizer step on this device's part of the global batch.

  Args:
    images_u8: [per_device_batch, H, W, C] uint8.
    labels: [per_device_batch] int32.
    rng: the step's key, the same on every device; each device folds in its index.
  """
  augment_rng, dropout_rng = device_rngs(rng)
  images = augment(augment_rng, images_u8)  # [per_device_batch, H, W, C] float32

  def loss_fn(params):
    outputs, updates = state.apply_fn(
      {"params": params, "batch_stats": state.batch_stats},
      images,
      train=True,
      rngs={"dropout": dropout_rng},
      mutable=["batch_stats"],
    )
    logits, aux_logits = outputs if isinstance(outputs, tuple) else (outputs, None)
    loss = cross_entropy(logits, labels, num_classes, label_smoothing)
    if aux_logits is not None:  # Inception's auxiliary head
      loss += aux_loss_weight * cross_entropy(aux_logits, labels, num_classes, label_smoothing)
    return loss, (logits, updates.get("batch_stats", {}))

  (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  # Every device gets the gradient of the mean loss over the GLOBAL batch. BatchNorm already
  # reduced its statistics over AXIS, so batch_stats agree on every device without a pmean.
  grads = lax.pmean(grads, AXIS)
  metrics = lax.pmean({"loss": loss, "accuracy": jnp.mean(logits.argmax(-1) == labels)}, AXIS)
  new_state = state.apply_gradients(grads=grads, batch_stats=batch_stats)
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["param_norm"] = optax.tree.norm(new_state.params)
  return new_state, metrics


def batch_indices(step, shuffle_key, shard_size: int, per_device_batch: int):
  """This step's positions in the local shard: a slice of the epoch's permutation."""
  steps_per_epoch = shard_size // per_device_batch
  epoch, index_in_epoch = jnp.divmod(step, steps_per_epoch)
  permutation = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), shard_size)
  return lax.dynamic_slice_in_dim(permutation, index_in_epoch * per_device_batch, per_device_batch)


def resident_batch(step, shard, *, shuffle_key, step_key, per_device_batch):
  """Gathers step `step`'s batch from the device-resident shard (uint8, never leaves)."""
  images_u8, labels = shard  # [shard_size, H, W, C], [shard_size]
  idx = batch_indices(step, shuffle_key, labels.shape[0], per_device_batch)
  return images_u8[idx], labels[idx], jax.random.fold_in(step_key, step)


def resident_train_step(state, shard, *, batch_kwargs, **step_kwargs):
  """`train_step` on this step's batch gathered from the resident shard."""
  return train_step(state, *resident_batch(state.step, shard, **batch_kwargs), **step_kwargs)


def preview_augmented(step, shard, *, augment, batch_kwargs, count: int):
  """The first `count` images of this device's batch at `step`, augmented as training sees them."""
  images_u8, _, rng = resident_batch(step, shard, **batch_kwargs)
  augment_rng, _ = device_rngs(rng)
  return augment(augment_rng, images_u8)[:count]  # whole batch: the same per-example keys


def resident_eval(state, shard, *, preprocess, per_device_batch, num_classes):
  """Sums of loss, correct predictions and examples over the whole (padded) test shard."""
  images_u8, labels, mask = shard  # [num_batches * per_device_batch, ...]

  def one_batch(totals, start):
    take = lambda x: lax.dynamic_slice_in_dim(x, start, per_device_batch)
    images = preprocess(jax.random.key(0), take(images_u8))  # deterministic ops only
    logits = state.apply_fn(
      {"params": state.params, "batch_stats": state.batch_stats}, images, train=False
    ).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, take(labels))
    valid = take(mask)
    batch = {
      "loss_sum": jnp.sum(losses * valid),
      "correct": jnp.sum((logits.argmax(-1) == take(labels)) * valid),
      "count": jnp.sum(valid),
    }
    return jax.tree.map(jnp.add, totals, batch), None

  zeros = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
  starts = jnp.arange(0, labels.shape[0], per_device_batch)
  totals, _ = lax.scan(one_batch, jax.tree.map(jnp.float32, zeros), starts)
  return lax.psum(totals, AXIS)


def _to_devices(local, devices=None):
  """This process's rows of a pmapped array ([local_devices, ...]) as one global jax.Array.

  pmap takes arrays sharded over its devices along the leading axis; building the global
  array explicitly lets the same code (and the AOT-compiled step) serve one or many processes.
  """
  mesh = jax.sharding.Mesh(np.array(devices or jax.devices()), (AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))
  return jax.make_array_from_process_local_data(sharding, np.ascontiguousarray(local))


def upload_shards(arrays, per_device: int):
  """Puts this process's blocks of `arrays` on its devices: [devices, per_device, ...]."""
  n_local = jax.local_device_count()
  start = jax.process_index() * n_local * per_device
  blocks = (a[start : start + n_local * per_device] for a in arrays)
  return tuple(_to_devices(b.reshape(n_local, per_device, *b.shape[1:])) for b in blocks)


def pad_for_eval(images, labels, global_batch: int):
  """Pads the test split to whole global batches; the mask marks the real examples."""
  n = len(labels)
  padded = -(-n // global_batch) * global_batch
  pad = lambda a: np.concatenate([a, np.zeros((padded - n, *a.shape[1:]), a.dtype)])
  return pad(images), pad(labels), (np.arange(padded) < n).astype(np.float32)


def replicate(tree, devices=None):
  """One copy per device (default: all), laid out as pmap expects: [devices, ...]."""
  n_local = len(devices) if devices else jax.local_device_count()
  return jax.tree.map(
    lambda x: _to_devices(np.broadcast_to(x, (n_local, *np.shape(x))), devices), tree
  )


def first_replica(tree):
  """The copy on this process's first device, fetched to host (no cross-device gather)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data)[0], tree)


def create_train_state(rng, config, model, image_shape, tx) -> TrainState:
  variables = jax.jit(functools.partial(model.init, train=False))(
    rng, jnp.zeros((1, *image_shape), jnp.float32)
  )
  state = TrainState.create(
    apply_fn=model.apply,
    params=variables["params"],
    batch_stats=variables.get("batch_stats", {}),
    tx=tx,
  )
  return jax.device_get(state)


def check_batch_sizes(config, n_devices: int) -> int:
  """Returns the per-device batch, or a user error before anything is loaded or compiled."""
  for field in ("batch_size", "eval_batch_size"):
    value = config[field]
    if value <= 0 or value % n_devices:
      below, above = value // n_devices * n_devices, (value // n_devices + 1) * n_devices
      raise UserError(
        f"{field}={value} is not divisible by the {n_devices} devices; "
        f"use a multiple of {n_devices} (e.g. {below or above} or {above})"
      )
  return config.batch_size // n_devices


def _banner(text: str) -> str:
  line = "!" * 100
  return f"\n{line}\n{text}\n{line}\n"


def _write_metadata(workdir: Path, config, data: ImageDataset) -> None:
  meta = {
    "time": time.time(),
    "jax_version": jax.__version__,
    "flax_version": flax.__version__,
    "backend": jax.default_backend(),
    "devices": [str(d) for d in jax.devices()],
    "device_kind": jax.devices()[0].device_kind,
    "process_count": jax.process_count(),
    "dataset_requested": config.dataset,
    "dataset_used": data.name,
    "dataset_source": data.source,
    "fallback_reason": data.fallback_reason,
  }
  with open(workdir / "metadata.jsonl", "a") as f:  # one record per launch (resumes append)
    f.write(json.dumps(meta) + "\n")


def _interval_record(step, fetched, elapsed, input_wait, config, schedule) -> dict:
  """One train record from the metrics of the steps since the last one."""
  return {
    "step": step,
    "loss": float(np.mean([m["loss"] for m in fetched])),
    "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
    "param_norm": float(fetched[-1]["param_norm"]),
    "grad_norm": float(fetched[-1]["grad_norm"]),
    "learning_rate": float(schedule(step - 1)),
    "examples_per_sec": len(fetched) * config.batch_size / elapsed,
    "sec_per_batch": elapsed / len(fetched),
    "input_wait_fraction": input_wait / elapsed,
  }


def _finite_or_stop(state, step: int, checkpoints):
  """`state` if all its parameters are finite; otherwise stop before it is saved."""
  if not all(np.isfinite(x).all() for x in jax.tree.leaves(state.params)):
    raise UserError(
      f"parameters became NaN/inf by step {step}; the last good checkpoint is kept in "
      f"{checkpoints.directory}; lower learning_rate or set grad_clip_norm"
    )
  return state


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config` on all devices, writing logs and checkpoints to `workdir`.

  Returns the final eval record. Raises Preempted after saving a checkpoint on SIGTERM.
  """
  workdir = Path(workdir)
  is_main = jax.process_index() == 0
  n_devices = jax.device_count()
  augment = augment_lib.build(config.augment)  # parse errors surface before data loading
  preprocess = augment_lib.build(config.eval_preprocess)
  model = models.create(config.model, AXIS)
  per_device_batch = check_batch_sizes(config, n_devices)
  optim.create_optimizer(config, optim.learning_rate_schedule(config, 1, 1))  # names checked

  data = load_in_memory(config)
  if data.fallback_reason and is_main:
    print(_banner(f"NO CIFAR-10: TRAINING ON SYNTHETIC DATA.\n{data.fallback_reason}"), flush=True)
  shard_size = len(data.train_labels) // n_devices  # the remainder (< n_devices) is not used
  if shard_size < per_device_batch:
    raise UserError(
      f"batch_size={config.batch_size} needs {per_device_batch} examples per device but each "
      f"of the {n_devices} devices holds {shard_size}; lower batch_size"
    )
  steps_per_epoch = shard_size // per_device_batch
  num_steps = config.num_train_steps
  if num_steps <= 0:
    num_steps = config.num_epochs * steps_per_epoch

  schedule = optim.learning_rate_schedule(config, steps_per_epoch, num_steps)
  tx = optim.create_optimizer(config, schedule)
  init_key, shuffle_key, step_key = jax.random.split(jax.random.key(config.seed), 3)
  state = create_train_state(init_key, config, model, data.train_images.shape[1:], tx)

  workdir_lib.prepare(workdir, config)  # input validated: from here on we write
  bar = tqdm.tqdm(
    total=num_steps, unit="step", disable=not (is_main and sys.stdout.isatty()), leave=False
  )
  echo = bar.write if not bar.disable else functools.partial(print, flush=True)
  checkpoints = checkpoint.Checkpoints(workdir, config, echo=echo)
  state = checkpoints.restore_latest(state)
  start_step = int(state.step)
  bar.update(start_step)
  log = MetricsLog(workdir, dataset_used=data.name, enabled=is_main, echo=echo)
  if is_main:
    _write_metadata(workdir, config, data)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    echo(
      f"{config.model.name}: {n_params:,} parameters | {n_devices} devices "
      f"({jax.devices()[0].device_kind}) | global batch {config.batch_size} = "
      f"{per_device_batch} per device | {steps_per_epoch} steps/epoch, {num_steps} steps | "
      f"data: {data.name} ({data.source})"
    )
    if start_step:
      echo(f"resumed from the checkpoint at step {start_step}")

  step_kwargs = dict(
    augment=augment,
    num_classes=data.num_classes,
    label_smoothing=config.label_smoothing,
    aux_loss_weight=config.aux_loss_weight,
  )
  batch_kwargs = dict(shuffle_key=shuffle_key, step_key=step_key, per_device_batch=per_device_batch)
  p_train_step = jax.pmap(
    functools.partial(resident_train_step, batch_kwargs=batch_kwargs, **step_kwargs),
    axis_name=AXIS,
    donate_argnums=(0,),
  )
  p_eval = jax.pmap(
    functools.partial(
      resident_eval,
      preprocess=preprocess,
      per_device_batch=config.eval_batch_size // n_devices,
      num_classes=data.num_classes,
    ),
    axis_name=AXIS,
  )
  train_shard = upload_shards((data.train_images, data.train_labels), shard_size)
  test = pad_for_eval(data.test_images, data.test_labels, config.eval_batch_size)
  test_shard = upload_shards(test, len(test[1]) // n_devices)
  rstate = replicate(state)

  # What the augmentation does, as the devices see it: 8 images from each of 4 devices.
  # Every process takes part in the pmapped call; process 0 writes the grid.
  p_preview = jax.pmap(
    functools.partial(preview_augmented, augment=augment, batch_kwargs=batch_kwargs, count=8),
    axis_name=AXIS,
  )
  preview = p_preview(replicate(np.int32(start_step)), train_shard)  # [devices, 8, H, W, C]
  local = np.concatenate([np.asarray(s.data) for s in preview.addressable_shards[:4]])
  log.images("augmented_batch", local.reshape(-1, *local.shape[2:]), start_step)

  def evaluate(step):
    totals = first_replica(p_eval(rstate, test_shard))
    record = {
      "step": step,
      "eval_loss": float(totals["loss_sum"] / totals["count"]),
      "eval_accuracy": float(totals["correct"] / totals["count"]),
      "eval_examples": int(totals["count"]),
    }
    log.eval(record)
    return record

  compile_start = time.perf_counter()
  p_train_step = p_train_step.lower(rstate, train_shard).compile()
  if is_main:
    echo(f"compiled the train step in {time.perf_counter() - compile_start:.1f} s")

  profile = tuple(config.profile_steps)
  pending, input_wait = [], 0.0
  interval_start = time.perf_counter()
  try:
    with Preemption() as preemption:
      for step in range(start_step + 1, num_steps + 1):
        if profile and step == profile[0]:
          jax.profiler.start_trace(str(workdir / "profile"))
        wait_start = time.perf_counter()
        inputs = train_shard  # resident: nothing to wait for; streaming inputs block here
        input_wait += time.perf_counter() - wait_start
        rstate, metrics = p_train_step(rstate, inputs)
        pending.append(metrics)
        bar.update(1)
        # The first step is logged too (as the TF scripts did): feedback before a slow interval.
        if step % config.log_every_steps == 0 or step in (start_step + 1, num_steps):
          fetched = [first_replica(m) for m in pending]  # blocks until these steps are done
          elapsed = time.perf_counter() - interval_start
          record = _interval_record(step, fetched, elapsed, input_wait, config, schedule)
          if not (np.isfinite(record["loss"]) and np.isfinite(record["grad_norm"])):
            raise UserError(
              f"loss or gradients became NaN/inf by step {step} (loss {record['loss']}); "
              f"the last good checkpoint is kept in {checkpoints.directory}; "
              "lower learning_rate or set grad_clip_norm"
            )
          log.train(record)
          pending, input_wait = [], 0.0
          interval_start = time.perf_counter()
        if profile and step == profile[1]:
          jax.block_until_ready(rstate)
          jax.profiler.stop_trace()
          echo(f"wrote a profile of steps {profile[0]}-{profile[1]} to {workdir / 'profile'}")
        if preemption.requested:
          jax.block_until_ready(rstate)
          checkpoints.save(step, first_replica(rstate))
          raise Preempted(step)
        if config.eval_every_steps and step % config.eval_every_steps == 0 and step < num_steps:
          evaluate(step)
          interval_start = time.perf_counter()  # eval time is not training time
        if checkpoints.due(step) and step < num_steps:
          blocked = checkpoints.save(
            step, _finite_or_stop(first_replica(rstate), step, checkpoints)
          )
          echo(f"checkpoint at step {step} started (training blocked {blocked:.2f} s)")
          interval_start = time.perf_counter()
    final = evaluate(num_steps)
    checkpoints.save(num_steps, _finite_or_stop(first_replica(rstate), num_steps, checkpoints))
  finally:
    bar.close()
    checkpoints.close()  # a write in flight is finished, never left half-done
    log.close()
  if data.fallback_reason and is_main:
    print(_banner(f"THIS RUN TRAINED ON SYNTHETIC DATA, NOT CIFAR-10.\n{data.fallback_reason}"))
  return final
