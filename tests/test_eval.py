"""Eval counts every test example exactly once, whatever the split and batch sizes."""

import functools

import jax
import ml_collections
import numpy as np
import optax
import pytest

from research import augment, models
from research.inputs import first_replica, pad_for_eval, replicate, resident_eval, upload_shards
from research.steps import AXIS, create_train_state


@pytest.mark.parametrize("n_examples", [250, 256, 7])
@pytest.mark.rounding
def test_eval_counts_every_example_once(n_examples):
  config = ml_collections.ConfigDict(dict(name="keras_cnn", num_classes=10, dtype="float32"))
  model = models.create(config, AXIS)
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), optax.sgd(0.1))
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (n_examples, 32, 32, 3), dtype=np.uint8)
  labels = rng.integers(0, 10, n_examples).astype(np.int32)
  global_batch = 64
  padded = pad_for_eval(images, labels, global_batch)
  shards = upload_shards(padded, len(padded[1]) // 8)
  p_eval = jax.pmap(
    functools.partial(
      resident_eval,
      preprocess=augment.build(""),
      per_device_batch=global_batch // 8,
    ),
    axis_name=AXIS,
  )
  totals = first_replica(p_eval(replicate(state), shards))
  assert int(totals["count"]) == n_examples

  # The same sums computed directly, example by example, in one program of their own.
  apply = jax.jit(functools.partial(model.apply, train=False))
  logits = apply({"params": state.params}, images / 255.0)
  expected_correct = int(np.sum(np.argmax(logits, -1) == labels))
  expected_loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum())
  assert int(totals["correct"]) == expected_correct
  np.testing.assert_allclose(totals["loss_sum"], expected_loss, rtol=1e-4)
