"""The streamed (ImageNet-style) input: sharding, epochs, fixed sizes, prefetch, input wait."""

import itertools
import json
import os
import time
import types

import numpy as np
import pytest
import tensorflow_datasets as tfds

from research import inputs, progress, train
from research.data import streaming
from research.errors import UserError
from research.train import train_and_evaluate

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)


def test_processes_read_their_parts_of_one_global_order_once_per_epoch_new_each_epoch():
  n, batch = 48, 8  # records, in their source order (a folder's: class after class)
  stream = streaming.shuffled(list(range(n)), seed=3)

  def global_batches(processes: int, start: int = 0, count: int = 12):
    parts = [
      itertools.islice(
        streaming.batch_stream(stream, batch // processes, start, 0, (p, processes)), count
      )
      for p in range(processes)
    ]
    return [np.concatenate(blocks) for blocks in zip(*parts, strict=True)]  # process 0 first

  one = global_batches(1)
  for processes in (2, 4):  # the same batches, example for example, on any process count
    np.testing.assert_array_equal(global_batches(processes), one)
  np.testing.assert_array_equal(global_batches(2, start=5, count=7), one[5:])  # a resume
  first, second = np.concatenate(one[:6]), np.concatenate(one[6:])
  assert sorted(first) == sorted(second) == list(range(n))
  assert not np.array_equal(first, second)
  # Shuffled over the whole split, not in runs of the source order (the same class).
  assert sum(abs(a - b) <= 1 for a, b in itertools.pairwise(first)) < n // 8


def test_mock_imagenet_batches_are_fixed_size_uint8_and_land_sharded_on_devices():
  with tfds.testing.mock_data(num_examples=24):
    source = streaming.TfdsImages(streaming.open_source("imagenet2012", "train", ""), 40)
    ds = streaming.shuffled(source, seed=0)
    batches = list(itertools.islice(streaming.batch_stream(ds, batch=8, start=0, workers=0), 3))
    labels = sorted(int(source[i]["label"]) for i in range(24))
  assert sorted(np.concatenate([b["label"] for b in batches]).tolist()) == labels  # an epoch
  for batch in batches:
    assert batch["image"].shape == (8, 40, 40, 3) and batch["image"].dtype == np.uint8
    assert batch["label"].shape == (8,) and batch["size"].shape == (8, 2)
    assert (batch["size"].max(axis=1) == 40).all()  # the longer side is the host size
  on_devices = next(inputs.prefetch_to_devices(iter(batches), depth=2))
  assert set(on_devices) == {"image", "size", "label"}  # "skipped" stays on the host
  assert on_devices["image"].shape == (8, 1, 40, 40, 3)  # [devices, per_device_batch, ...]
  assert len(on_devices["image"].sharding.device_set) == 8


@pytest.mark.parametrize("name", ["imagenet2012", "imagenette"])  # inception_v3, :imagenette
def test_eval_stream_covers_the_split_once_with_padding_masked(name):
  with tfds.testing.mock_data(num_examples=21):
    source = streaming.TfdsImages(streaming.open_source(name, streaming.EVAL_SPLIT[name], ""), 32)
    batches = list(streaming.eval_batches(source, per_process_batch=8, workers=0))
  assert len(batches) == 3
  assert sum(b["mask"].sum() for b in batches) == 21


def test_not_prepared_dataset_is_a_clear_error_and_nothing_else(tmp_path, caplog):
  with pytest.raises(UserError, match="not prepared.*tfds build imagenet2012"):
    streaming.open_source("imagenet2012", "train", str(tmp_path))
  assert not caplog.records  # no tfds warning about the folders it looked for


@pytest.fixture
def mock_tfds_config(streamed_config):
  """Imagenette as tfds prepares it, mocked: ImageNet's layout with 10 classes, so its step is
  the program that tests/test_folder.py streams its folder with."""

  def make(**overrides):
    config = streamed_config(dataset="imagenette", num_train_steps=12, log_every_steps=4)
    config.update(overrides)
    return config

  return make


def _waits(workdir):
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r["input_wait_fraction"] for r in records if "loss" in r][1:]  # after step 1


def test_streamed_training_decodes_on_two_workers_and_evaluates_the_whole_split(
  tmp_path, mock_tfds_config, decoding_processes
):
  with tfds.testing.mock_data(num_examples=40):
    final = train_and_evaluate(mock_tfds_config(data_workers=2), str(tmp_path))
  assert final["eval_examples"] == 40
  assert (tmp_path / "augmented_batch.png").exists()
  training, evals = decoding_processes("train"), decoding_processes("eval")
  assert len(set(training)) == 2 and os.getpid() not in training  # two workers, not this one
  assert len(evals) == 2 * 40  # the evals at step 10 and at the end, each starting its workers
  for decoders in (set(evals[:40]), set(evals[40:])):
    assert len(decoders) == 2 and os.getpid() not in decoders


SHORT = dict(num_train_steps=8, log_every_steps=2)  # records at steps 1, 2, 4, 6 and 8
DECODE_SEC, STEP_SEC = 0.03, 0.06  # on the loop's clock: an image decoded (the slow input), a step


def test_slow_input_makes_input_wait_high_and_fast_input_keeps_it_low(
  tmp_path, monkeypatch, mock_tfds_config
):
  """The input wait is the share of the loop's time spent in getting its next batch. The
  loop's clock here is the test's, not the wall clock of a machine other tests share: it
  moves by STEP_SEC a step and, for the slow input, by DECODE_SEC an image decoded (in this
  process: data_workers=0, one batch of 16 decoded as each step takes one), so each record's
  share is known exactly."""
  clock = [0.0]
  monkeypatch.setattr(
    progress, "time", types.SimpleNamespace(perf_counter=lambda: clock[0], time=time.time)
  )
  compile_step = train._compiled_step

  def compiled_step(*args):
    step = compile_step(*args)

    def timed(*step_args):
      clock[0] += STEP_SEC
      return step(*step_args)

    return timed

  monkeypatch.setattr(train, "_compiled_step", compiled_step)
  with tfds.testing.mock_data(num_examples=40):
    train_and_evaluate(mock_tfds_config(**SHORT), str(tmp_path / "fast"))
    decode = streaming.TfdsImages.__getitem__

    def slow_decode(self, index):
      clock[0] += DECODE_SEC
      return decode(self, index)

    monkeypatch.setattr(streaming.TfdsImages, "__getitem__", slow_decode)
    train_and_evaluate(mock_tfds_config(**SHORT), str(tmp_path / "slow"))
  fast, slow = _waits(tmp_path / "fast"), _waits(tmp_path / "slow")
  assert len(fast) == len(slow) == 4 and fast == [0.0] * 4, fast
  decoding = 16 * DECODE_SEC  # a step's batch
  # The record at step 2 covers steps 1 and 2 (a launch's first record closes no window), and
  # step 1's batch was taken before the clock started: one decoded batch in two steps, 0.8;
  # the records at 4, 6 and 8 two in two, 0.89.
  first = decoding / (decoding + 2 * STEP_SEC)
  assert slow == pytest.approx([first] + [decoding / (decoding + STEP_SEC)] * 3), slow
