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
from research.metrics import eval_record
from research.placement import first_replica, replicate, to_devices
from research.steps import AXIS, create_train_state, eval_logits
from tests import float64


@metrics.register("test_top2")
def top2(logits, labels):
  return (jax.lax.top_k(logits, 2)[1] == labels[:, None]).any(-1)


def balanced(totals, count):
  """Balanced accuracy: the mean over the classes of each class's accuracy."""
  return np.nanmean(metrics.per_class(totals))


# The guide's balanced accuracy, as a fork writes it: per_class_accuracy's values, finished.
metrics.register("test_balanced", finish=balanced)(metrics.per_class_accuracy)


# In float64 (tests/float64.py) the loss summed by the eval and by numpy from the logits of one
# program of its own: 1.9e-16 apart at most, relative, on the default kernels, 2.2e-16 on the
# other set; the loss sum without each batch's first example: 1.7e-2 to 3.4e-1.
@pytest.mark.parametrize(
  "n_examples, global_batch, devices",
  [(250, 64, 8), (256, 64, 8), (7, 64, 8), (250, 24, 8), (250, 64, 1)],
)
def test_eval_counts_every_example_once(n_examples, global_batch, devices, x64):
  """Loss, accuracy and registered metrics (a value per example, an array per example too)
  summed over the split as numpy sums them from the same logits: any eval batch, any device
  count."""
  config = ml_collections.ConfigDict(
    dict(name="keras_cnn", num_classes=10, dtype="float64", param_dtype="float64")
  )
  model = models.create(config, AXIS)
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), optax.sgd(0.1))
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (n_examples, 32, 32, 3), dtype=np.uint8)
  labels = rng.integers(0, 10, n_examples).astype(np.int32)
  padded = pad_for_eval(images, labels, global_batch)
  on = jax.devices()[:devices]
  shards = tuple(to_devices(x.reshape(devices, -1, *x.shape[1:]), on) for x in padded)
  names = metrics.shapes(("test_top2", "per_class_accuracy", "test_balanced"), 10)
  preprocess = augment.build("")
  p_eval = jax.pmap(
    functools.partial(
      resident_eval,
      preprocess=preprocess,
      per_device_batch=global_batch // devices,
      metrics=names,
    ),
    axis_name=AXIS,
    devices=on,
  )
  totals = first_replica(p_eval(replicate(state, on), shards))
  assert int(totals["count"]) == n_examples

  # The same sums computed directly, example by example, in one program of their own.
  apply = jax.jit(
    lambda x: model.apply({"params": state.params}, preprocess(jax.random.key(0), x), train=False)
  )
  logits = apply(images)
  assert logits.dtype == totals["loss_sum"].dtype == np.float64
  predicted = np.argmax(logits, -1)
  expected_correct = int(np.sum(predicted == labels))
  top_two = np.argsort(-np.asarray(logits), -1, kind="stable")[:, :2]
  assert int(totals["metric/test_top2"]) == int(np.sum((top_two == labels[:, None]).any(-1)))
  expected_loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum())
  assert int(totals["correct"]) == expected_correct
  float64.assert_close(totals["loss_sum"], expected_loss, what="loss sum")
  # Each class's examples and correct ones, counted exactly; the record finishes them.
  counts = np.bincount(labels, minlength=10)
  hits = np.bincount(labels[predicted == labels], minlength=10)
  np.testing.assert_array_equal(totals["metric/per_class_accuracy"], [hits, counts])
  record = eval_record(1, totals)
  with np.errstate(invalid="ignore"):
    np.testing.assert_array_equal(record["eval_per_class_accuracy"], hits / counts)
    assert record["eval_test_balanced"] == np.nanmean(hits / counts)
  assert record["eval_test_top2"] == totals["metric/test_top2"] / n_examples


# Full TTA and TTA on the least confident are two programs: their logits are compared in float64
# (tests/float64.py), 9.0e-17 apart at most on the default kernels, 2.4e-16 on the other set; the
# most confident chosen in place of the least: 0.16.
def test_tta_on_the_least_confident_gives_them_the_views_mean_and_the_rest_the_first_view(x64):
  """`tta(1, 0.25, 'mean')` (hiverge's): the quarter of a batch the first view is least
  confident of gets the mean of the six views' logits, as full TTA gives it; the others keep
  the first view's logits."""
  model_fields = {f.removeprefix("model."): v for f, v in float64.FIELDS.items()}
  config = ml_collections.ConfigDict(dict(name="keras_cnn", num_classes=10, **model_fields))
  model = models.create(config, None)
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), optax.sgd(0.1))
  images = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
  logits = lambda spec: jax.jit(functools.partial(eval_logits, preprocess=augment.build(spec)))(
    state, images
  )
  (every, first), (some, some_first) = logits("tta(1, 1.0, 'mean')"), logits("tta(1, 0.25, 'mean')")
  assert first.dtype == np.float64
  float64.assert_close(some_first, first, what="first view")
  confidence = np.asarray(jax.nn.softmax(first)).max(-1)
  least = np.argsort(confidence)[:4]  # 0.25 of 16
  rest = np.setdiff1d(np.arange(16), least)
  float64.assert_close(some[least], every[least], what="the least confident's mean")
  float64.assert_close(some[rest], first[rest], what="the others' first view")
  assert not np.allclose(every[least], first[least])  # the views change the logits


def test_a_class_the_split_lacks_leaves_a_sweep_s_points_live_and_a_diverged_one_out():
  """per_class_accuracy is NaN for a class the split lacks, at every point: not a diverged
  point's NaN, which the means and the best point leave out."""
  nan = float("nan")
  values = {
    "eval_loss": [1.0, 0.8, nan],
    "eval_accuracy": [0.5, 0.6, nan],
    "eval_per_class_accuracy": [[0.5, nan], [0.6, nan], [nan, nan]],
  }
  record = metrics.per_point(values, {"point": ["a", "b", "c"]})
  assert record["eval_accuracy"] == pytest.approx(0.55) and record["best_point"] == "b"
  assert record["eval_per_class_accuracy"][0] == pytest.approx(0.55)
