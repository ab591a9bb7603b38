"""Inception-v3's on-device preprocessing: crop windows inside the valid (unpadded) part of an
image, as TF's sample_distorted_bounding_box and central_crop draw them, and distort_color."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research import augment
from research.errors import UserError

# Valid (height, width): square, tall, and ImageNet's common 375 × 500 (and 500 × 375) scaled.
VALID_SIZES = [(120, 120), (120, 90), (75, 100), (100, 75), (36, 48)]


def _padded(valid_u8, side, fill):
  """`valid_u8` at the top-left of a side × side array, the rest filled with `fill`."""
  out = np.full((side, side, valid_u8.shape[-1]), fill, np.uint8)
  out[: valid_u8.shape[0], : valid_u8.shape[1]] = valid_u8
  return out


def _quiet_images(n, height, width, seed=0):
  """Random images with every value below 100, so a leaked 255 would stand out."""
  return np.random.default_rng(seed).integers(0, 100, (n, height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def windows():
  """2000 windows for each valid size, as {valid: (top, left, height, width)}."""
  sample = jax.jit(jax.vmap(augment.sample_crop_window, in_axes=(0, None)))
  keys = jax.random.split(jax.random.key(0), 2000)
  return {v: tuple(map(np.asarray, sample(keys, jnp.array(v, jnp.float32)))) for v in VALID_SIZES}


@pytest.mark.parametrize("valid", VALID_SIZES)
def test_crop_windows_are_whole_pixels_inside_the_valid_region(windows, valid):
  top, left, h, w = windows[valid]
  for x in (top, left, h, w):
    np.testing.assert_array_equal(x, np.round(x))
  assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
  assert (top + h <= valid[0]).all() and (left + w <= valid[1]).all()


@pytest.mark.parametrize("valid", VALID_SIZES)
def test_crop_windows_cover_the_area_and_aspect_ranges(windows, valid):
  _, _, h, w = windows[valid]
  whole = (h == valid[0]) & (w == valid[1])
  area = h * w / (valid[0] * valid[1])
  assert ((area >= 0.1) & (area <= 1.0) | whole).all()  # 0.1: min_object_covered > area_min
  # width = round(height × aspect), so width / height may miss the range by half a pixel.
  aspect = w / h
  assert ((aspect >= 3 / 4 - 0.5 / h) & (aspect <= 4 / 3 + 0.5 / h) | whole).all()
  assert area.min() < 0.15 and area.max() > 0.9  # the whole range is used
  assert aspect.min() < 0.8 and aspect.max() > 1.25
  assert whole.mean() < 0.02  # 100 attempts: the whole-image fallback is rare


def test_offsets_are_spread_over_the_free_room(windows):
  top, left, h, w = windows[(120, 90)]
  small = (h < 60) & (w < 45)
  assert (top[small] < 10).any() and (top[small] > 50).any()
  assert (left[small] < 5).any() and (left[small] > 35).any()


def test_constraints_no_attempt_can_meet_give_the_whole_valid_image():
  def sample(key):
    return augment.sample_crop_window(
      key, jnp.array([75.0, 100.0]), (0.05, 0.5), (0.75, 4 / 3), 0.9
    )

  top, left, h, w = map(
    np.asarray, jax.jit(jax.vmap(sample))(jax.random.split(jax.random.key(1), 50))
  )
  assert (top == 0).all() and (left == 0).all() and (h == 75).all() and (w == 100).all()


@pytest.mark.parametrize("spec", ["inception_crop(32)", "central_crop(32)"])
def test_padding_never_leaks_into_crops(spec):
  valid = [(64, 48), (48, 64), (30, 64), (64, 64), (20, 25)]
  images = np.stack(
    [_padded(_quiet_images(1, h, w, i)[0], 64, 255) for i, (h, w) in enumerate(valid)]
  )
  fn = jax.jit(augment.build(spec))
  for seed in range(5):
    out = np.asarray(fn(jax.random.key(seed), images, np.array(valid, np.int32)))
    assert out.shape == (5, 32, 32, 3)
    assert out.max() <= 99 / 255 + 1e-5  # bilinear weights stay inside the valid region


@pytest.mark.parametrize("spec", ["inception_crop(32)|flip_lr", "central_crop(40)"])
def test_a_padded_batch_gives_what_the_unpadded_batch_gives(spec):
  whole = _quiet_images(4, 45, 60)
  padded = np.stack([_padded(x, 72, 255) for x in whole])
  fn = jax.jit(augment.build(spec))
  sizes = np.full((4, 2), (45, 60), np.int32)
  np.testing.assert_allclose(
    fn(jax.random.key(2), padded, sizes), fn(jax.random.key(2), whole), atol=1e-5
  )


def test_central_crop_cuts_one_sixteenth_of_the_valid_image_from_each_side():
  image = np.full((80, 48, 3), 200, np.uint8)  # a 5 px (80/16) and 3 px (48/16) frame of 200
  image[5:75, 3:45] = 50
  padded = _padded(image, 96, 255)[None]
  out = jax.jit(augment.build("central_crop(24)"))(jax.random.key(0), padded, np.array([[80, 48]]))
  np.testing.assert_allclose(out, 50 / 255, atol=1e-6)  # neither the frame nor the padding


def test_central_crop_is_the_resized_central_window_as_tf_central_crop_cuts_it():
  image = _quiet_images(1, 50, 70)[0]  # tf.image.central_crop(0.875) keeps rows 3:47, cols 4:66
  padded = _padded(image, 80, 255)[None]
  out = jax.jit(augment.build("central_crop(30)"))(jax.random.key(0), padded, np.array([[50, 70]]))
  expected = jax.image.resize(image[3:47, 4:66] / 255.0, (30, 30, 3), "linear", antialias=True)
  np.testing.assert_allclose(out[0], expected, atol=1e-5)


def test_inception_distortions_keep_range_and_output_size():
  images = np.random.default_rng(0).integers(0, 256, (6, 70, 70, 3), dtype=np.uint8)
  sizes = np.array([[50, 70], [70, 50], [70, 70], [40, 53], [53, 40], [20, 70]], np.int32)
  out = jax.jit(augment.build("inception_crop(32)|flip_lr|color_distort"))(
    jax.random.key(1), images, sizes
  )
  assert out.shape == (6, 32, 32, 3)
  assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
  central = jax.jit(augment.build("central_crop(32)|scale(-1, 1)"))(
    jax.random.key(0), images, sizes
  )
  assert central.shape == (6, 32, 32, 3) and float(central.min()) >= -1.0


@pytest.mark.parametrize(
  "spec", ["flip_lr|inception_crop(32)", "central_crop(32)|central_crop(16)"]
)
def test_a_window_op_after_another_op_is_a_user_error(spec):
  with pytest.raises(UserError, match="must be first"):
    augment.build(spec)


def test_sizes_for_a_pipeline_without_a_window_op_is_a_user_error():
  with pytest.raises(UserError, match="window op"):
    augment.build("flip_lr")(jax.random.key(0), _quiet_images(2, 8, 8), np.full((2, 2), 6))


def _distort(image, seeds, **kwargs):
  """color_distort(**kwargs) of one float image with each seed: [len(seeds), H, W, C]."""
  op = augment.color_distort(**kwargs)
  keys = jax.vmap(jax.random.key)(jnp.asarray(seeds))
  return np.asarray(jax.jit(jax.vmap(op, in_axes=(0, None)))(keys, jnp.asarray(image, jnp.float32)))


def test_colour_distortion_output_stays_in_unit_range():
  image = np.random.default_rng(0).random((16, 16, 3))
  out = _distort(image, range(200))
  assert out.min() >= 0.0 and out.max() <= 1.0
  assert out.min() == 0.0 or out.max() == 1.0  # strong draws reach the clip


def test_brightness_shifts_every_pixel_by_one_offset_within_32_of_255():
  image = np.random.default_rng(0).uniform(0.3, 0.7, (8, 8, 3))  # no draw reaches the clip
  shift = _distort(image, range(300), saturation=0.0, hue=0.0, contrast=0.0) - image
  per_image = shift.mean(axis=(1, 2, 3))
  np.testing.assert_allclose(shift, per_image[:, None, None, None] * np.ones_like(shift), atol=1e-5)
  assert np.abs(per_image).max() <= 32 / 255 + 1e-6
  assert per_image.min() < -28 / 255 and per_image.max() > 28 / 255


def test_values_pushed_past_1_are_clipped_once_at_the_end_not_between_stages():
  # Grey pixels: saturation and hue leave them alone, so a draw maps each pixel x to
  # clip(a·x + b): brightness, then contrast by a about the mean. Two mid-grey probes that no
  # stage takes out of [0, 1] give a and b.
  image = np.full((4, 4, 3), 0.45)
  image[:, 1] = 0.55
  image[:, 2:] = 0.97
  out = _distort(image, range(400))[:, 0, :, 0]  # [draws, column]
  a = (out[:, 1] - out[:, 0]) / 0.1
  b = out[:, 0] - a * 0.45
  np.testing.assert_allclose(out[:, 2], np.clip(a * 0.97 + b, 0, 1), atol=1e-4)
  # The case happens: brightness took 0.97 past 1 and contrast brought it back below 1, where
  # clipping after brightness would have given clip(a + b) instead.
  brightness = b - (1 - a) * image.mean()  # contrast keeps the mean: b = (1 - a)·mean + delta
  assert ((0.97 + brightness > 1.01) & (a + b < 1 - 1e-3)).sum() > 20


def test_both_orders_of_distort_color_occur():
  # Contrast above 1.25 pushes the blue of (0.9, 0.5, 0.1) below 0. Contrast last: the final
  # clip gives (., 0.5, 0). Saturation after contrast: its clamp to 1 lifts the minimum to 0 by
  # shrinking the chroma, which also lifts green above 0.5. Each happens in 1/8 of the draws.
  image = np.zeros((2, 2, 3))
  image[0], image[1] = (0.9, 0.5, 0.1), (0.1, 0.5, 0.9)
  out = _distort(image, range(400), brightness=0.0, saturation=0.0, hue=0.0)[:, 0, 0]
  contrast_last = (out[:, 2] == 0) & np.isclose(out[:, 1], 0.5, atol=1e-5)
  saturation_after_contrast = out[:, 1] > 0.5 + 1e-3
  assert 25 < contrast_last.sum() < 100 and 25 < saturation_after_contrast.sum() < 100
