"""The core invariant: N devices with global batch B take the same step as 1 device with B."""

import functools

import jax
import ml_collections
import numpy as np
import optax
import pytest

from research import augment, models
from research.placement import first_replica, replicate
from research.steps import AXIS, create_train_state, train_step


def _vgg():
  config = ml_collections.ConfigDict(
    dict(name="vgg", depth=11, width=0.125, num_classes=10, dtype="float32")
  )
  return models.create(config, AXIS)


def _one_step(state, images_u8, labels, n_devices):
  """One pmapped step over the first `n_devices`, the global batch split evenly."""
  devices = jax.local_devices()[:n_devices]
  step = jax.pmap(
    functools.partial(
      train_step,
      augment=augment.build("standardize"),  # deterministic, so both runs see the same pixels
      num_classes=10,
      label_smoothing=0.0,
      aux_loss_weight=0.0,
    ),
    axis_name=AXIS,
    devices=devices,
  )
  split = lambda x: x.reshape(n_devices, -1, *x.shape[1:])  # [devices, per_device_batch, ...]
  rngs = np.broadcast_to(jax.random.key_data(jax.random.key(1)), (n_devices, 2))
  new_state, metrics = step(
    replicate(state, devices), split(images_u8), split(labels), jax.random.wrap_key_data(rngs)
  )
  return first_replica(new_state), first_replica(metrics)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  return rng.integers(0, 256, (32, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 32)


# Adam's first update is lr * g / (|g| + eps): for gradients at float noise level (1e-9) it is
# ±lr on either side, so eps is raised above that noise; the comparison stays exact otherwise.
@pytest.mark.parametrize("optimizer", [optax.sgd(0.1, momentum=0.9), optax.adam(1e-3, eps=1e-4)])
def test_one_step_on_8_devices_equals_one_step_on_1(batch, optimizer):
  model = _vgg()
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), optimizer)
  one, metrics_one = _one_step(state, *batch, n_devices=1)
  eight, metrics_eight = _one_step(state, *batch, n_devices=8)

  np.testing.assert_allclose(metrics_eight["loss"], metrics_one["loss"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(eight.params), jax.tree.leaves(one.params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  # BatchNorm running statistics come from the GLOBAL batch on every replica.
  for a, b in zip(
    jax.tree.leaves(eight.batch_stats), jax.tree.leaves(one.batch_stats), strict=True
  ):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_params_changed_and_replicas_agree(batch):
  model = _vgg()
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), optax.sgd(0.1))
  devices = jax.local_devices()
  step = jax.pmap(
    functools.partial(
      train_step,
      augment=augment.build("crop(4)|flip_lr|standardize"),  # random, different per device
      num_classes=10,
      label_smoothing=0.0,
      aux_loss_weight=0.0,
    ),
    axis_name=AXIS,
  )
  images, labels = batch
  rngs = jax.random.wrap_key_data(
    np.broadcast_to(jax.random.key_data(jax.random.key(1)), (len(devices), 2))
  )
  new_rstate, _ = step(
    replicate(state), images.reshape(8, 4, 32, 32, 3), labels.reshape(8, 4), rngs
  )
  per_device = jax.device_get(new_rstate.params)
  for leaf in jax.tree.leaves(per_device):
    np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))
  before, after = jax.tree.leaves(state.params)[0], jax.tree.leaves(per_device)[0][0]
  assert not np.allclose(before, after)
