"""The conv2d scaling experiment: right answers on 1..8 devices, its outputs, its user errors."""

import csv

import pytest

from research import configuration
from research.errors import UserError
from research.experiments import conv2d_scaling

CONFIG = "configs/conv2d_scaling.py"


def smoke(**fields):
  """The :smoke config with `fields` changed."""
  config = configuration.load(f"{CONFIG}:smoke")
  config.update(fields)
  return config


def test_default_config_is_the_writeups_workload():
  c = configuration.load(CONFIG)
  workload = (c.num_images, c.image_size, c.in_channels, c.out_channels, c.filter_size)
  assert workload == (840, 100, 1, 1, 3)
  assert (c.filter_init, c.padding, c.dtype, c.mode) == ("ones", "SAME", "float32", "strong")
  assert c.device_counts == ()  # 1, 2, ..., every local device


def test_results_equal_scipy_on_1_to_8_devices(tmp_path):
  rows = conv2d_scaling.run(smoke(), str(tmp_path))  # 20 images: padded for 3, 6, 7, 8
  assert [r["n_devices"] for r in rows] == list(range(1, 9))
  assert all(r["max_abs_err"] < 1e-5 for r in rows)


def test_image_count_not_divisible_by_devices_is_padded_and_the_padding_dropped(tmp_path):
  (row,) = conv2d_scaling.run(smoke(num_images=13, device_counts=(8,)), str(tmp_path))
  assert (row["n_images"], row["per_device_images"]) == (13, 2)
  assert row["max_abs_err"] < 1e-5  # the 13 results match scipy's 13, nothing shifted


@pytest.mark.parametrize(
  "fields, tolerance",
  [
    (dict(filter_size=4, padding="SAME"), 1e-5),  # even filter: XLA and scipy centre it alike
    (dict(filter_size=5, padding="VALID"), 1e-5),
    (dict(in_channels=2, out_channels=3), 1e-5),  # scipy sums over channel pairs
    # :big_filter,channels with the default filter of ones: sums of 1,000 products, up to
    # ~500, where float32 rounding leaves errors of ~2e-4
    (dict(filter_init="ones", filter_size=10, in_channels=10, out_channels=10), 1e-3),
  ],
  ids=["even_filter_same", "valid", "channels", "big_filter_channels_of_ones"],
)
def test_other_filters_and_channels_match_scipy_correlation(tmp_path, fields, tolerance):
  rows = conv2d_scaling.run(smoke(device_counts=(1, 3), **fields), str(tmp_path))
  assert all(r["max_abs_err"] < tolerance for r in rows)


def test_bfloat16_results_are_close_to_scipy(tmp_path):
  (row,) = conv2d_scaling.run(smoke(dtype="bfloat16", device_counts=(2,)), str(tmp_path))
  assert row["max_abs_err"] < 0.1  # bf16 keeps 8 bits of mantissa; outputs are ~1-5


def test_strong_scaling_splits_the_images_over_the_devices(tmp_path):
  rows = conv2d_scaling.run(smoke(mode="strong", device_counts=(1, 2, 4)), str(tmp_path))
  assert [(r["n_images"], r["per_device_images"]) for r in rows] == [(20, 20), (20, 10), (20, 5)]


def test_weak_scaling_gives_every_device_num_images(tmp_path):
  rows = conv2d_scaling.run(smoke(mode="weak", device_counts=(1, 2, 4)), str(tmp_path))
  assert [(r["n_images"], r["per_device_images"]) for r in rows] == [(20, 20), (40, 20), (80, 20)]
  assert all(r["max_abs_err"] < 1e-5 for r in rows)


def test_speedup_and_efficiency_are_relative_to_the_fewest_devices(tmp_path):
  rows = conv2d_scaling.run(smoke(device_counts=(2, 4)), str(tmp_path))
  assert rows[0]["speedup"] == rows[0]["efficiency"] == rows[0]["cold_speedup"] == 1.0
  assert rows[1]["efficiency"] == pytest.approx(rows[1]["speedup"] / 2)


def test_csv_has_one_row_per_device_count_with_every_column(tmp_path):
  conv2d_scaling.run(smoke(device_counts=(1, 3, 8)), str(tmp_path))
  with open(tmp_path / "conv2d_scaling.csv") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["n_devices"]) for r in rows] == [1, 3, 8]
  assert list(rows[0]) == conv2d_scaling.COLUMNS
  for name in ("compile_s", "h2d_s", "compute_s", "d2h_s", "cold_total_s", "scipy_s"):
    assert all(float(r[name]) > 0 for r in rows), name


def test_png_is_written(tmp_path):
  conv2d_scaling.run(smoke(device_counts=(1, 2)), str(tmp_path))
  assert (tmp_path / "conv2d_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_scipy_baseline_the_scipy_columns_are_empty(tmp_path):
  rows = conv2d_scaling.run(smoke(scipy_baseline=False, device_counts=(1,)), str(tmp_path))
  assert rows[0]["scipy_s"] is None and rows[0]["max_abs_err"] is None


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(num_images=0), "num_images=0 must be a whole number of 1 or more"),
    (dict(image_size=-5), "image_size=-5 must be a whole number of 1 or more"),
    (dict(in_channels=0), "in_channels=0 must be a whole number of 1 or more"),
    (dict(out_channels=-1), "out_channels=-1 must be a whole number of 1 or more"),
    (dict(filter_size=0), "filter_size=0 must be a whole number of 1 or more"),
    (dict(repeats=0), "repeats=0 must be a whole number of 1 or more"),
    (dict(filter_size=20, padding="VALID"), "filter_size=20 is larger than image_size=16"),
    (dict(device_counts=(1, 16)), r"asks for 16 devices but jax.local_device_count\(\) is 8"),
    (dict(device_counts=(0, 2)), r"device_counts=\(0, 2\) must hold positive"),
    (dict(mode="medium"), "mode='medium' is unknown; use one of strong, weak"),
    (dict(dtype="float64"), "dtype='float64' is unknown; use one of float32"),
    (dict(padding="FULL"), "padding='FULL' is unknown; use one of SAME, VALID"),
    (dict(filter_init="zeros"), "filter_init='zeros' is unknown"),
  ],
  ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_bad_input_is_a_user_error_raised_before_anything_runs(
  tmp_path, monkeypatch, fields, message
):
  monkeypatch.setattr(conv2d_scaling, "measure", lambda *a: pytest.fail("measured bad input"))
  with pytest.raises(UserError, match=message):
    conv2d_scaling.run(smoke(**fields), str(tmp_path))
  assert not list(tmp_path.iterdir())


def test_unknown_variant_lists_the_variants():
  with pytest.raises(UserError, match="unknown config variant 'huge'.*big_filter.*channels"):
    configuration.load(f"{CONFIG}:huge")


def test_the_process_is_warmed_once_before_any_device_count_is_timed(tmp_path, monkeypatch):
  calls = []
  timed = conv2d_scaling.time_cold

  def recording(images, kernel, padding, devices):
    calls.append(len(devices))
    return timed(images, kernel, padding, devices)

  monkeypatch.setattr(conv2d_scaling, "time_cold", recording)
  rows = conv2d_scaling.run(smoke(device_counts=(1, 2)), str(tmp_path))
  # One untimed call on every device first, then one timed call per measured count: the first
  # count's cold time no longer carries the process's first compile and first transfer.
  assert calls == [8, 1, 2] and [r["n_devices"] for r in rows] == [1, 2]
