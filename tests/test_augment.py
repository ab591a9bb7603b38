"""On-device augmentation ops: shapes, ranges, geometry, per-device randomness, determinism."""

import jax
import numpy as np
import pytest

from research import augment, configuration, sweep, train
from research import inputs as inputs_lib
from research.data import ImageDataset
from research.errors import UserError


def _images(n=16, size=32):
  return np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _one(op, rng, image):
  return np.asarray(op(rng, np.asarray(image, np.float32) / 255.0))


@pytest.mark.parametrize(
  "spec",
  ["crop(4)|flip_lr|standardize", "shift(0.1)|flip_lr", "brightness(0.25)|contrast(0.2, 1.8)", ""],
)
def test_pipelines_keep_shape_and_return_float32(spec):
  out = jax.jit(augment.build(spec))(jax.random.key(0), _images())
  assert out.shape == (16, 32, 32, 3) and out.dtype == np.float32


def test_colour_ops_stay_in_unit_range():
  out = jax.jit(augment.build("brightness(0.5)|contrast(0.2, 3.0)"))(jax.random.key(0), _images())
  assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_standardize_gives_zero_mean_unit_std_per_image():
  out = np.asarray(jax.jit(augment.build("standardize"))(jax.random.key(0), _images()))
  np.testing.assert_allclose(out.mean(axis=(1, 2, 3)), 0.0, atol=1e-5)
  np.testing.assert_allclose(out.std(axis=(1, 2, 3)), 1.0, atol=1e-4)


def test_flip_really_mirrors_or_keeps_the_image():
  image = _images(1)[0]
  flipped = 0
  for seed in range(20):
    out = _one(augment.flip_lr(), jax.random.key(seed), image)
    same, mirrored = np.allclose(out, image / 255.0), np.allclose(out, image[:, ::-1] / 255.0)
    assert same or mirrored
    flipped += mirrored
  assert 0 < flipped < 20  # both outcomes happen


def test_crop_is_a_shifted_window_of_the_zero_padded_image():
  image = _images(1)[0]
  padded = np.pad(image / 255.0, ((4, 4), (4, 4), (0, 0)))
  for seed in range(10):
    out = _one(augment.crop(4), jax.random.key(seed), image)
    windows = [padded[dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)]
    assert any(np.allclose(out, w) for w in windows)


def test_shift_repeats_edge_pixels_instead_of_black():
  image = np.full((32, 32, 3), 200, np.uint8)
  for seed in range(5):
    out = _one(augment.shift(0.1), jax.random.key(seed), image)
    np.testing.assert_allclose(out, 200 / 255.0, rtol=1e-6)


def test_same_seed_same_result_different_seed_different():
  fn = augment.build("crop(4)|flip_lr|brightness(0.2)")
  a, b = fn(jax.random.key(3), _images()), fn(jax.random.key(3), _images())
  c = fn(jax.random.key(4), _images())
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def _preview_of_identical_shards(seed):
  """What training's augmentation makes of the same 8 images on each of 8 devices."""
  config = configuration.load("configs/cifar_vgg.py:smoke")
  config.update(batch_size=64, eval_batch_size=64, augment="crop(4)|flip_lr")
  images = np.tile(_images(8), (8, 1, 1, 1))  # device d's shard is images 8d..8d+7: all alike
  labels = np.tile(np.arange(8, dtype=np.int32), 8)
  data = ImageDataset("same", "test", images, labels, images, labels, num_classes=10)
  keys = jax.random.split(jax.random.key(seed), 2)
  preprocess, pipeline = augment.build(config.eval_preprocess), augment.build(config.augment)
  runs = sweep.runs_of(config)
  inputs = inputs_lib.resident(config, runs, data, 8, preprocess, keys[0], keys[1])
  preview = lambda step: train.augmented_preview(
    inputs.gather, pipeline, step, next(inputs.batches(step))
  )
  return lambda step: preview(step).reshape(4, 8, 32, 32, 3)  # first 4 devices


def test_devices_of_one_step_draw_different_crops_and_a_seed_and_step_draw_the_same():
  preview = _preview_of_identical_shards(seed=0)
  step_3 = preview(3)
  assert len({device.tobytes() for device in step_3}) == 4  # same images, other crops
  np.testing.assert_array_equal(preview(3), step_3)
  np.testing.assert_array_equal(_preview_of_identical_shards(seed=0)(3), step_3)
  assert not np.array_equal(preview(4), step_3)


@pytest.mark.parametrize("spec", ["crop(4)|rotate(10)", "crop(four)", "crop(1, 2, 3, 4)"])
def test_bad_pipeline_is_a_user_error(spec):
  with pytest.raises(UserError, match="augmentation op"):
    augment.build(spec)


def _mixed(spec: str, n=8):
  """(images [n, 32, 32, 3], the pipeline's output images and targets) for one-hot targets of
  n different classes, so each output target says how much of which example it holds."""
  images = _images(n)
  targets = np.eye(n, dtype=np.float32)
  out, mixed = jax.jit(augment.build(spec))(jax.random.key(0), images, targets=targets)
  return images.astype(np.float32) / 255.0, np.asarray(out), np.asarray(mixed)


def test_mixup_mixes_each_label_with_the_weights_of_its_pixels():
  images, out, mixed = _mixed("mixup(0.4)")
  for i in range(len(images)):
    partner = i ^ 1  # neighbours in the (randomly ordered) batch
    lam = mixed[i, i]
    assert 0 < lam < 1 and lam + mixed[i, partner] == pytest.approx(1)
    np.testing.assert_allclose(out[i], lam * images[i] + (1 - lam) * images[partner], atol=1e-6)
  assert len(set(np.round(np.diag(mixed), 6))) == len(images)  # a weight per example


def test_cutmix_takes_a_box_from_the_neighbour_and_its_label_by_the_box_s_share():
  _, out, mixed = _mixed("flip_lr|cutmix(1.0)")
  _, flipped, _ = _mixed("flip_lr")  # the same keys: the images cutmix saw
  for i in range(len(flipped)):
    partner = i ^ 1
    from_partner = np.all(out[i] == flipped[partner], axis=-1) & np.any(
      out[i] != flipped[i], axis=-1
    )
    own = np.all(out[i] == flipped[i], axis=-1)
    assert np.all(from_partner | own)  # every pixel is the image's own or its neighbour's
    rows, cols = np.nonzero(from_partner)
    if rows.size:  # a box: every pixel between its corners comes from the neighbour
      box = (slice(rows.min(), rows.max() + 1), slice(cols.min(), cols.max() + 1))
      assert np.all(out[i][box] == flipped[partner][box])
    taken = mixed[i, partner]
    assert taken == pytest.approx(np.mean(~own | from_partner), abs=1 / 1024)
    assert mixed[i, i] == pytest.approx(1 - taken)


@pytest.mark.parametrize(
  "spec, message",
  [
    ("mixup(0.2)|flip_lr", "comes after an op that mixes examples"),
    ("mixup(0)", "alpha must be > 0"),
  ],
)
def test_a_misplaced_or_bad_batch_op_is_a_user_error(spec, message):
  with pytest.raises(UserError, match=message):
    augment.build(spec)


def test_colour_jitter_shifts_then_scales_each_example_within_its_ranges():
  """hiverge's jitter on normalized values: (x + b)·c, one b in ±0.14 and one c in 1 ± 0.13 per
  example, unclipped."""
  images = np.zeros((64, 4, 4, 3), np.uint8)
  images[:, 0, 0] = 255  # one bright pixel: two values give each example's b and c
  out = np.asarray(jax.jit(augment.build("color_jitter(0.14, 0.13)"))(jax.random.key(0), images))
  bc = out[:, 1, 1, 0]  # (0 + b)·c
  c = out[:, 0, 0, 0] - bc  # (1 + b)·c - b·c
  assert np.all(np.abs(c - 1) <= 0.13 + 1e-6) and np.all(np.abs(bc / c) <= 0.14 + 1e-6)
  assert np.std(c) > 0.05 and np.std(bc / c) > 0.05  # drawn per example
  dark = np.broadcast_to(bc[:, None, None, None], out[:, 1:].shape)  # every other pixel
  np.testing.assert_allclose(out[:, 1:], dark, rtol=1e-6)
