"""Image folders as datasets: layout, class order, real JPEGs, caching, bad files, streaming."""

import io
import json
import os
import pickle
import shutil
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from research import configuration, host_workers, main
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


RNG = np.random.default_rng(0)
WIDE = RNG.integers(0, 65536, (20, 30), np.uint16)  # 16-bit samples, mean about half of 65535


def _png48(path: Path, rgb16: np.ndarray):
  """A 16-bit-per-channel RGB PNG (which Pillow reads but cannot write), chunk by chunk."""
  h, w, _ = rgb16.shape
  rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in rgb16)  # filter 0 per row

  def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

  header = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)  # 16 bits, color type 2: RGB
  path.write_bytes(
    b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
    + chunk(b"IEND", b"")
  )  # fmt: skip


def _over_white(gray, alpha):
  return np.rint((gray * alpha + 255.0 * (255 - alpha)) / 255)


@pytest.mark.parametrize(
  "name, write, reference, tolerance",
  [
    # 16-bit grayscale, little- and big-endian, and 32-bit integers: scaled, not clipped
    ("i16.png", lambda p: Image.fromarray(WIDE).save(p), np.rint(WIDE / 257), 0),
    ("i16b.tif", lambda p: Image.fromarray(WIDE.astype(">u2")).save(p), np.rint(WIDE / 257), 0),
    ("i32.tif", lambda p: Image.fromarray(WIDE.astype(np.int32)).save(p), np.rint(WIDE / 257), 0),
    ("f.tif", lambda p: Image.fromarray(WIDE / np.float32(65535)).save(p), np.rint(WIDE / 257), 0),
    # 48-bit RGB: Pillow keeps each sample's high byte, at most 1 from scaling
    ("rgb48.png", lambda p: _png48(p, np.stack([WIDE, WIDE[::-1], 65535 - WIDE], -1)),
     np.rint(np.stack([WIDE, WIDE[::-1], 65535 - WIDE], -1) / 257), 1),
    # transparency over white: grayscale with alpha, a palette's transparent index
    ("la.png", lambda p: Image.fromarray(np.stack([WIDE >> 8, WIDE & 255], -1).astype(np.uint8),
     "LA").save(p), _over_white(WIDE >> 8, WIDE & 255), 1),
    ("p.png", lambda p: _palette().save(p, transparency=1), np.array([[255, 0, 0], [255] * 3]), 0),
    # JPEGs in CMYK and YCbCr: flat colors, within JPEG's loss
    ("cmyk.jpg", lambda p: Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(p, quality=95),
     np.array([255, 0, 0]), 3),
    ("ycbcr.jpg", lambda p: Image.new("YCbCr", (16, 16), (100, 50, 200)).save(p, quality=95),
     np.array(Image.new("YCbCr", (1, 1), (100, 50, 200)).convert("RGB").getpixel((0, 0))), 3),
  ],
)  # fmt: skip
def test_every_pixel_format_decodes_to_the_rgb_a_viewer_shows(
  tmp_path, name, write, reference, tolerance
):
  path = tmp_path / name
  write(path)
  decoded = folder.read_rgb(str(path)).astype(float)
  if name == "p.png":  # palette index 0 is red, index 1 transparent: left half red, right white
    decoded = decoded[0, [0, -1]]
  elif np.ndim(reference) == 2:
    reference = np.repeat(reference[..., None], 3, axis=-1)  # gray: the same in R, G and B
  assert decoded.shape[-1] == 3 and np.abs(decoded - reference).max() <= tolerance, name


def _palette() -> Image.Image:
  image = Image.new("P", (8, 4), 0)
  image.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
  image.paste(1, (4, 0, 8, 4))  # the right half: index 1, transparent when saved so
  return image


def test_an_exif_rotated_jpeg_decodes_upright_and_resized_by_its_longer_side(tmp_path):
  stored = np.asarray(Image.fromarray(RNG.integers(0, 256, (6, 8, 3), np.uint8)).resize((80, 60)))
  exif = Image.Exif()
  exif[0x0112] = 6  # shown rotated 90° clockwise
  Image.fromarray(stored).save(tmp_path / "r.jpg", quality=95, exif=exif)
  upright = np.rot90(stored, k=-1).astype(float)  # 60 wide, 80 high
  decoded = folder.read_rgb(str(tmp_path / "r.jpg"))
  assert decoded.shape == (80, 60, 3) and np.abs(decoded - upright).mean() < 3
  assert folder.read_rgb(str(tmp_path / "r.jpg"), 40).shape == (40, 30, 3)


def test_pixels_with_no_8_bit_form_are_an_undecodable_file(tmp_path):
  root = tmp_path / "data"
  for split in ("train", "val"):
    _write(root / split / "a" / "ok.png", Image.new("RGB", (4, 4)))
  Image.fromarray(np.full((4, 4), 7.5, np.float32)).save(root / "train" / "a" / "hdr.tif")
  with pytest.raises(UserError, match=r"cannot decode .*hdr\.tif .*no 8-bit form"):
    folder.load_resident(folder.scan(str(root)), skip_bad=False, size=32)
  data = folder.load_resident(folder.scan(str(root)), skip_bad=True, size=32)
  assert data.skipped_files == [str(root / "train" / "a" / "hdr.tif")]


def test_images_in_subfolders_count_and_hidden_or_non_image_files_are_passed_over(tmp_path):
  root = tmp_path / "data"
  for rel in ("train/a/1.png", "train/a/nested/deeper/2.png", "train/b/3.png", "val/a/4.png"):
    _write(root / rel, Image.new("RGB", (4, 4)))
  for rel in ("train/a/.DS_Store", "train/b/Thumbs.db", "train/notes.txt", "val/a/x.csv"):
    (root / rel).write_bytes(b"")
  _write(root / "train/a/.ipynb_checkpoints/5.png", Image.new("RGB", (4, 4)))
  data = folder.scan(str(root))
  assert data.train.paths.tolist() == [
    b"train/a/1.png",
    b"train/a/nested/deeper/2.png",
    b"train/b/3.png",
  ]
  assert data.train.labels.tolist() == [0, 0, 1]
  assert data.passed_over == [
    "train/a/.DS_Store", "train/a/.ipynb_checkpoints/", "train/b/Thumbs.db", "train/notes.txt",
    "val/a/x.csv",
  ]  # fmt: skip
  assert folder.summary(data, 2) == (
    f"{root}: train 3 images in 2 classes, val 1; passed over 5 non-image or hidden files, "
    "skipped 2 undecodable"
  )


@pytest.mark.parametrize("cores", [1, 2])
def test_real_cifar_folder_gives_the_same_arrays_as_an_archive_of_the_same_pixels(
  tmp_path, monkeypatch, cores
):
  """Decoded in this process (one core) or on one pool of workers for both splits."""
  pools, pool = [], host_workers.pool
  monkeypatch.setattr(host_workers, "pool", lambda n: pools.append(n) or pool(n))
  monkeypatch.setattr(os, "cpu_count", lambda: cores)
  monkeypatch.setattr(folder, "CHUNK", 100)  # the slice's 240 files: 3 chunks
  data = folder.scan(str(SLICE))
  _official_archive(tmp_path / "cifar-10-python.tar.gz", data)
  archive = cifar10.load_from(str(tmp_path / "cifar-10-python.tar.gz"))
  from_folder = folder.load_resident(data, skip_bad=False, size=32)
  assert pools == ([] if cores == 1 else [2])
  for field in ("train_images", "train_labels", "test_images", "test_labels"):
    np.testing.assert_array_equal(getattr(from_folder, field), getattr(archive, field))
  assert from_folder.train_images.shape == (160, 32, 32, 3) and from_folder.num_classes == 10


def test_decoded_folder_is_cached_and_a_changed_file_list_decodes_again(real_slice, monkeypatch):
  first = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False, size=32)
  assert len(list(folder.CACHE.glob("folder-*.npz"))) == 1
  with monkeypatch.context() as m:
    m.setattr(folder, "_decode_split", None)  # a cache hit decodes nothing
    again = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False, size=32)
  np.testing.assert_array_equal(first.train_images, again.train_images)
  (real_slice / "train" / "cat" / "0000.jpg").unlink()
  fewer = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False, size=32)
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
      others[0] = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False, size=32)

  monkeypatch.setattr(np, "savez", savez_while_another_process_decodes)
  first = folder.load_resident(folder.scan(str(real_slice)), skip_bad=False, size=32)
  (cache,) = folder.CACHE.iterdir()  # one whole file, no partial one left behind
  with np.load(cache) as whole:
    for data in (first, others[0]):
      np.testing.assert_array_equal(whole["train_images"], data.train_images)


def test_undecodable_file_is_an_error_naming_it_or_skipped_and_counted(real_slice):
  bad = real_slice / "train" / "dog" / "broken.jpg"
  bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
  with pytest.raises(UserError, match=r"cannot decode .*broken\.jpg.*skip_bad_images"):
    folder.load_resident(folder.scan(str(real_slice)), skip_bad=False, size=32)
  data = folder.load_resident(folder.scan(str(real_slice)), skip_bad=True, size=32)
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
  assert item["index"] == 2  # the record read instead: the host names record 2 - 1 as skipped


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


@pytest.mark.end_to_end
def test_keras_cnn_trains_resident_on_the_real_folder_and_says_once_what_it_left_out(
  real_slice, tmp_path, capsys
):
  (real_slice / "test" / "cat" / "broken.png").write_bytes(b"\x89PNG broken")
  (real_slice / "train" / "cat" / ".DS_Store").write_bytes(b"")
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(real_slice), skip_bad_images=True)
  config.update(batch_size=32, eval_batch_size=32, num_train_steps=6, log_every_steps=3)
  final = train_and_evaluate(config, str(tmp_path / "run"))
  assert final["eval_examples"] == 80  # every real test image once; the broken one skipped
  meta = json.loads((tmp_path / "run" / "metadata.jsonl").read_text().splitlines()[0])
  assert meta["dataset_used"] == "folder" and meta["skipped_images"] == 1
  assert meta["passed_over_files"] == 1
  listed = tmp_path / "run" / "data_left_out.txt"
  assert listed.read_text().splitlines() == [
    f"undecodable\t{real_slice / 'test' / 'cat' / 'broken.png'}",
    "passed over\ttrain/cat/.DS_Store",
  ]
  out = capsys.readouterr().out
  line = (
    f"{real_slice}: train 160 images in 10 classes, test 81; passed over 1 non-image or hidden "
    f"file, skipped 1 undecodable (listed in {listed})"
  )
  assert out.count(line) == 1 and out.count("broken.png") == 0


@pytest.mark.end_to_end
def test_resuming_on_changed_data_is_an_error_unless_allowed(real_slice, tmp_path):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(real_slice), batch_size=32, eval_batch_size=32)
  config.update(num_train_steps=2, log_every_steps=1)
  train_and_evaluate(config, str(tmp_path / "run"))
  first, second = sorted(real_slice.glob("train/cat/*.jpg"))[:2]
  shutil.copyfile(second, first)  # the folder is not what it was: other pixels, as many images
  config.update(num_train_steps=3)
  with pytest.raises(UserError, match=r"was trained on folder .*\(content differs\)"):
    train_and_evaluate(config, str(tmp_path / "run"))
  assert [r["step"] for r in _records(tmp_path / "run")] == [1, 2, 2]  # nothing more written
  train_and_evaluate(config, str(tmp_path / "run"), allow_data_change=True)
  assert _records(tmp_path / "run")[-1]["step"] == 3


@pytest.mark.end_to_end
def test_folder_streams_through_two_worker_processes_end_to_end_skipping_a_bad_file(
  real_slice, tmp_path, streamed_config, capsys, decoding_processes
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
  assert json.loads(meta[-1])["skipped_images"] == 1  # read at every eval, counted once
  out = capsys.readouterr().out
  assert out.count(f"warning: skipped {real_slice / 'test' / 'cat' / 'broken.png'}") == 1
  listed = tmp_path / "run" / "data_left_out.txt"
  assert f"skipped 1 undecodable files (skip_bad_images) (listed in {listed})" in out
  for split in ("train", "eval"):  # every image decoded by one of two workers, none here
    decoders = set(decoding_processes(split))
    assert len(decoders) == 2 and os.getpid() not in decoders, (split, decoders)


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


def _photo(size, mode="RGB", seed=0) -> Image.Image:
  pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
  return Image.fromarray(pixels).convert(mode)


@pytest.mark.end_to_end
def test_a_folder_as_people_have_it_trains_with_only_dataset_and_data_dir(tmp_path, capsys):
  """Mixed sizes and pixel formats, nested folders, hidden and non-image files."""
  root = tmp_path / "photos"
  sizes = [(50, 40), (32, 32), (64, 100), (33, 31)]
  for k, cls in enumerate(CLASSES):
    for i in range(8):
      nested = "nested/" if i == 7 else ""
      _write(root / f"train/{cls}/{nested}{i}.png", _photo(sizes[i % 4], seed=k * 10 + i))
    _write(root / f"val/{cls}/a.jpg", _photo((40, 30), "CMYK", seed=k), quality=90)
    _write(root / f"val/{cls}/b.png", _photo((30, 40), "LA", seed=k))
  Image.fromarray(WIDE).save(root / "train/cat/wide.png")  # 16-bit grayscale, 30×20
  _write(root / "train/dog/palette.png", _photo((20, 20), "P"), transparency=0)
  (root / "train/cat/.DS_Store").write_bytes(b"")
  (root / "train/cat/Thumbs.db").write_bytes(b"")
  workdir = tmp_path / "run"
  args = [f"--workdir={workdir}", "--config.dataset=folder", f"--config.data_dir={root}"]
  steps = "--config.num_train_steps=2"  # a short run: what is checked is the data
  assert main.run(["--config", "configs/cifar_keras_cnn.py:smoke", *args, steps]) == 0
  out = capsys.readouterr().out
  line = (
    f"{root}: train 82 images in 10 classes, val 20; 82 brought to 32×32 (shorter side "
    "resized, center cropped); passed over 2 non-image or hidden files"
  )
  assert out.count(line) == 1, out[-3000:]
  assert (workdir / "data_left_out.txt").read_text().splitlines() == [
    "passed over\ttrain/cat/.DS_Store",
    "passed over\ttrain/cat/Thumbs.db",
  ]
  final = _records(workdir)[-1]
  assert final["eval_examples"] == 20
