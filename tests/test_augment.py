"""On-device augmentation ops: shapes, ranges, geometry, per-device randomness, determinism."""

import functools

import jax
import numpy as np
import pytest

from research import augment
from research.errors import UserError
from research.steps import AXIS


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
  out = augment.build("brightness(0.5)|contrast(0.2, 3.0)")(jax.random.key(0), _images())
  assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_standardize_gives_zero_mean_unit_std_per_image():
  out = np.asarray(augment.build("standardize")(jax.random.key(0), _images()))
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


def test_each_device_draws_its_own_augmentation():
  fn = augment.build("crop(4)|flip_lr")

  def per_device(rng, images):
    return fn(jax.random.fold_in(rng, jax.lax.axis_index(AXIS)), images)

  same_images = np.broadcast_to(_images(4), (8, 4, 32, 32, 3))
  rngs = jax.random.wrap_key_data(np.broadcast_to(jax.random.key_data(jax.random.key(0)), (8, 2)))
  out = np.asarray(jax.pmap(functools.partial(per_device), axis_name=AXIS)(rngs, same_images))
  assert len({out[d].tobytes() for d in range(8)}) == 8


@pytest.mark.parametrize("spec", ["crop(4)|rotate(10)", "crop(four)", "crop(1, 2, 3, 4)"])
def test_bad_pipeline_is_a_user_error(spec):
  with pytest.raises(UserError, match="augmentation op"):
    augment.build(spec)
