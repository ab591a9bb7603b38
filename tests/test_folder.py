"""Image folders as datasets: layout, class order, real JPEGs, caching, bad files, streaming."""

import io
import json
import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from research import configuration
from research.data import cifar10, folder
from research.errors import UserError
from research.train import train_and_evaluate

SLICE = Path(__file__).parent / "data" / "cifar10_slice"  # 16 train + 8 test real JPEGs per class
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
  monkeypatch.setattr(folder, "CACHE", tmp_path / "cache")


@pytest.fixture
def real_slice(tmp_path):
  """A writable copy of the committed real CIFAR-10 slice."""
  return Path(shutil.copytree(SLICE, tmp_path / "cifar10"))


def _write(path: Path, image: Image.Image, **kwargs):
  path.parent.mkdir(parents=True, exist_ok=True)
  image.save(path, **kwargs)


def test_classes_are_the_sorted_train_directories_and_files_sorted_within():
  data = folder.scan(str(SLICE))
  assert data.classes == CLASSES and data.eval.name == "test"
  assert len(data.train.paths) == 160 and len(data.eval.paths) == 80
  assert data.train.paths[16] == b"train/automobile/0000.jpg" and data.train.labels[16] == 1
  assert (np.diff(data.train.labels) >= 0).all()


@pytest.mark.parametrize(
  "layout, message",
  [
    ([], "does not exist"),
    ([""], "is a file, not a directory"),  # the root itself: an archive, say
    (["x/a/1.png"], "has no train/ directory"),
    (["train/a/1.png"], "has no val/, validation/ or test/"),
    (["train/a/1.png", "val/b/1.png"], "classes that train/ lacks: b"),
    (["train/a/notes.txt", "val/a/1.png"], "holds no image files"),
    (["train/a/1.png", "validation/a/README"], "holds no image files"),
  ],
)
def test_bad_layouts_are_one_line_errors(tmp_path, layout, message):
  root = tmp_path / "data"
  for rel in layout:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(b"")
  with pytest.raises(UserError, match=message) as e:
    folder.scan(str(root))
  assert "\n" not in str(e.value)


def test_grayscale_cmyk_palette_and_png_files_become_rgb(tmp_path):
  rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), np.uint8)
  _write(tmp_path / "gray.png", Image.fromarray(rgb[..., 0]))
  _write(tmp_path / "cmyk.jpg", Image.fromarray(rgb).convert("CMYK"), quality=95)
  _write(tmp_path / "palette.png", Image.fromarray(rgb).convert("P"))
  for name in ("gray.png", "cmyk.jpg", "palette.png"):
    image = folder.read_rgb(str(tmp_path / name))
    assert image.shape == (20, 30, 3) and image.dtype == np.uint8, name
  gray = folder.read_rgb(str(tmp_path / "gray.png"))
  assert (gray[..., 0] == rgb[..., 0]).all() and (gray[..., 1] == gray[..., 2]).all()


def _official_archive(path: Path, data: folder.Folder):
  """A cifar-10-python.tar.gz holding the folder's pixels, in the official pickle format."""
  decode = lambda split: np.stack([folder.read_rgb(str(data.root / p.decode())) for p in split])
  train, test = decode(data.train.paths), decode(data.eval.paths)
  parts = np.array_split(np.arange(len(train)), 5)
  batches = [(f"data_batch_{i + 1}", train[p], data.train.labels[p]) for i, p in enumerate(parts)]
  batches.append(("test_batch", test, data.eval.labels))
  with tarfile.open(path, "w:gz") as tar:
    for name, images, labels in batches:
      raw = pickle.dumps(
        {b"data": images.transpose(0, 3, 1, 2).reshape(len(images), -1), b"labels": list(labels)},
        protocol=2,
      )
      info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
      info.size = len(raw)
      tar.addfile(info, io.BytesIO(raw))


def test_real_cifar_folder_gives_the_same_arrays_as_an_archive_of_the_same_pixels(tmp_path):
  data = folder.scan(str(SLICE))
  _official_archive(tmp_path / "cifar-10-python.tar.gz", data)
  archive = cifar10.load_from(str(tmp_path / "cifar-10-python.tar.gz"))
  from_folder = folder.load_resident(data, skip_bad=False)
  for field in ("train_images", "train_labels", "test_images", "test_labels"):
    np.testing.assert_array_equal(getattr(from_folder, field), getattr(archive, field))
  assert from_folder.train_images.shape == (160, 32, 32, 3) and from_folder.num_classes == 10


def test_decoded_folder_is_cached_and_a_changed_file_list_decodes_again(real_slice, monkeypatch):
  first = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False)
  assert len(list(folder.CACHE.glob("folder-*.npz"))) == 1
  with monkeypatch.context() as m:
    m.setattr(folder, "_decode_split", None)  # a cache hit decodes nothing
    again = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False)
  np.testing.assert_array_equal(first.train_images, again.train_images)
  (real_slice / "train" / "cat" / "0000.jpg").unlink()
  fewer = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False)
  assert len(fewer.train_labels) == 159 and len(list(folder.CACHE.glob("folder-*.npz"))) == 2


def test_a_decode_that_finishes_while_another_writes_the_cache_leaves_both_whole(
  real_slice, monkeypatch
):
  """Processes of a multi-process run decode a new folder side by side: here a second one
  decodes and caches it from start to end while the first writes its cache file."""
  savez, others = np.savez, []

  def savez_while_another_process_decodes(file, **arrays):
    savez(file, **arrays)
    if not others:  # the first write only; the other process's own write is plain
      others.append(None)
      others[0] = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False)

  monkeypatch.setattr(np, "savez", savez_while_another_process_decodes)
  first = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False)
  (cache,) = folder.CACHE.iterdir()  # one whole file, no partial one left behind
  with np.load(cache) as whole:
    for data in (first, others[0]):
      np.testing.assert_array_equal(whole["train_images"], data.train_images)


def test_undecodable_file_is_an_error_naming_it_or_skipped_and_counted(real_slice):
  bad = real_slice / "train" / "dog" / "broken.jpg"
  bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
  with pytest.raises(UserError, match=r"cannot decode .*broken\.jpg.*skip_bad_images"):
    folder.load_resident(folder.scan(str(real_slice)), skip_bad=False)
  data = folder.load_resident(folder.scan(str(real_slice)), skip_bad=True)
  assert data.skipped_files == [str(bad)] and len(data.train_labels) == 160


def test_streamed_items_keep_the_aspect_ratio_and_replace_bad_files_by_the_next(tmp_path):
  rgb = np.random.default_rng(0).integers(0, 256, (150, 200, 3), np.uint8)
  _write(tmp_path / "train" / "a" / "0.jpg", Image.fromarray(rgb), quality=90)
  (tmp_path / "train" / "a" / "1.jpg").write_bytes(b"truncated")
  _write(tmp_path / "train" / "b" / "2.png", Image.fromarray(rgb[:40, :20]))
  _write(tmp_path / "val" / "a" / "0.png", Image.fromarray(rgb))
  data = folder.scan(str(tmp_path))
  strict = folder.FileImages(data.root, data.train, 64, skip_bad=False)
  item = strict[0]
  assert item["image"].shape == (64, 64, 3) and item["size"].tolist() == [48, 64]
  assert (item["image"][48:] == item["image"][47]).all()  # edge-padded below the image
  with pytest.raises(UserError, match=r"cannot decode .*1\.jpg"):
    strict[1]
  skipping = folder.FileImages(data.root, data.train, 64, skip_bad=True)
  item = skipping[1]
  assert item["skipped"] == 1 and item["label"] == 1 and item["size"].tolist() == [64, 32]


def test_draft_decode_matches_a_full_decode_and_resize(tmp_path):
  coarse = np.random.default_rng(0).integers(0, 256, (15, 20, 3), np.uint8)
  photo = Image.fromarray(coarse).resize((500, 375), Image.BICUBIC)  # smooth, like a photo
  _write(tmp_path / "big.jpg", photo, quality=90)
  fast = folder.read_rgb(str(tmp_path / "big.jpg"), 120)
  full = Image.open(tmp_path / "big.jpg").convert("RGB").resize((120, 90), Image.BILINEAR)
  assert fast.shape == (90, 120, 3)
  assert np.abs(fast.astype(float) - np.asarray(full, float)).mean() < 2.0  # of 255


def _records(workdir):
  return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_keras_cnn_trains_resident_on_the_real_folder_and_counts_skipped_files(
  real_slice, tmp_path
):
  (real_slice / "test" / "cat" / "broken.png").write_bytes(b"\x89PNG broken")
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(real_slice), skip_bad_images=True)
  config.update(batch_size=32, eval_batch_size=32, num_train_steps=6, log_every_steps=3)
  final = train_and_evaluate(config, str(tmp_path / "run"))
  assert final["eval_examples"] == 80  # every real test image once; the broken one skipped
  meta = json.loads((tmp_path / "run" / "metadata.jsonl").read_text().splitlines()[0])
  assert meta["dataset_used"] == "folder" and meta["skipped_images"] == 1


def test_resuming_on_changed_data_is_an_error_unless_allowed(real_slice, tmp_path):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(real_slice), batch_size=32, eval_batch_size=32)
  config.update(num_train_steps=2, log_every_steps=1)
  train_and_evaluate(config, str(tmp_path / "run"))
  next(real_slice.glob("train/cat/*.jpg")).unlink()  # the folder is not what it was
  config.update(num_train_steps=3)
  with pytest.raises(UserError, match=r"was trained on folder .*\(content differs\)"):
    train_and_evaluate(config, str(tmp_path / "run"))
  assert [r["step"] for r in _records(tmp_path / "run")] == [1, 2, 2]  # nothing more written
  train_and_evaluate(config, str(tmp_path / "run"), allow_data_change=True)
  assert _records(tmp_path / "run")[-1]["step"] == 3


def test_folder_streams_through_two_worker_processes_end_to_end_skipping_a_bad_file(
  real_slice, tmp_path, streamed_config
):
  (real_slice / "test" / "cat" / "broken.png").write_bytes(b"\x89PNG broken")
  config = streamed_config(
    dataset="folder",
    data_dir=str(real_slice),
    data_placement="streamed",
    data_workers=2,
    num_train_steps=6,
    log_every_steps=3,
    skip_bad_images=True,
  )
  final = train_and_evaluate(config, str(tmp_path / "run"))
  assert final["eval_examples"] == 80  # every real test image once; the broken one left out
  assert all(r["dataset_used"] == "folder" for r in _records(tmp_path / "run"))
  meta = (tmp_path / "run" / "metadata.jsonl").read_text().splitlines()
  assert json.loads(meta[-1])["skipped_images"] >= 1  # read once per eval


def test_model_classes_must_match_the_folder(real_slice):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(real_slice))
  config.model.num_classes = 7
  with pytest.raises(UserError, match="has 10 classes but model.num_classes=7"):
    train_and_evaluate(config, str(real_slice / "run"))


def test_an_empty_class_directory_with_skip_bad_images_is_named_and_still_counted(
  real_slice, capsys
):
  (real_slice / "train" / "zebra").mkdir()
  data = folder.scan(str(real_slice), skip_bad=True)
  assert data.classes == [*CLASSES, "zebra"]  # the class count the model needs is unchanged
  assert 10 not in data.train.labels
  assert "warning: " in capsys.readouterr().out.replace(str(real_slice), "")
  with pytest.raises(UserError, match="zebra holds no image files"):
    folder.scan(str(real_slice))
