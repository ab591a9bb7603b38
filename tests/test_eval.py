"""Eval counts every test example exactly once, whatever the split and batch sizes, and sums a
registered eval metric over them as it sums accuracy."""

import functools

import jax
import ml_collections
import numpy as np
import optax
import pytest

from research import augment, metrics, models
from research.inputs import pad_for_eval, resident_eval
from research.placement import first_replica, replicate, upload_shards
from research.steps import AXIS, create_train_state, eval_logits


@metrics.register("test_top2")
def top2(logits, labels):
  return (jax.lax.top_k(logits, 2)[1] == labels[:, None]).any(-1)


@pytest.mark.parametrize("n_examples, global_batch", [(250, 64), (256, 64), (7, 64), (250, 24)])
@pytest.mark.rounding
def test_eval_counts_every_example_once(n_examples, global_batch):
  config = ml_collections.ConfigDict(dict(name="keras_cnn", num_classes=10, dtype="float32"))
  model = models.create(config, AXIS)
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), optax.sgd(0.1))
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (n_examples, 32, 32, 3), dtype=np.uint8)
  labels = rng.integers(0, 10, n_examples).astype(np.int32)
  padded = pad_for_eval(images, labels, global_batch)
  shards = upload_shards(padded, len(padded[1]) // 8)
  p_eval = jax.pmap(
    functools.partial(
      resident_eval,
      preprocess=augment.build(""),
      per_device_batch=global_batch // 8,
      metrics=("test_top2",),
    ),
    axis_name=AXIS,
  )
  totals = first_replica(p_eval(replicate(state), shards))
  assert int(totals["count"]) == n_examples

  # The same sums computed directly, example by example, in one program of their own.
  apply = jax.jit(functools.partial(model.apply, train=False))
  logits = apply({"params": state.params}, images / 255.0)
  expected_correct = int(np.sum(np.argmax(logits, -1) == labels))
  top_two = np.argsort(-np.asarray(logits), -1, kind="stable")[:, :2]
  assert int(totals["metric/test_top2"]) == int(np.sum((top_two == labels[:, None]).any(-1)))
  expected_loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum())
  assert int(totals["correct"]) == expected_correct
  np.testing.assert_allclose(totals["loss_sum"], expected_loss, rtol=1e-4)


def test_tta_on_the_least_confident_gives_them_the_views_mean_and_the_rest_the_first_view():
  """`tta(1, 0.25, 'mean')` (hiverge's): the quarter of a batch the first view is least
  confident of gets the mean of the six views' logits, as full TTA gives it; the others keep
  the first view's logits."""
  config = ml_collections.ConfigDict(dict(name="keras_cnn", num_classes=10, dtype="float32"))
  model = models.create(config, None)
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), optax.sgd(0.1))
  images = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
  logits = lambda spec: jax.jit(functools.partial(eval_logits, preprocess=augment.build(spec)))(
    state, images
  )
  (every, first), (some, some_first) = logits("tta(1, 1.0, 'mean')"), logits("tta(1, 0.25, 'mean')")
  np.testing.assert_allclose(some_first, first, rtol=1e-6)
  confidence = np.asarray(jax.nn.softmax(first)).max(-1)
  least = np.argsort(confidence)[:4]  # 0.25 of 16
  rest = np.setdiff1d(np.arange(16), least)
  np.testing.assert_allclose(some[least], every[least], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(some[rest], first[rest], rtol=1e-6)
  assert not np.allclose(every[least], first[least])  # the views change the logits
