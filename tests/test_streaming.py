"""The streamed (ImageNet-style) input: sharding, epochs, fixed sizes, prefetch, input wait."""

import json

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from research import augment, configuration
from research.data import streaming
from research.train import train_and_evaluate


def test_each_example_once_per_epoch_in_a_new_order_each_epoch():
  ds = streaming.process_share(list(range(48)), seed=3, shuffle=True).repeat(None)
  first, second = [ds[i] for i in range(48)], [ds[i] for i in range(48, 96)]
  assert sorted(first) == sorted(second) == list(range(48))
  assert first != second


def test_mock_imagenet_batches_are_fixed_size_uint8_and_land_sharded_on_devices():
  with tfds.testing.mock_data(num_examples=24):
    source = streaming.open_source("imagenet2012", "train", "")
    ds = streaming.process_share(source, seed=0, shuffle=True)
    batches = list(streaming.batch_stream(ds, batch=8, start=0, workers=0, size=40))
  assert len(batches) == 3  # 24 examples / 8, once
  for batch in batches:
    assert batch["image"].shape == (8, 40, 40, 3) and batch["image"].dtype == np.uint8
    assert batch["label"].shape == (8,)
  images, labels = next(streaming.prefetch_to_devices(iter(batches), depth=2))
  assert images.shape == (8, 1, 40, 40, 3)  # [devices, per_device_batch, ...]
  assert len(images.sharding.device_set) == 8


def test_eval_stream_covers_the_split_once_with_padding_masked():
  with tfds.testing.mock_data(num_examples=21):
    source = streaming.open_source("imagenet2012", "validation", "")
    batches = list(streaming.eval_batches(source, per_process_batch=8, workers=0, size=32))
  assert len(batches) == 3
  assert sum(b["mask"].sum() for b in batches) == 21


def test_not_prepared_dataset_is_a_clear_error(tmp_path):
  with pytest.raises(Exception, match="not prepared.*tfds build imagenet2012"):
    streaming.open_source("imagenet2012", "train", str(tmp_path))


def test_inception_crop_windows_stay_inside_and_within_area_and_aspect_ranges():
  sample = jax.jit(
    jax.vmap(lambda k: augment.sample_crop_window(k, 120, 90, (0.05, 1.0), (3 / 4, 4 / 3), 10))
  )
  top, left, h, w = map(np.asarray, sample(jax.random.split(jax.random.key(0), 2000)))
  assert (top >= 0).all() and (left >= 0).all()
  assert (top + h <= 120 + 1e-3).all() and (left + w <= 90 + 1e-3).all()
  whole = np.isclose(h, 120) & np.isclose(w, 90)  # the fallback when no candidate fits
  area, aspect = h * w / (120 * 90), w / h
  assert ((area >= 0.05 - 1e-4) & (area <= 1.0 + 1e-4) | whole).all()
  assert ((aspect >= 0.75 - 1e-4) & (aspect <= 4 / 3 + 1e-4) | whole).all()
  assert whole.mean() < 0.05 and area.min() < 0.1 and area.max() > 0.9  # ranges are used


def test_inception_distortions_keep_range_and_output_size():
  images = np.random.default_rng(0).integers(0, 256, (6, 50, 70, 3), dtype=np.uint8)
  out = augment.build("inception_crop(32)|flip_lr|color_distort")(jax.random.key(1), images)
  assert out.shape == (6, 32, 32, 3)
  assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
  central = augment.build("central_crop(32)|scale(-1, 1)")(jax.random.key(0), images)
  assert central.shape == (6, 32, 32, 3) and float(central.min()) >= -1.0


def _streamed_config(**overrides):
  config = configuration.load("configs/cifar_vgg.py:smoke")  # tiny VGG: fast to compile
  config.update(
    dataset="imagenet2012",
    host_image_size=40,
    data_workers=0,
    prefetch=2,
    augment="inception_crop(32)|flip_lr|color_distort|scale(-1, 1)",
    eval_preprocess="central_crop(32)|scale(-1, 1)",
    batch_size=16,
    eval_batch_size=16,
    num_train_steps=12,
    log_every_steps=4,
  )
  config.model.num_classes = 1000
  config.update(overrides)
  return config


def _waits(workdir):
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r["input_wait_fraction"] for r in records if "loss" in r][1:]  # after step 1


def test_streamed_training_runs_end_to_end_and_evaluates_the_whole_split(tmp_path):
  with tfds.testing.mock_data(num_examples=40):
    final = train_and_evaluate(_streamed_config(), str(tmp_path))
  assert final["eval_examples"] == 40
  assert (tmp_path / "augmented_batch.png").exists()


def _burn_cpu(seconds):
  """Stands in for an expensive JPEG decode (CPU work, not a sleep)."""
  import time

  end = time.perf_counter() + seconds
  while time.perf_counter() < end:
    pass


def test_slow_input_makes_input_wait_high_and_fast_input_keeps_it_low(tmp_path, monkeypatch):
  with tfds.testing.mock_data(num_examples=40):
    train_and_evaluate(_streamed_config(), str(tmp_path / "fast"))
    decode = streaming.decode
    monkeypatch.setattr(streaming, "decode", lambda r, size: (_burn_cpu(0.03), decode(r, size))[1])
    train_and_evaluate(_streamed_config(), str(tmp_path / "slow"))
  fast, slow = _waits(tmp_path / "fast"), _waits(tmp_path / "slow")
  assert max(slow) > 0.5, slow  # 16 images × 30 ms of decoding per step dominate
  assert min(slow) > max(fast), (slow, fast)
