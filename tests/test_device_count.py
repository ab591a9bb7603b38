"""The device count is a speed knob: the same run on 1, 2, 4 or 8 devices, and after a resume
on another count (docs/long_runs.md)."""

import functools
import json
import shutil
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from research import augment, configuration, inputs, steps, trained
from research.placement import replicate, to_devices
from research.steps import AXIS
from research.train import train_and_evaluate
from tests import float64, guide, launches

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

CONFIGS = {
  "vgg": "configs/cifar_vgg.py:smoke",  # BatchNorm
  "keras_cnn": "configs/cifar_keras_cnn.py:smoke",  # dropout
  "vgg_one_device": "configs/cifar_vgg.py:smoke",  # BatchNorm as code for one device writes it
}
# A fork's copy of a model written for one device: its BatchNorm names no axis (the step points
# it at its own, research.steps.batch_norm_over).
ONE_DEVICE = (
  "from research import models\n"
  "from research.models import vgg\n"
  "models.register('vgg_one_device', fields=models.MODELS.declared['vgg'])(\n"
  "  lambda model_config, axis_name: vgg.create(model_config, axis_name=None)\n"
  ")\n"
)
FORK = {"modules": "one_device", "model.name": "vgg_one_device"}  # its overrides


@pytest.mark.parametrize(
  "config, mix",
  [
    ("configs/cifar_keras_cnn.py", ""),
    ("configs/cifar_vgg.py", "|mixup(0.4)"),
    ("configs/cifar_speedrun.py", "|cutmix(1.0)"),  # flip_alternating flips every odd epoch
  ],
)
def test_the_inputs_are_bitwise_the_same_on_1_2_4_and_8_devices(config, mix):
  """Which examples stand at each position of the global batch and their augmented pixels,
  for steps 4-8 of an epoch of 6 steps (an epoch boundary, where the order changes, and
  flip_alternating's flip): the shipped augmentations, with a batch op or without."""
  rng = np.random.default_rng(0)
  n, batch_size = 100, 16  # 6 global batches per epoch; 4 examples wait for the next epoch
  images = rng.integers(0, 256, (n, 8, 8, 3), np.uint8)
  labels = np.arange(n, dtype=np.int32)
  pipeline = augment.build(configuration.load(config).augment + mix, seed=0)
  shuffle_key, step_key = jax.random.key(1), jax.random.key(2)

  def run(n_devices):
    devices = jax.devices()[:n_devices]
    gather = functools.partial(
      inputs.resident_gather, step_key=step_key, per_device_batch=batch_size // n_devices,
      sharded=False,
    )  # fmt: skip

    def on_device(step, data, order):
      pixels = steps.augmented_examples(
        step, (data, order), gather=gather, augment=pipeline, count=batch_size
      )
      return pixels, gather(step, (data, order)).labels

    taken, data = [], replicate((images, labels), devices)
    step_on_devices = jax.pmap(on_device, AXIS, in_axes=(None, 0, 0), devices=devices)
    orders = jax.jit(  # compiled, as the resident input compiles it
      lambda epoch: inputs.device_orders(
        inputs.global_order(epoch, shuffle_key=shuffle_key, n_examples=n, batch_size=batch_size),
        devices=np.arange(n_devices),
        n_devices=n_devices,
      )
    )
    for step in range(4, 9):
      parts = orders(step // 6)
      pixels, ids = step_on_devices(np.int32(step), data, to_devices(np.asarray(parts), devices))
      whole = lambda x: np.asarray(x).reshape(batch_size, *x.shape[2:])  # the global batch
      taken.append((whole(ids), whole(pixels)))
    return taken

  one = run(1)
  epochs = np.concatenate([ids for ids, _ in one[:2]]), np.concatenate([ids for ids, _ in one[2:4]])
  assert len(set(epochs[0])) == len(set(epochs[1])) == 32  # no example twice in an epoch
  for n_devices in (2, 4, 8):
    for (ids, pixels), (ids_one, pixels_one) in zip(run(n_devices), one, strict=True):
      np.testing.assert_array_equal(ids, ids_one)
      np.testing.assert_array_equal(pixels, pixels_one)


STEPS = 4
# Every run here: STEPS steps, each logged. The uninterrupted runs also keep a checkpoint every
# 2 steps, for the resume on 1 device.
SETTINGS = {"num_train_steps": STEPS, "log_every_steps": 1}
UNINTERRUPTED = {**SETTINGS, "checkpoint_every_steps": 2}


def _launch(workdir, config: str, settings: dict) -> tuple:
  """research.main's launch of `config` in `workdir` with these config fields."""
  fields = [f"--config.{field}={value}" for field, value in settings.items()]
  return "research.main", [f"--config={config}", f"--workdir={workdir}", *fields]


def _records(workdir):
  """({step: its train loss, from its last record}, the final eval record)."""
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = {r["step"]: r["loss"] for r in records if "loss" in r}
  return losses, [r for r in records if "eval_accuracy" in r][-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{(model, devices): (losses, final eval)} of uninterrupted float64 runs (tests/float64.py),
  checkpointed at step 2; ("vgg", "8 then 1"): the 8-device run preempted after that checkpoint
  (its last checkpoint gone) and resumed on 1 device (the program of the run on 1), with the
  resume's output; ("vgg", "restored on 1"): its finished run resumed on 1 device, which only
  evaluates its last checkpoint, with the output. The runs on 8 devices train in this
  process; those on 1 in one child process."""
  root = tmp_path_factory.mktemp("device_count")
  (root / "one_device.py").write_text(ONE_DEVICE)
  done, on_one = {}, []
  sys.path.insert(0, str(root))
  with float64.on():
    try:
      with guide.registered():
        for model, spec in CONFIGS.items():
          fork = FORK if model == "vgg_one_device" else {}
          # On 8 devices in this process (the suite's flags, as the child on 1 has them).
          config = configuration.load(spec)
          configuration.resolve(config, list({**fork, **float64.fields(model)}.items()))
          config.update(UNINTERRUPTED)
          train_and_evaluate(config, str(root / f"{model}-8"))
          if fork:  # the run's checkpoint evaluated again: its own final record
            done[model, "eval"] = trained.evaluate(root / f"{model}-8")
          on_one.append(
            _launch(root / f"{model}-1", spec, {**UNINTERRUPTED, **fork, **float64.fields(model)})
          )
    finally:
      sys.path.remove(str(root))
      sys.modules.pop("one_device", None)
    resumed, restored = root / "vgg-8-then-1", root / "vgg-8-restored-on-1"
    shutil.copytree(root / "vgg-8", resumed)
    shutil.copytree(root / "vgg-8", restored)
    shutil.rmtree(resumed / "checkpoints" / str(STEPS))
    for workdir in (resumed, restored):
      on_one.append(_launch(workdir, CONFIGS["vgg"], {**SETTINGS, **float64.fields("vgg")}))
    # The finished run's eval at another eval batch (250 examples in batches of 24: the last
    # padded) and its predict of image files, on 1 device; the same predict on 8 in this process.
    images = _image_files(root / "images")
    on_one.append(
      ("research.trained", ["eval", str(root / "vgg-8"), "--config.eval_batch_size=24"])
    )
    predict = ["predict", str(root / "vgg-8"), str(images), "--top_k=3"]
    on_one.append(("research.trained", [*predict, f"--output={root / 'predicted-on-1.csv'}"]))
    outputs = launches.run(1, on_one, root, path=root)
    trained.predict(root / "vgg-8", [images], top_k=3, output=root / "predicted-on-8.csv")
  assert all(code == 0 for code, _ in outputs), [out[-2000:] for _, out in outputs]
  for model in CONFIGS:
    for devices in (8, 1):
      done[model, devices] = _records(root / f"{model}-{devices}")
  done["vgg", "8 then 1"] = (*_records(resumed), outputs[-4][1])
  done["vgg", "restored on 1"] = (*_records(restored), outputs[-3][1])
  evals = (root / "vgg-8" / trained.EVALS).read_text().splitlines()
  done["vgg", "eval on 1"] = (json.loads(evals[-1]), outputs[-2][1])
  done["vgg", "predict"] = [(root / f"predicted-on-{n}.csv").read_text() for n in (1, 8)]
  return done


def _image_files(folder):
  """`folder` with 6 PNG files of random pixels and sizes (predict resizes them)."""
  folder.mkdir()
  rng = np.random.default_rng(0)
  for i in range(6):
    size = (24 + 4 * i, 40 - 2 * i, 3)
    Image.fromarray(rng.integers(0, 256, size, np.uint8)).save(folder / f"{i}.png")
  return folder


# Every step sums its gradients, BatchNorm statistics and losses over the devices' parts of the
# global batch, an order of additions of its own for each device count, and training amplifies the
# rounding (docs/long_runs.md). In float64 (tests/float64.py) every step's loss and the final eval
# loss (of the runs, the resume on 1 and the restored checkpoint; of the eval at another eval
# batch): 1.9e-16 apart at most, relative, on the default kernels, 2.5e-16 on the other set. One
# device's gradient in place of the devices' mean moved the losses by 2.3e-2 (keras_cnn) to 1.0e-1
# (vgg); the eval's loss sum without each batch's first example, the eval at another batch by
# 9.5e-2; a draw that depended on the device count moved the float32 loss by 1e-2 at step 1
# (2026-11-26).


@pytest.mark.parametrize("model", CONFIGS)
def test_a_short_run_on_1_device_is_the_run_on_8(runs, model):
  (losses_8, eval_8), (losses_1, eval_1) = runs[model, 8], runs[model, 1]
  assert sorted(losses_8) == sorted(losses_1) == list(range(1, STEPS + 1))
  float64.assert_close([losses_1[s] for s in losses_8], list(losses_8.values()), what="losses")
  assert eval_1["eval_accuracy"] == eval_8["eval_accuracy"]
  float64.assert_close(eval_1["eval_loss"], eval_8["eval_loss"], what="eval loss")


def test_eval_of_a_run_whose_batch_norm_names_no_axis_repeats_its_final_record(runs):
  """The step averaged its statistics over the devices: every device, the checkpoint and the
  in-run eval hold the same."""
  final, again = runs["vgg_one_device", 8][1], runs["vgg_one_device", "eval"]
  assert (again["eval_loss"], again["eval_accuracy"]) == (
    final["eval_loss"],
    final["eval_accuracy"],
  )


def test_a_run_stopped_on_8_devices_and_resumed_on_1_ends_as_the_run_on_8(runs):
  losses, final, output = runs["vgg", "8 then 1"]
  (losses_8, eval_8) = runs["vgg", 8]
  assert "resumed from the checkpoint at step 2" in output
  assert "this one on 1: the run continues as before" in output
  float64.assert_close([losses[s] for s in losses_8], list(losses_8.values()), what="losses")
  assert final["eval_accuracy"] == eval_8["eval_accuracy"]
  float64.assert_close(final["eval_loss"], eval_8["eval_loss"], what="eval loss")


def test_eval_at_another_eval_batch_and_predict_on_1_device_give_the_8_devices_numbers(runs):
  record, output = runs["vgg", "eval on 1"]
  saved = runs["vgg", 8][1]
  assert "over 250 examples" in output and record["overrides"] == {"eval_batch_size": "24"}
  assert record["eval_examples"] == saved["eval_examples"] == 250
  assert record["eval_accuracy"] == saved["eval_accuracy"]
  float64.assert_close(record["eval_loss"], saved["eval_loss"], what="eval loss")
  # Each image's 3 classes and their probabilities (6 decimals): in float64 a difference of
  # 1e-16 meets a rounding boundary of the sixth decimal about once in 1e9 values.
  on_one, on_eight = runs["vgg", "predict"]
  assert len(on_one.splitlines()) == 7 and on_one == on_eight


def test_checkpoint_from_8_devices_restores_the_same_state_on_1(runs):
  """Resumed at its last step, the run only evaluates: the restored parameters and BatchNorm
  statistics, evaluated on 1 device, give the 8-device evaluation."""
  _, restored, output = runs["vgg", "restored on 1"]
  saved = runs["vgg", 8][1]
  assert f"resumed from the checkpoint at step {STEPS}" in output and "| 1 device (cpu)" in output
  assert "the launch before this one ran on 8 devices, this one on 1" in output
  assert restored["eval_examples"] == saved["eval_examples"]
  assert restored["eval_accuracy"] == saved["eval_accuracy"]
  float64.assert_close(restored["eval_loss"], saved["eval_loss"], what="eval loss")
