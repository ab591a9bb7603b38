"""The device side of training: one step and one eval batch, written for ONE device.

`jax.pmap` wraps them in research/train.py. Every collective names `AXIS`. The step takes its
examples from its batch with the data's `gather` (research/inputs.py): a device-resident
shard it gathers from, or a batch host workers decoded and prefetched. The model is called
through its state's `apply_fn` (research/models), the optimizer through its `tx`
(research/optim.py): the step owns neither.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax import lax

from research import models
from research import sweep as sweep_lib
from research.augment import Pipeline
from research.errors import UserError
from research.placement import AXIS  # the one pmap axis, 'batch'
from research.registry import Registry


class TrainState(train_state.TrainState):
  batch_stats: Any  # BatchNorm running statistics; identical on every replica
  # config.ema_decay > 0: the exponential moving average of `params`, updated once a step,
  # which evals, predictions and fine-tunes use; None where it is off
  ema_params: Any = None

  def eval_weights(self):
    """This state with the weights the evals use: the EMA of the parameters where it is on."""
    return self if self.ema_params is None else self.replace(params=self.ema_params)


class Examples(NamedTuple):
  """A step's examples on one device, as the data's `gather` hands them over."""

  images_u8: Any  # [per_device_batch, H, W, C] uint8
  labels: Any  # [per_device_batch] int32
  rng: Any  # the step's key, the same on every device (each device folds in its index)
  sizes: Any = None  # valid (height, width) [per_device_batch, 2] of padded images, or None
  epoch: Any = 0  # int32: the epoch this step belongs to
  ids: Any = None  # int32 [per_device_batch]: each example's identity (augment's Context)


@jax.jit  # one program for every seed, not an eager op for each step of making and taking them
def run_keys(seed):
  """(init, shuffle, step) keys of a run with `seed` (an int, traced or not): what its
  parameters, data order and steps draw from."""
  return tuple(jax.random.split(jax.random.key(seed), 3))


def step_of(state) -> int:
  """The step a train state is at (the same for every seed of a seeded state)."""
  return int(np.asarray(state.step).reshape(-1)[0])


def global_positions(per_device_batch: int):
  """This device's examples' positions in the step's global batch: device d of N holds
  positions [d·b, (d+1)·b). Every random draw for an example is keyed by its position (and the
  step's key, the same on every device), so a step draws the same on any device count."""
  return lax.axis_index(AXIS) * per_device_batch + jnp.arange(per_device_batch)


CPU_MICRO_BATCH = 16  # examples per micro-batch on CPU when the config says 0 (auto)


def micro_batch_size(configured: int, per_device_batch: int, batch_norm: bool, backend: str):
  """Examples per forward/backward pass on each device: `configured`, or for 0 (auto) 16 on
  CPU for models without BatchNorm, else the whole per-device batch.

  The step averages its micro-batches' gradients: the whole batch's gradient, to float
  rounding (dropout masks are per example, `dropout_per_example`). XLA:CPU runs small
  convolutions fastest per example, and the unrolled micro-batches run side by side on its
  cores (docs/cpu_step.md). BatchNorm would normalize each micro-batch with its own
  statistics, which changes training, so auto never splits a model that has it.
  """
  if configured:
    return configured
  auto = backend == "cpu" and not batch_norm and per_device_batch % CPU_MICRO_BATCH == 0
  return CPU_MICRO_BATCH if auto else per_device_batch


# The rng collection nn.Dropout's per-example masks draw from: the step's key itself, the same
# on every device and micro-batch (each example folds in its own position).
PER_EXAMPLE = "per_example"


def dropout_per_example(index):
  """A context in which every `nn.Dropout` draws each example's mask from the step's key and
  the example's `index` [batch] (its position in the step's global batch), so a step drops the
  same units on any device count, and split into micro-batches as the whole batch would. A
  dropout that shares one mask over the batch (`broadcast_dims` with 0) runs as flax has it,
  from its slice's key (`Run.forward`)."""

  def interceptor(next_fun, args, kwargs, context):
    if not (isinstance(context.module, nn.Dropout) and context.method_name == "__call__"):
      return next_fun(*args, **kwargs)
    return _dropout(context.module, index, next_fun, *args, **kwargs)

  return nn.intercept_methods(interceptor)


def batch_norm_over(axis: str | None):
  """A context in which every linen `nn.BatchNorm` computes its batch statistics over `axis`:
  the step's AXIS for one that names no axis (as code written for one device has it), so that
  its statistics are those of the global batch on any device count; or, with None
  (config.batch_norm_statistics="per_device"), over each device's own examples, whatever it
  names. A BatchNorm that names another axis runs as written (`axis_checked` reports it).
  `models.FromNnx` points every NNX BatchNorm at the step's axis, whatever it names."""

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if not (isinstance(module, nn.BatchNorm) and context.method_name == "__call__"):
      return next_fun(*args, **kwargs)  # (an attribute read here would be intercepted too)
    named = module.axis_name
    if named == axis or (axis is not None and named is not None):
      return next_fun(*args, **kwargs)
    object.__setattr__(module, "axis_name", axis)  # this call only: the bound copy of one apply
    try:
      return next_fun(*args, **kwargs)
    finally:
      object.__setattr__(module, "axis_name", named)

  return nn.intercept_methods(interceptor)


def _dropout(dropout: nn.Dropout, index, next_fun, inputs, deterministic=None, rng=None):
  """`nn.Dropout.__call__` with one mask per example."""
  deterministic = nn.merge_param("deterministic", dropout.deterministic, deterministic)
  shape = list(inputs.shape)
  for dim in dropout.broadcast_dims:
    shape[dim] = 1
  per_example = shape[0] == index.shape[0] == inputs.shape[0]
  if deterministic or dropout.rate in (0.0, 1.0) or not per_example:
    return next_fun(inputs, deterministic, rng)
  keep = 1.0 - dropout.rate
  key = dropout.make_rng(PER_EXAMPLE) if rng is None else rng
  draw = lambda i: jax.random.bernoulli(jax.random.fold_in(key, i), keep, shape[1:])
  mask = jax.vmap(draw)(index)  # [batch, ...]: one mask per example
  return jnp.where(mask, inputs / keep, jnp.zeros_like(inputs))


# --- the train step: registered by name, chosen by config.step ------------------------------------
# register(name) on `step(state, batch, run: Run) -> (state, metrics)`, written for ONE device:
# `run` holds the run's pieces (below), metrics are scalars averaged over the devices
# (lax.pmean); each reaches the log lines, metrics.jsonl and TensorBoard. register(name,
# optimizer_only=True): the step uses the gradient only through `run.update` (the optimizer),
# so once a group's learning rate stays 0 the run may switch to a step without that group's
# gradient (optim.frozen_from); a step that reads the gradient itself (SAM's norm) leaves it off.
STEPS = Registry("train step", "step", "research.steps")
register = STEPS.register


class Batch(NamedTuple):
  """A step's examples on this device, augmented (`Run.examples`)."""

  images: Any  # [per_device_batch, H, W, C] float, as the model sees them
  targets: Any  # [per_device_batch, num_classes] class probabilities (mixed by mixup/cutmix)
  labels: Any  # [per_device_batch] int32: each example's own class
  positions: Any  # [per_device_batch] int32: places in the step's global batch
  rng: Any  # the step's key for the model's draws, the same on every device


class Gradients(NamedTuple):
  """What `Run.gradients` gives: this device's part, not yet averaged over the devices."""

  grads: Any  # of the mean loss over the global batch (times loss_scale), this device's share
  batch_stats: Any  # the BatchNorm statistics the forward passes left (global: BatchNorm's own)
  metrics: dict  # {"loss": mean over this device's examples, "accuracy": ...}


@dataclasses.dataclass(frozen=True)
class Run:
  """The pieces a train step is built from, bound once by the run's set-up (research/setup.py
  `build_step`) and handed to the step as `run`; `at` adds the compiled step's arguments:
  `horizon` (the run's step count, which schedules end at), `seed` and `hyper` (a sweep's
  values), traced, so that runs of any length, seed and value share one compiled step."""

  step: Callable  # the registered step config.step names: (state, batch, run) -> (state, metrics)
  gather: Callable  # (step, batch) -> Examples: this device's examples (research/inputs.py)
  augment: Pipeline  # the config's augmentation (research/augment.py)
  loss_fn: Callable  # the registered loss: (logits, targets, intermediates, loss_fields)
  num_classes: int
  # The step's fields (research/fields.py): a step's (ema_decay, batch_size, ...) and those it
  # declared (a fork's, as sam_rho), a swept one traced
  fields: Any = None
  loss_fields: Any = None  # the loss's fields, a swept one traced
  micro_batch: int | None = None  # examples per forward/backward pass (None: all at once)
  # The gradient is that of the mean loss over the global batch times this (the global batch
  # size: the summed loss, `loss_reduction="sum"`); the logged loss is the mean.
  loss_scale: float = 1.0
  frozen: Any = None  # True for each parameter no update changes (optim.frozen_mask)
  # What BatchNorm averages its batch statistics over (`batch_norm_over`): AXIS, the global
  # batch; None: each device's examples, its running statistics then averaged over the devices
  # after each step, so that every device, the evals and the checkpoints hold one copy
  batch_norm_axis: str | None = AXIS
  horizon: Any = None  # int32, given to the optimizer's update; None: the optimizer's own
  seed: Any = None  # None: the keys gather and augment were built with
  hyper: Any = None  # {field: traced value} (sweep.hyper_values) for the optimizer's update

  def at(self, horizon=None, seed=None, hyper=None) -> "Run":
    """These pieces with the compiled step's arguments: the step's and the loss's views
    given a sweep's traced values (`hyper`), which the optimizer reads too."""
    fields, loss_fields = self.fields, self.loss_fields
    if hyper:
      fields = fields.with_values(hyper) if fields is not None else None
      loss_fields = loss_fields.with_values(hyper) if loss_fields is not None else None
    return dataclasses.replace(
      self, fields=fields, loss_fields=loss_fields, horizon=horizon, seed=seed, hyper=hyper
    )

  def loss(self, logits, targets, intermediates):
    """The registered loss per example [batch], given its fields."""
    return self.loss_fn(logits, targets, intermediates, self.loss_fields)

  def examples(self, state, batch) -> Batch:
    """This device's examples of the step `state` is at, augmented as the step draws them:
    each example's draws keyed by its place in the global batch, never by the device."""
    gather, augment = self.gather, self.augment
    if self.seed is not None:  # the seed's keys: gather's step key, augment's example keys
      gather = functools.partial(gather, step_key=run_keys(self.seed)[2])
      augment = functools.partial(augment, seed=self.seed)
    stored = gather(state.step, batch)  # Examples: uint8, as the data holds them
    targets = jax.nn.one_hot(stored.labels, self.num_classes)  # [per_device_batch, classes]
    (images, targets), positions, rng = _augmented(stored, augment, targets=targets)
    return Batch(images, targets, stored.labels, positions, rng)

  def forward(self, state, params, batch_stats, ex: Batch, part=slice(None), train=True):
    """(logits, updated collections) of the model on `ex`'s examples `part`. Every random
    stream the model asks for (`make_rng` of any collection) is the step's key folded with the
    slice's first global position: it differs per device and micro-batch; `nn.Dropout` draws
    one mask per example (`dropout_per_example`), the same on any device count."""
    if self.frozen is not None:  # their gradients' convolutions and products are never traced
      params = jax.tree.map(lambda p, f: lax.stop_gradient(p) if f else p, params, self.frozen)
    slice_key = jax.random.fold_in(ex.rng, ex.positions[part][0])
    rngs = {"dropout": slice_key, "params": slice_key, PER_EXAMPLE: ex.rng}
    # The model as written; from outside it, dropout per example, BatchNorm over the step's
    # axis (and apply_fn's CPU forms).
    with dropout_per_example(ex.positions[part]), batch_norm_over(self.batch_norm_axis):
      return state.apply_fn(
        {"params": params, "batch_stats": batch_stats},
        ex.images[part],
        train=train,
        rngs=rngs,
        mutable=["batch_stats", "intermediates"],
      )

  def gradients(self, state, params, ex: Batch) -> Gradients:
    """The forward pass, the loss and its gradient at `params` on this device's examples, a
    micro-batch at a time (the whole batch's gradient, to float rounding)."""
    per_device_batch = ex.labels.shape[0]
    micro_batch = self.micro_batch or per_device_batch
    n_micro = per_device_batch // micro_batch

    def loss_fn(params, batch_stats, part):
      logits, updates = self.forward(state, params, batch_stats, ex, part)
      losses = self.loss(logits, ex.targets[part], updates.get("intermediates", {}))
      correct = jnp.sum(logits.argmax(-1) == ex.labels[part])  # each example's own label
      scaled = losses.mean() * self.loss_scale / n_micro
      return scaled, (correct, updates.get("batch_stats", {}))

    total, correct, grads, batch_stats = 0.0, 0, None, state.batch_stats
    # A Python loop, unrolled when traced: XLA:CPU runs the micro-batches' independent
    # convolutions side by side on its cores (a lax.scan runs them one after another).
    for start in range(0, per_device_batch, micro_batch):
      part = slice(start, start + micro_batch)
      (part_loss, (part_correct, batch_stats)), part_grads = jax.value_and_grad(
        loss_fn, has_aux=True
      )(params, batch_stats, part)
      grads = part_grads if grads is None else jax.tree.map(jnp.add, grads, part_grads)
      total, correct = total + part_loss, correct + part_correct
    metrics = {"loss": total / self.loss_scale, "accuracy": correct / per_device_batch}
    return Gradients(grads, batch_stats, metrics)

  def update(self, state, grads, batch_stats):
    """`state` after the optimizer's update by `grads` (averaged over the devices already),
    with `batch_stats`: `state.tx` (research/optim.py) with its schedules over `horizon`."""
    if self.batch_norm_axis is None:  # per-device statistics: one running copy for all
      batch_stats = lax.pmean(batch_stats, AXIS)
    tx = optax.with_extra_args_support(state.tx)  # a plain optax transformation ignores them
    extra = {"horizon": self.horizon, "hyper": self.hyper}
    updates, opt_state = tx.update(grads, state.opt_state, state.params, **extra)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(
      step=state.step + 1, params=params, opt_state=opt_state, batch_stats=batch_stats
    )
    if state.ema_params is None:
      return new_state
    decay = self.fields.ema_decay  # once a step: the same on any device count and micro-batch
    ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, state.ema_params, new_state.params)
    return new_state.replace(ema_params=ema)

  def metrics(self, out: Gradients, grads, new_state) -> dict:
    """The step's metrics averaged over the devices, with the norms of the averaged gradient
    and of the new parameters."""
    metrics = lax.pmean(out.metrics, AXIS)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["param_norm"] = optax.tree.norm(new_state.params)
    return metrics


@register("standard", optimizer_only=True)
def standard_step(state, batch, run: Run):
  """One optimizer step on this device's part of the global batch: its examples, augmented;
  the forward pass, the loss and its gradients; their mean over all devices; the update."""
  ex = run.examples(state, batch)  # images [per_device_batch, H, W, C], targets, positions
  out = run.gradients(state, state.params, ex)  # forward, loss, gradients, by micro-batch
  # Every device gets the gradient of the mean loss over the GLOBAL batch. BatchNorm already
  # reduced its statistics over AXIS, so batch_stats agree on every device without a pmean.
  grads = lax.pmean(out.grads, AXIS)
  new_state = run.update(state, grads, out.batch_stats)
  return new_state, run.metrics(out, grads, new_state)


def train_step(state, batch, horizon=None, seed=None, hyper=None, *, run: Run):
  """The run's registered step on this device, given its pieces `run` (bound once) at the
  compiled step's arguments (`Run.at`)."""
  run = run.at(horizon, seed, hyper)
  return run.step(state, batch, run)


def _augmented(stored: Examples, augment, targets=None):
  """(augment's output for this device's examples as their step draws it, their positions in
  the global batch, the step's key for the model's draws): the step's key, the same on every
  device, split into the augmentation's and the model's."""
  augment_rng, model_rng = jax.random.split(stored.rng)
  positions = global_positions(stored.labels.shape[0])
  out = augment(
    augment_rng,
    stored.images_u8,
    stored.sizes,
    epoch=stored.epoch,
    ids=stored.ids,
    positions=positions,
    targets=targets,  # None: the images alone
  )
  return out, positions, model_rng


def augmented_examples(step, batch, *, gather, augment, count: int):
  """The first `count` of this device's examples at `step`, augmented as the step sees them."""
  images, _, _ = _augmented(gather(step, batch), augment)
  return images[:count]  # augmented as a whole batch: the same per-example keys


def eval_logits(state, images_u8, sizes=None, *, preprocess, mask=None):
  """(logits, the first view's logits) [batch, classes], at least float32, of the model in
  eval mode on `images_u8` through `preprocess`; with views (`preprocess.weights`) the logits
  are the views' weighted mean, else both are the same; with `preprocess.uncertain` < 1 the
  views only for that share of this batch (this device's part of it), the examples the first
  view is least confident of, real ones (`mask` 1) before padding. `state` has params,
  batch_stats, apply_fn."""
  images = preprocess(jax.random.key(0), images_u8, sizes)  # deterministic ops only

  def apply(x):
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    logits = state.apply_fn(variables, x, train=False)
    return logits.astype(models.at_least_float32(logits))

  if not preprocess.weights:
    logits = apply(images)
    return logits, logits
  weights = jnp.array(preprocess.weights)
  if preprocess.uncertain == 1:
    per_view = lax.map(apply, images)  # images: [views, batch, H, W, C], one view after another
    return jnp.tensordot(weights, per_view, 1), per_view[0]
  # The other views for the `uncertain` share least confident by the first: static shapes,
  # their logits scattered back over the first view's.
  first = apply(images[0])
  k = max(1, int(preprocess.uncertain * first.shape[0]))
  confidence = jax.nn.softmax(first).max(-1)
  if mask is not None:  # padding is never chosen over a real example
    confidence = jnp.where(mask > 0, confidence, jnp.inf)
  _, chosen = lax.top_k(-confidence, k)
  others = lax.map(apply, images[1:, chosen])  # [views - 1, k, classes]
  mixed = weights[0] * first[chosen] + jnp.tensordot(weights[1:], others, 1)
  return first.at[chosen].set(mixed), first


def eval_sums(state, images_u8, labels, mask, sizes=None, *, preprocess, metrics=()):
  """Sums of loss, correct predictions and real examples (mask = 1) over one batch, and of
  each registered eval metric's values per example (`metrics`: ((name, value shape, metric),
  ...), research/metrics.py's `shapes`), `metric/NAME`. With views, `correct_first_view` counts the
  first view's correct predictions alone."""
  logits, first_view = eval_logits(state, images_u8, sizes, preprocess=preprocess, mask=mask)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  sums = {
    "loss_sum": jnp.sum(losses * mask),
    "correct": jnp.sum((logits.argmax(-1) == labels) * mask),
    "count": jnp.sum(mask),
  }
  if preprocess.weights:
    sums["correct_first_view"] = jnp.sum((first_view.argmax(-1) == labels) * mask)
  for name, _, metric in metrics:
    per_example = metric(logits, labels)  # [batch, ...]
    sums[f"metric/{name}"] = jnp.tensordot(mask, per_example.astype(sums_dtype()), 1)
  return sums


def zero_totals(preprocess, metrics=()):
  """Eval totals before the first batch: the structure `eval_sums` returns, all zeros."""
  names = ("loss_sum", "correct", "count") + (("correct_first_view",) if preprocess.weights else ())
  totals = {name: jnp.zeros((), sums_dtype()) for name in names}
  return totals | {f"metric/{name}": jnp.zeros(shape, sums_dtype()) for name, shape, _ in metrics}


def sums_dtype() -> jnp.dtype:
  """What eval sums are kept in: float32, or float64 where JAX's 64-bit types are on (a float64
  model's run, research/models/__init__.py)."""
  return jnp.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))


def axis_checked(step, name: str):
  """`step` whose tracing turns JAX's NameError for an unbound axis into a user error (before
  anything is written): the model `name` names an axis the step does not have."""

  @functools.wraps(step)
  def checked(*args, **kwargs):
    try:
      return step(*args, **kwargs)
    except NameError as e:
      if "unbound axis name" not in str(e):
        raise  # a name the model's code lacks: its own traceback says where
      raise UserError(
        f"model {name!r} averages over an axis the training step does not have ({e}); the "
        f"step's axis is {AXIS!r} (research.steps.AXIS): name that one in BatchNorm's "
        "axis_name, or use the axis_name research.models passes to create()"
      ) from None

  return checked


def create_train_state(rng, ema: bool, model, image_shape, tx, seeds=None) -> TrainState:
  """The initial state, on the host: the model's variables and the optimizer's state come out
  of one compiled program (the optimizer's state op by op would compile one program per
  parameter shape). `ema`: it keeps an average of the weights (ema_decay > 0). `seeds`: one
  state per seed, each from its run's init key as its single run has it (`rng` unused), stacked
  along a leading axis; the program compiles once."""

  image = jax.ShapeDtypeStruct((1, *image_shape), jnp.float32)

  def init(rng):  # lazy_init: `image` is a shape; the forward pass feeds no output (dead code)
    variables = model.lazy_init(rng, image, **models.mode(model, False))
    return variables, tx.init(variables["params"])

  # It runs once per seed. On CPU, XLA's backend optimizations of its random initializers take
  # longer to compile than they save in those runs.
  options = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None
  compiled = jax.jit(init).lower(rng).compile(compiler_options=options)

  apply_fn = models.apply_fn(model)  # called with train=, whatever the model names it

  def state(rng):
    variables, opt_state = compiled(rng)
    return jax.device_get(
      TrainState(
        step=0,
        apply_fn=apply_fn,
        params=variables["params"],
        tx=tx,
        opt_state=opt_state,
        batch_stats=variables.get("batch_stats", {}),
        ema_params=variables["params"] if ema else None,  # the run's start sets it again
      )
    )

  if seeds is None:
    return state(rng)
  return sweep_lib.stack([state(run_keys(seed)[0]) for seed in seeds])
