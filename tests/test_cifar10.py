"""CIFAR-10 readers on small data written in the official formats."""

import tarfile

import numpy as np
import pytest
import tensorflow_datasets as tfds

from research import configuration
from research import data as data_lib
from research.data import cifar10
from research.errors import UserError


def _expected(arrays, names):
  return (
    np.concatenate([arrays[n][0] for n in names]),
    np.concatenate([arrays[n][1] for n in names]),
  )


def test_reads_the_official_tar_gz(cifar_archive):
  path, arrays = cifar_archive
  data = cifar10.load_from(str(path))
  train_images, train_labels = _expected(arrays, cifar10.TRAIN_FILES)
  np.testing.assert_array_equal(data.train_images, train_images)
  np.testing.assert_array_equal(data.train_labels, train_labels)
  np.testing.assert_array_equal(data.test_images, arrays["test_batch"][0])
  assert data.train_images.shape == (35, 32, 32, 3) and data.train_images.dtype == np.uint8
  assert data.name == "cifar10" and data.num_classes == 10


@pytest.mark.parametrize("point_at", ["batches_dir", "its_parent"])
def test_reads_the_extracted_batches_directory(cifar_archive, tmp_path, point_at):
  path, arrays = cifar_archive
  with tarfile.open(path) as tar:
    tar.extractall(tmp_path / "extracted", filter="data")
  root = tmp_path / "extracted"
  data = cifar10.load_from(str(root / "cifar-10-batches-py" if point_at == "batches_dir" else root))
  np.testing.assert_array_equal(data.test_labels, arrays["test_batch"][1])
  assert len(data.train_labels) == 35


def test_truncated_archive_is_a_clear_error(cifar_archive, tmp_path):
  path, _ = cifar_archive
  truncated = tmp_path / "truncated.tar.gz"
  truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(UserError, match="corrupt or truncated"):
    cifar10.load_from(str(truncated))


def test_garbage_file_is_a_clear_error(tmp_path):
  garbage = tmp_path / "cifar-10-python.tar.gz"
  garbage.write_bytes(b"not a tarball" * 100)
  with pytest.raises(UserError, match="corrupt or truncated"):
    cifar10.load_from(str(garbage))


def test_missing_data_dir_names_the_ways_to_supply_data(tmp_path):
  with pytest.raises(UserError, match="does not exist.*cifar-10-python.tar.gz"):
    cifar10.load_from(str(tmp_path / "nowhere"))


def test_reads_a_prepared_tfds_dataset_through_data_source(tmp_path):
  (tmp_path / "cifar10").mkdir()  # what a prepared TFDS data dir looks like from outside
  with tfds.testing.mock_data(num_examples=12):
    data = cifar10.load_from(str(tmp_path))
  assert data.train_images.shape == (12, 32, 32, 3) and data.train_images.dtype == np.uint8
  assert data.test_labels.shape == (12,) and data.source.startswith("tfds:")


def test_download_failure_is_reported_as_not_available(tmp_path, monkeypatch):
  monkeypatch.setattr(cifar10, "CACHE", tmp_path)
  monkeypatch.setattr(cifar10, "URL", "file:///nonexistent/cifar-10-python.tar.gz")
  with pytest.raises(cifar10.NotAvailable, match="download failed"):
    cifar10.load_cached()
  assert not list(tmp_path.iterdir())  # no partial file left behind


@pytest.mark.end_to_end
def test_without_cifar10_the_default_config_trains_on_synthetic_data_and_says_why(
  tmp_path, monkeypatch
):
  monkeypatch.setattr(cifar10, "CACHE", tmp_path / "cache")
  monkeypatch.setattr(cifar10, "URL", "file:///nonexistent/cifar-10-python.tar.gz")
  monkeypatch.setenv("HOME", str(tmp_path))  # no ~/tensorflow_datasets either
  config = configuration.load("configs/cifar_vgg.py")  # dataset=cifar10, data_fallback=True
  data = data_lib.load(config)
  assert data.name == "synthetic" and len(data.train_labels) == 50_000
  assert "download failed" in data.fallback_reason
  assert (
    "To train on CIFAR-10:" in data.fallback_reason and "--config.data_dir" in data.fallback_reason
  )


def _tfrecord_preparation(root):
  version = root / "cifar10" / "3.0.2"
  version.mkdir(parents=True)
  (version / "cifar10-train.tfrecord-00000-of-00001").write_bytes(b"not readable without TF")
  return root


def test_a_tfds_dir_of_tfrecord_files_says_how_to_re_prepare(tmp_path):
  root = _tfrecord_preparation(tmp_path / "tfds")
  with pytest.raises(UserError, match="no array_record files .*tfds build cifar10"):
    cifar10.load_from(str(root))


def test_a_tfrecord_cifar10_in_home_is_passed_over_for_the_cached_archive(
  cifar_archive, tmp_path, monkeypatch
):
  path, arrays = cifar_archive
  monkeypatch.setenv("HOME", str(tmp_path))
  _tfrecord_preparation(tmp_path / "tensorflow_datasets")
  monkeypatch.setattr(cifar10, "CACHE", path.parent)
  np.testing.assert_array_equal(cifar10.load_cached().test_labels, arrays["test_batch"][1])
