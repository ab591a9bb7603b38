"""The core invariant: N devices with global batch B take the same step as 1 device with B."""

import contextlib
import dataclasses
import functools
import itertools
import json

import flax.linen
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax import lax

from research import augment, configuration, cpu_forms, inputs, losses, models, steps, sweep, train
from research.data import ImageDataset
from research.errors import UserError
from research.placement import first_replica, replicate
from research.setup import setup
from research.steps import AXIS, create_train_state, train_step
from tests import float64

_FLOAT64 = {field.removeprefix("model."): v for field, v in float64.FIELDS.items()}


def _vgg(dtype="float32"):
  config = ml_collections.ConfigDict(
    dict(name="vgg", depth=11, width=0.125, num_classes=10, dtype=dtype, param_dtype=dtype)
  )
  return models.create(config, AXIS)


def _as_given(step, batch):
  """The step's examples as they are in its batch: (images_u8, labels, rng), no padding."""
  del step
  return steps.Examples(*batch)


def _fields(label_smoothing=0.0, aux_loss_weight=0.0):
  """A loss's config fields."""
  return ml_collections.ConfigDict(
    dict(label_smoothing=label_smoothing, aux_loss_weight=aux_loss_weight)
  )


def _loss(label_smoothing=0.0, aux_loss_weight=0.0, name="cross_entropy"):
  """The registered loss `name` with these config fields."""
  return functools.partial(
    losses.LOSSES.get(name), fields=_fields(label_smoothing, aux_loss_weight)
  )


def _one_step(state, images_u8, labels, n_devices, loss=None, augmentation="crop(4)|flip_lr"):
  """One pmapped step over the first `n_devices`, the global batch split evenly."""
  devices = jax.local_devices()[:n_devices]
  step = jax.pmap(
    functools.partial(
      train_step,
      run=steps.Run(
        step=steps.standard_step,
        gather=_as_given,
        augment=augment.build(augmentation),  # random: each example's draws by its position
        loss_fn=lambda logits, targets, intermediates, fields: (loss or _loss())(
          logits, targets, intermediates
        ),
        num_classes=10,
      ),
    ),
    axis_name=AXIS,
    devices=devices,
  )
  split = lambda x: x.reshape(n_devices, -1, *x.shape[1:])  # [devices, per_device_batch, ...]
  rngs = np.broadcast_to(jax.random.key_data(jax.random.key(1)), (n_devices, 2))
  batch = (split(images_u8), split(labels), jax.random.wrap_key_data(rngs))
  new_state, metrics = step(replicate(state, devices), batch)
  for leaf in jax.tree.leaves(jax.device_get(new_state.params)):  # every replica's: the same
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))
  return first_replica(new_state), first_replica(metrics)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  return rng.integers(0, 256, (32, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 32)


# Each model with one optimizer: the models bring BatchNorm (statistics of the global batch) and
# dropout (each example's own draws); the optimizers a state that follows the averaged gradient
# (momentum) and an update that divides by it (Adam). In float64 (tests/float64.py), the largest
# relative difference of the loss, the update (parameters after − before) and the BatchNorm
# statistics: 6.8e-15 on the default kernels, 6.3e-15 on the other set; one device's gradient in
# place of the devices' mean (lax.all_gather(g, AXIS)[0]): 1.1 (keras_cnn) and 3.7 (vgg).
@pytest.mark.parametrize(
  "model, optimizer",
  [("vgg", optax.sgd(0.1, momentum=0.9)), ("keras_cnn", optax.adam(1e-3))],
  ids=["vgg-sgd_momentum", "keras_cnn-adam"],
)
def test_one_step_on_8_devices_equals_one_step_on_1(batch, model, optimizer, x64):
  config = ml_collections.ConfigDict(dict(name=model, num_classes=10, **_FLOAT64))
  module = _vgg("float64") if model == "vgg" else models.create(config, AXIS)
  state = create_train_state(jax.random.key(0), None, module, (32, 32, 3), optimizer)
  floats = [x for x in jax.tree.leaves((state.params, state.opt_state)) if x.dtype.kind == "f"]
  assert all(leaf.dtype == np.float64 for leaf in floats)
  one, metrics_one = _one_step(state, *batch, n_devices=1)
  eight, metrics_eight = _one_step(state, *batch, n_devices=8)
  assert metrics_eight["loss"].dtype == np.float64
  float64.assert_close(metrics_eight["loss"], metrics_one["loss"], what="loss")
  float64.assert_close(eight.params, one.params, start=state.params, what="update")
  # BatchNorm running statistics come from the GLOBAL batch on every replica.
  if model == "vgg":
    assert all(leaf.dtype == np.float64 for leaf in jax.tree.leaves(eight.batch_stats))
    float64.assert_close(eight.batch_stats, one.batch_stats, what="statistics")


class _TwoHeads(flax.linen.Module):
  """Inception's interface: logits, and in training auxiliary logits sown by a head of their
  own. In float64 (tests/float64.py): the main head's update is compared across two losses."""

  @flax.linen.compact
  def __call__(self, x, train: bool):
    dense = functools.partial(flax.linen.Dense, 10, dtype="float64", param_dtype="float64")
    x = x.reshape(len(x), -1)
    aux_logits = dense(name="aux_head")(x)
    if train:
      self.sow("intermediates", "auxiliary_logits", aux_logits)
    return dense(name="head")(x)


# The main head's update with and without the auxiliary loss (tests/float64.py): 0 apart on both
# kernel sets; the auxiliary loss taken of aux + main logits (the main head in its gradient): 0.52.
def test_the_auxiliary_head_trains_by_its_loss_weight_and_leaves_the_main_head_alone(batch, x64):
  state = create_train_state(jax.random.key(0), None, _TwoHeads(), (32, 32, 3), optax.sgd(0.1))
  inception = functools.partial(_loss, name="auxiliary_cross_entropy")  # Inception's config's
  off, metrics_off = _one_step(state, *batch, n_devices=8, loss=inception(aux_loss_weight=0.0))
  on, metrics_on = _one_step(state, *batch, n_devices=8, loss=inception(aux_loss_weight=0.4))
  unchanged = jax.tree.map(np.array_equal, off.params["aux_head"], state.params["aux_head"])
  assert all(jax.tree.leaves(unchanged))
  assert not np.allclose(on.params["aux_head"]["kernel"], state.params["aux_head"]["kernel"])
  head = lambda s: s.params["head"]
  float64.assert_close(head(on), head(off), start=head(state), what="the main head's update")
  assert metrics_on["loss"] > metrics_off["loss"]  # the weighted auxiliary loss is added


def _resident_takes(replicate_max_gb: float):
  """(Inputs, each of steps 0-8's labels taken [8 devices, 2]) of 48 examples whose images
  show their labels, 16 per global batch: 3 steps per epoch."""
  labels = np.arange(48, dtype=np.int32)
  images = np.zeros((48, 4, 4, 3), np.uint8)
  images[:, 0, 0, 0] = labels  # each image shows its own label
  data = ImageDataset("synthetic", "test", images, labels, images[:8], labels[:8], 48)
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(batch_size=16, eval_batch_size=8, replicate_max_gb=replicate_max_gb)
  shuffle_key, step_key = jax.random.split(jax.random.key(0))
  runs = sweep.runs_of(config)
  pipeline = augment.build("standardize")
  resident = inputs.resident(config, runs, data, 2, pipeline, shuffle_key, step_key)
  gather = jax.pmap(resident.gather, axis_name=AXIS)
  taken = lambda step, batch: np.asarray(gather(replicate(np.int32(step)), batch)[1])
  stream = resident.batches(0)
  seen = [taken(step, next(stream)) for step in range(9)]
  resumed = resident.batches(4)  # a run resumed mid-epoch takes the same examples
  for step in range(4, 9):
    np.testing.assert_array_equal(taken(step, next(resumed)), seen[step])
  # As a folder lists its classes one after another (here class = label // 6), the sample the
  # model may initialise from is a random part of the split.
  assert len(set(resident.first_images(8, 0)[:, 0, 0, 0] // 6)) > 2
  np.testing.assert_array_equal(resident.first_images(8, 0), resident.first_images(8, 0))
  return resident, seen


def test_resident_global_batches_take_each_example_once_per_epoch_in_a_new_order():
  resident, seen = _resident_takes(replicate_max_gb=1.0)
  assert resident.steps_per_epoch == 3 and not resident.order_per_device
  batches = [step.reshape(-1) for step in seen]  # global batches: device 0's part first
  epochs = [np.concatenate(batches[e * 3 : e * 3 + 3]) for e in range(3)]
  for order in epochs:
    np.testing.assert_array_equal(np.sort(order), np.arange(48))
  for before, after in itertools.pairwise(epochs):
    assert not np.array_equal(before, after)
  # Devices meet examples from the whole split: device 0 is not held to a part of it.
  assert len(set(np.concatenate([step[0] for step in seen]).tolist())) > 6


def test_sharded_resident_data_keeps_each_device_to_its_shard_in_a_new_order():
  resident, seen = _resident_takes(replicate_max_gb=0.0)
  assert resident.order_per_device and "depend on the device count" in resident.layout
  epochs = [np.concatenate(seen[e * 3 : e * 3 + 3], axis=1) for e in range(3)]  # [8, 6]
  shards = np.sort(epochs[0], axis=1)  # each device takes the examples it holds
  np.testing.assert_array_equal(np.sort(shards, axis=None), np.arange(48))
  for order in epochs[1:]:
    np.testing.assert_array_equal(np.sort(order, axis=1), shards)
  assert all(len(set(shard // 6)) > 2 for shard in shards)  # a random part of the split
  pairs = lambda order: set(zip(order[0], order[1], strict=True))  # devices 0 and 1, by slot
  for before, after in itertools.pairwise(epochs):
    assert not np.array_equal(before, after) and pairs(before) != pairs(after)


# The micro-batched and the whole-batch step differ only in the order of additions: each
# parameter's gradient sums its examples' terms in two halves or at once. In float64
# (tests/float64.py), from the same parameters on the same examples, at two steps' dropout masks
# and augmentation, the loss and the gradient: 4.4e-16 apart at most on the default kernels,
# 6.3e-16 on the other set; the second micro-batch's first example left out: 5.8e-2.
@pytest.mark.end_to_end
def test_micro_batches_take_the_step_of_the_whole_batch_dropout_included(x64):
  config = float64.config("configs/cifar_keras_cnn.py:smoke")  # dropout 0.25 and 0.5
  config.batch_size, config.micro_batch_size = 128, 8  # 16 per device: 2 micro-batches
  # Plain SGD at lr 1 makes the step's update its gradient: parameters after − before = −g.
  config.update(optimizer="sgd", momentum=0.0, learning_rate=1.0, lr_batch_size=0)
  config.schedule, config.ema_decay = "constant", 0.75
  training = setup(config)
  assert training.micro_batch == 8
  whole = functools.partial(train_step, run=dataclasses.replace(training.run, micro_batch=None))
  flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
  p_steps = [jax.pmap(step, axis_name=AXIS) for step in (training.train_step, whole)]
  for at_step in (0, 5):  # two steps' dropout masks and augmentation, each from the same start
    state = training.state.replace(step=at_step)
    taken = []
    for p_step in p_steps:
      rstate, metrics = p_step(replicate(state), next(training.inputs.batches(0)))
      gradient = flat(state.params) - flat(first_replica(rstate.params))
      # The EMA moves once a step, by the step's update, however many micro-batches it took
      ema = 0.75 * flat(state.ema_params) + 0.25 * flat(first_replica(rstate.params))
      np.testing.assert_allclose(flat(first_replica(rstate.ema_params)), ema, rtol=1e-12)
      taken.append((first_replica(metrics)["loss"], gradient))
    (micro_loss, micro_gradient), (whole_loss, whole_gradient) = taken
    assert gradient.dtype == np.float64
    float64.assert_close(micro_loss, whole_loss, what="loss")
    float64.assert_close(micro_gradient, whole_gradient, what="gradient")


@pytest.mark.parametrize(
  "size, kernel, strides, padding",
  [(11, (3, 3), 1, "SAME"), (11, (3, 3), 1, "VALID"), (11, (3, 3), 2, "VALID"),
   (11, (1, 7), 1, "SAME"), (11, (1, 1), 1, "SAME"), (11, (3, 3), 2, "SAME"),
   (11, (3, 3), 1, ((2, 0), (1, 3))), (2, (3, 3), 1, "SAME")],  # 2: kernel larger than input
)  # fmt: skip
def test_the_cpu_convolution_has_xla_s_value_and_gradients(size, kernel, strides, padding):
  images = jax.random.normal(jax.random.key(0), (4, size, size, 5))
  grads = []
  for conv_fn in (lax.conv_general_dilated, cpu_forms.conv_general_dilated):
    conv = flax.linen.Conv(6, kernel, strides, padding, conv_general_dilated=conv_fn)
    params = jax.jit(conv.init)(jax.random.key(1), images)
    loss = lambda p, x, conv=conv: jnp.sum(jnp.sin(conv.apply(p, x)))
    grads.append(jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, images))
  (value, (params_grad, images_grad)), (ours, (ours_params_grad, ours_images_grad)) = grads
  np.testing.assert_allclose(ours, value, rtol=1e-5)
  np.testing.assert_allclose(ours_images_grad, images_grad, rtol=1e-4, atol=1e-5)
  for a, b in zip(jax.tree.leaves(ours_params_grad), jax.tree.leaves(params_grad), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # sums in another order


def test_a_plain_flax_conv_takes_the_cpu_form_only_inside_applied():
  """Inside `cpu_forms.cpu_forms_applied()`, an `nn.Conv` as any flax model writes it computes its
  kernel gradient as matrix products; outside, XLA differentiates its convolution."""
  conv = flax.linen.Conv(4, (3, 3))
  images = jnp.ones((2, 8, 8, 3))
  params = conv.init(jax.random.key(0), images)

  def products(context):
    def loss(p):
      with context():
        return jnp.sum(conv.apply(p, images))

    return str(jax.make_jaxpr(jax.grad(loss))(params)).count("dot_general[")

  assert products(contextlib.nullcontext) == 0
  assert products(cpu_forms.cpu_forms_applied) > 0


@pytest.mark.parametrize("size", [30, 13])  # 13: the last row and column are not pooled
def test_the_cpu_max_pool_has_xla_s_value_and_gradient_ties_included(size):
  values = jax.random.randint(jax.random.key(0), (4, size, size, 8), 0, 3)  # many ties
  images = values.astype(jnp.float32)
  weights = jax.random.normal(jax.random.key(1), (size // 2, size // 2, 8))
  losses = [
    lambda x: jnp.sum(jnp.sin(flax.linen.max_pool(x, (2, 2), strides=(2, 2)) * weights)),
    lambda x: jnp.sum(jnp.sin(cpu_forms.max_pool(x, 2) * weights)),
  ]
  (value, grad), (ours, ours_grad) = [jax.value_and_grad(loss)(images) for loss in losses]
  assert ours == value
  np.testing.assert_array_equal(ours_grad, grad)


def test_on_a_gpu_the_max_pool_s_gradient_is_a_select_its_forward_a_reshape_where_switched_on(
  monkeypatch,
):
  """On a GPU the max-pool's gradient is the select per window by default (no
  select-and-scatter), with XLA's values: the gradient to each window's first maximum, ties
  included; `with_forms("max_pool_forward")` makes its forward a reshape and a max (no
  reduce-window), the same values; `without_cpu_forms` gives XLA's own ops."""
  images = jax.random.randint(jax.random.key(0), (2, 9, 8, 4), 0, 3).astype(jnp.float32)  # ties
  loss = lambda x: jnp.sum(jnp.sin(cpu_forms.max_pool(x, 2)))
  xla = lambda x: jnp.sum(jnp.sin(flax.linen.max_pool(x, (2, 2), (2, 2))))
  monkeypatch.setattr(cpu_forms.jax, "default_backend", lambda: "gpu")

  def traced(context):
    with context:
      jaxpr = str(jax.make_jaxpr(jax.grad(loss))(images))
      return jaxpr, loss(images), jax.grad(loss)(images)

  default = traced(contextlib.nullcontext())
  reshaped = traced(cpu_forms.with_forms("max_pool_forward"))
  plain = traced(cpu_forms.without_cpu_forms())
  assert "select_and_scatter" in plain[0] and "reduce_window_max" in plain[0]
  assert "select_and_scatter" not in default[0] and "reduce_window_max" in default[0]
  assert "select_and_scatter" not in reshaped[0] and "reduce_window" not in reshaped[0]
  for _, value, grad in (default, reshaped, plain):
    assert value == xla(images)
    np.testing.assert_array_equal(grad, jax.grad(xla)(images))
  assert traced(contextlib.nullcontext())[0] == default[0]  # each switch ends with its context


@pytest.mark.parametrize(
  "configured, per_device, batch_norm, backend, expected",
  [
    (0, 256, False, "cpu", 16),  # auto: CPU convolutions run fastest on small batches
    (0, 256, True, "cpu", 256),  # auto keeps BatchNorm's statistics over the device batch
    (0, 256, False, "gpu", 256),  # accelerators run the whole batch
    (0, 24, False, "cpu", 24),  # 16 does not divide 24
    (8, 256, True, "gpu", 8),  # configured: always as given
  ],
)
def test_the_micro_batch_is_auto_chosen_or_as_configured(
  configured, per_device, batch_norm, backend, expected
):
  assert steps.micro_batch_size(configured, per_device, batch_norm, backend) == expected


class _DropPath(flax.linen.Module):
  """A draw the model makes itself, as stochastic depth does: one keep/drop per call."""

  @flax.linen.compact
  def __call__(self, x, train: bool):
    keep = jax.random.bernoulli(self.make_rng("dropout"), 0.5, (16,))
    self.sow("intermediates", "keep", keep)
    return flax.linen.Dense(10)(x.reshape(len(x), -1)) * keep.mean()


def test_a_draw_the_model_makes_itself_differs_per_device_and_per_micro_batch(batch):
  state = create_train_state(jax.random.key(0), None, _DropPath(), (32, 32, 3), optax.sgd(0.1))
  run = steps.Run(
    step=steps.standard_step,
    gather=_as_given,
    augment=augment.build(""),
    loss_fn=losses.cross_entropy,
    num_classes=10,
    loss_fields=_fields(),
  )

  def draws(state, batch):  # each micro-batch's draw on this device: [2 micro-batches, 16]
    ex = run.examples(state, batch)
    parts = (slice(0, 2), slice(2, 4))
    taken = [run.forward(state, state.params, {}, ex, part)[1] for part in parts]
    return jnp.stack([t["intermediates"]["keep"][0] for t in taken])

  images_u8, labels = batch
  split = lambda x: x[:8].reshape(2, 4, *x.shape[1:])  # 2 devices, 4 examples each
  rngs = jax.random.wrap_key_data(np.broadcast_to(jax.random.key_data(jax.random.key(1)), (2, 2)))
  taken = jax.pmap(draws, axis_name=AXIS, devices=jax.local_devices()[:2])(
    replicate(state, jax.local_devices()[:2]), (split(images_u8), split(labels), rngs)
  )
  slices = np.asarray(taken).reshape(4, 16)  # devices × micro-batches: 4 slices of the batch
  assert len({row.tobytes() for row in slices}) == 4  # each slice of the batch draws anew


# One call of 4 steps and 4 calls of one run the same operations; XLA may fuse the loop's body
# apart and round otherwise. In float64 (tests/float64.py) the losses and the update: 5.2e-15
# apart at most on the default kernels, 0 on the other set; every step of the call from the
# call's state (the loop's carry dropped): 3.2e-2.
@pytest.mark.end_to_end
def test_steps_per_call_runs_the_steps_of_single_calls_and_the_run_logs_each_step(tmp_path, x64):
  config = float64.config("configs/cifar_keras_cnn.py:smoke")  # 16-pixel images
  config.update(optimizer="sgd", learning_rate=0.01, momentum=0.0)
  config.update(synthetic_train_size=256, synthetic_test_size=64, batch_size=32, eval_batch_size=32)
  single, four = setup(config), setup(config.copy_and_resolve_references())
  four = dataclasses.replace(four, steps_per_call=4)
  stream = single.inputs.batches(0)
  batches = [next(stream) for _ in range(4)]
  one_step, _ = train.compile_step(single, replicate(single.state), batches[0])
  four_steps, _ = train.compile_step(four, replicate(four.state), batches[0])
  a, losses = replicate(single.state), []
  for batch in batches:
    a, metrics = one_step(a, batch)
    losses.append(first_replica(metrics)["loss"])
  b, metrics = four_steps(replicate(four.state), batches[0])  # the resident data: one batch
  float64.assert_close(first_replica(metrics)["loss"], losses, what="losses")
  start, (params_a, params_b) = single.state.params, (first_replica(s.params) for s in (a, b))
  assert jax.tree.leaves(params_b)[0].dtype == np.float64
  float64.assert_close(params_b, params_a, start=start, what="update")

  config.update(steps_per_call=4, num_train_steps=8, log_every_steps=4)
  final = train.train_and_evaluate(config, str(tmp_path / "run"))
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
  assert [r["step"] for r in records if "loss" in r] == [4, 8] and final["step"] == 8


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(steps_per_call=3), r"=3 does not divide an epoch's steps \(16\), log_every_steps \(8\)"),
    (dict(steps_per_call=4, log_every_steps=6), r"=4 does not divide log_every_steps \(6\): each"),
  ],
)
def test_a_steps_per_call_that_splits_a_step_s_event_is_one_error_line(fields, message):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(fields)
  with pytest.raises(UserError, match=message) as error:
    setup(config)
  assert "\n" not in str(error.value)


@losses.register("test_reads_a_float_in_python")
def _reads_a_float_in_python(logits, targets, intermediates, config):
  """A fork's loss that branches on a float field in Python: it cannot take it traced."""
  smoothing = config.label_smoothing if config.label_smoothing > 0 else 0.0
  return losses.cross_entropy(
    logits, optax.smooth_labels(targets, smoothing), intermediates, config
  )


def test_a_part_that_reads_a_float_field_in_python_trains_with_the_fields_as_constants(
  tmp_path, capsys
):
  """The float fields are arguments of the compiled step (sweep.hyper_values); a fork's part
  that branches on one in Python still trains, the fields as constants, and the run says so."""
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(synthetic_train_size=64, synthetic_test_size=32, synthetic_image_size=16)
  config.update(batch_size=16, eval_batch_size=16, num_train_steps=2, log_every_steps=1)
  config.update(loss="test_reads_a_float_in_python", label_smoothing=0.1)
  final = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert final["step"] == 2 and np.isfinite(final["eval_loss"])
  assert train.HYPER_CONSTANT in capsys.readouterr().out
