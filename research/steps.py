"""The device side of training: one step and one eval batch, written for ONE device.

`jax.pmap` wraps them in research/train.py. Every collective names `AXIS`. Inputs are either
device-resident (a whole uint8 dataset shard; the batch is gathered on device) or streamed
(a batch decoded by host workers and prefetched); both feed the same `train_step`.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax import lax

from research.models import EXAMPLES

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
  state,
  images_u8,
  labels,
  rng,
  sizes=None,
  *,
  augment,
  num_classes,
  label_smoothing,
  aux_loss_weight,
  micro_batch=None,
):
  """One optimizer step on this device's part of the global batch.

  Args:
    images_u8: [per_device_batch, H, W, C] uint8.
    labels: [per_device_batch] int32.
    rng: the step's key, the same on every device; each device folds in its index.
    sizes: [per_device_batch, 2] int32 valid (height, width) of padded images; None = whole.
    micro_batch: examples per forward/backward pass (divides per_device_batch; None = all).
      The gradient is the mean over the micro-batches: the whole batch's, to float rounding
      (dropout masks are per example). BatchNorm normalizes each micro-batch on its own.
  """
  augment_rng, dropout_rng = device_rngs(rng)
  images = augment(augment_rng, images_u8, sizes)  # [per_device_batch, h, w, C] float32
  per_device_batch = labels.shape[0]
  micro_batch = micro_batch or per_device_batch
  n_micro = per_device_batch // micro_batch

  positions = jnp.arange(micro_batch)

  def loss_fn(params, batch_stats, part):
    outputs, updates = state.apply_fn(
      {"params": params, "batch_stats": batch_stats, EXAMPLES: {"index": part.start + positions}},
      images[part],
      train=True,
      rngs={"dropout": dropout_rng},
      mutable=["batch_stats"],
    )
    logits, aux_logits = outputs if isinstance(outputs, tuple) else (outputs, None)
    loss = cross_entropy(logits, labels[part], num_classes, label_smoothing)
    if aux_logits is not None:  # Inception's auxiliary head
      aux_loss = cross_entropy(aux_logits, labels[part], num_classes, label_smoothing)
      loss += aux_loss_weight * aux_loss
    correct = jnp.sum(logits.argmax(-1) == labels[part])
    return loss / n_micro, (correct, updates.get("batch_stats", {}))

  loss, correct, grads, batch_stats = 0.0, 0, None, state.batch_stats
  # A Python loop, unrolled when traced: XLA:CPU runs the micro-batches' independent
  # convolutions side by side on its cores (a lax.scan runs them one after another).
  for start in range(0, per_device_batch, micro_batch):
    part = slice(start, start + micro_batch)
    (part_loss, (part_correct, batch_stats)), part_grads = jax.value_and_grad(
      loss_fn, has_aux=True
    )(state.params, batch_stats, part)
    grads = part_grads if grads is None else jax.tree.map(jnp.add, grads, part_grads)
    loss, correct = loss + part_loss, correct + part_correct
  # Every device gets the gradient of the mean loss over the GLOBAL batch. BatchNorm already
  # reduced its statistics over AXIS, so batch_stats agree on every device without a pmean.
  grads = lax.pmean(grads, AXIS)
  metrics = lax.pmean({"loss": loss, "accuracy": correct / per_device_batch}, AXIS)
  new_state = state.apply_gradients(grads=grads, batch_stats=batch_stats)
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["param_norm"] = optax.tree.norm(new_state.params)
  return new_state, metrics


def epoch_order(epoch, *, shuffle_key, shard_size: int):
  """Epoch `epoch`'s order of the local shard: a permutation, the same on every device.

  Computed once per epoch (research/inputs.py), not in every step: permuting CIFAR-10's
  50,000 examples takes ~24 ms on a 2-core CPU, a tenth of a Keras CNN step at batch 128.
  """
  return jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), shard_size)


def resident_batch(step, batch, *, step_key, per_device_batch):
  """Gathers step `step`'s examples from the resident shard (uint8, never leaves the device).

  batch: ((images [shard_size, H, W, C], labels [shard_size]), the epoch's `epoch_order`).
  """
  (images_u8, labels), order = batch
  index_in_epoch = step % (order.shape[0] // per_device_batch)
  idx = lax.dynamic_slice_in_dim(order, index_in_epoch * per_device_batch, per_device_batch)
  return images_u8[idx], labels[idx], jax.random.fold_in(step_key, step)


def resident_train_step(state, batch, *, batch_kwargs, **step_kwargs):
  """`train_step` on this step's examples gathered from the resident shard."""
  return train_step(state, *resident_batch(state.step, batch, **batch_kwargs), **step_kwargs)


def preview_augmented(step, batch, *, augment, batch_kwargs, count: int):
  """The first `count` images of this device's batch at `step`, augmented as training sees them."""
  images_u8, _, rng = resident_batch(step, batch, **batch_kwargs)
  augment_rng, _ = device_rngs(rng)
  return augment(augment_rng, images_u8)[:count]  # whole batch: the same per-example keys


def streamed_train_step(state, batch, *, step_key, **kwargs):
  """`train_step` on a batch that host workers decoded and prefetched to this device.

  batch: image [per_device_batch, S, S, C] uint8, label [per_device_batch] int32 and, for
  images padded to S × S, size [per_device_batch, 2] int32 (valid height, width).
  """
  rng = jax.random.fold_in(step_key, state.step)
  return train_step(state, batch["image"], batch["label"], rng, batch.get("size"), **kwargs)


def eval_sums(state, images_u8, labels, mask, sizes=None, *, preprocess):
  """Sums of loss, correct predictions and real examples (mask = 1) over one batch."""
  images = preprocess(jax.random.key(0), images_u8, sizes)  # deterministic ops only
  logits = state.apply_fn(
    {"params": state.params, "batch_stats": state.batch_stats}, images, train=False
  ).astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {
    "loss_sum": jnp.sum(losses * mask),
    "correct": jnp.sum((logits.argmax(-1) == labels) * mask),
    "count": jnp.sum(mask),
  }


def streamed_eval(state, batch, totals, *, preprocess):
  """Adds one streamed eval batch to the running `totals` (summed over all devices)."""
  images_u8, labels, mask, sizes = (batch.get(k) for k in ("image", "label", "mask", "size"))
  sums = lax.psum(eval_sums(state, images_u8, labels, mask, sizes, preprocess=preprocess), AXIS)
  return jax.tree.map(jnp.add, totals, sums)


def resident_eval(state, shard, *, preprocess, per_device_batch):
  """`eval_sums` over the whole (padded) resident test shard, summed over all devices."""
  images_u8, labels, mask = shard  # [num_batches * per_device_batch, ...]

  def one_batch(totals, start):
    take = lambda x: lax.dynamic_slice_in_dim(x, start, per_device_batch)
    sums = eval_sums(state, take(images_u8), take(labels), take(mask), preprocess=preprocess)
    return jax.tree.map(jnp.add, totals, sums), None

  starts = jnp.arange(0, labels.shape[0], per_device_batch)
  totals, _ = lax.scan(one_batch, zero_totals(), starts)
  return lax.psum(totals, AXIS)


def zero_totals():
  return {"loss_sum": jnp.float32(0), "correct": jnp.float32(0), "count": jnp.float32(0)}


def create_train_state(rng, config, model, image_shape, tx) -> TrainState:
  image = jnp.zeros((1, *image_shape), jnp.float32)
  init = jax.jit(functools.partial(model.init, train=False)).lower(rng, image)
  # It runs once. On CPU, XLA's backend optimizations of its random initializers take longer
  # than they could save (Inception-v3: 20 s of compile, 8 s without; VGG-16: 6 s, 1 s).
  options = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None
  variables = init.compile(compiler_options=options)(rng, image)
  state = TrainState.create(
    apply_fn=model.apply,
    params=variables["params"],
    batch_stats=variables.get("batch_stats", {}),
    tx=tx,
  )
  return jax.device_get(state)
