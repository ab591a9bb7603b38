"""Config mistakes are one `error:` line, found before anything is loaded, compiled or written."""

import json
import re
import shutil
from pathlib import Path

import pytest

from research import configuration, inputs, main, validate
from research.data import load as load_in_memory
from research.errors import UserError
from research.setup import setup
from research.train import train_and_evaluate

SMOKE = "configs/cifar_vgg.py:smoke"
SLICE = Path(__file__).parent / "data" / "cifar10_slice"  # real JPEGs, 10 classes


@pytest.mark.parametrize(
  "override, message",
  [
    ("--config.log_every_steps=0", "log_every_steps=0 must be a whole number >= 1"),
    (
      "--config.model.dtype=bf16",
      "model.dtype='bf16' is not one of float32, bfloat16, float16, float64; say 'bfloat16'",
    ),
    ("--config.profile_steps=(5,)", "profile_steps=(5,) must be () or (start, stop)"),
    ("--config.dataset=cifar100", "dataset='cifar100' is not a registered dataset"),
    ("--config.prefetch=0", "prefetch=0 must be a whole number >= 1"),
    ("--config.learning_rate=-0.1", "learning_rate=-0.1 must be a number > 0"),
    ("--config.momentum=1.5", "momentum=1.5 must be a number in [0, 1)"),
    ("--config.label_smoothing=1", "label_smoothing=1.0 must be a number in [0, 1)"),
    ("--config.weight_decay=-5e-4", "weight_decay=-0.0005 must be a number >= 0"),
    (
      "--config.augment=crop(four)",
      "augmentation op 'crop(four)': four is not a number or a quoted string; "
      "the op is crop(pad: int, mode: str = 'constant')",
    ),
    (
      "--config.augment=crop(4)|flip_lr(0.5)",
      "augmentation op 'flip_lr(0.5)': too many positional arguments; the op is flip_lr()",
    ),
    ("--config.eval_preprocess=crop('4')", "pad='4' is not a whole number"),
    ("--config.model.name=nonexistent", "model.name='nonexistent' is not a registered model"),
    ("--config.model.name=vgg16", "model.name='vgg16' is not a registered model"),
    ("--config.loss_reduction=total", "loss_reduction='total' is not one of mean, sum"),
    ("--config.schedule=cosin", "schedule='cosin' is not a registered schedule (did you mean"),
    ("--config.augment=crop(4)|tta", "ends in a views op; views are for eval_preprocess"),
    ("--config.eval_preprocess=tta|standardize", "comes after a views op, which must be last"),
    ("--config.batch_size=-64", "batch_size=-64 must be a whole number >= 1"),
    ("--config.eval_batch_size=0", "eval_batch_size=0 must be a whole number >= 1"),
    ("--config.num_train_steps=-5", "num_train_steps=-5 must be -1 (num_epochs decides) or >= 1"),
    ("--config.seed=-1", "seed=-1 must be a whole number >= 0"),
    ("--config.data_dir=/data/x", "data_dir='/data/x' is set but dataset='synthetic' reads no"),
    ("--config.model.num_classes=1", "model.num_classes=1 must be a number >= 2"),
    ("--config.model.width=0", "model.width=0.0 must be a number > 0"),
    ("--config.replicate_max_gb=-1", "replicate_max_gb=-1.0 must be a number >= 0"),
    (
      "--config.augment=crop(4)|flip_lr",
      "augment='crop(4)|flip_lr' maps pixel values by none but eval_preprocess='standardize' by "
      "standardize(), so the eval would see values the model never trained on",
    ),
  ],
)
def test_bad_values_are_one_line_errors_before_the_workdir_is_made(tmp_path, override, message):
  workdir = tmp_path / "run"
  with pytest.raises(UserError, match=re.escape(message)) as e:
    main.run(["--config", SMOKE, f"--workdir={workdir}", override])
  assert "\n" not in str(e.value) and not workdir.exists()
  if "nonexistent" in override:  # resembles no model: no guess
    assert "did you mean" not in str(e.value)
  if "vgg16" in override:
    assert "(did you mean 'vgg'?): inception_v3, keras_cnn, " in str(e.value)


@pytest.mark.parametrize(
  "dataset, classes", [("cifar10", 10), ("imagenette", 10), ("imagenet2012", 1000)]
)
def test_a_model_with_other_classes_than_its_dataset_is_an_error_before_any_download(
  dataset, classes, tmp_path
):
  workdir = tmp_path / "run"
  args = ["--config", SMOKE, f"--workdir={workdir}", f"--config.dataset={dataset}"]
  with pytest.raises(UserError) as e:
    main.run([*args, "--config.model.num_classes=7"])
  assert str(e.value) == (
    f"{dataset} has {classes} classes but model.num_classes=7; "
    f"pass --config.model.num_classes={classes}"
  )
  assert not workdir.exists()


@pytest.mark.parametrize(
  "override, message",
  [
    (
      "--config.param_groups.head.optimizer=adamw",
      "param_groups.head.optimizer='adamw' is not a registered optimizer",
    ),
    (
      "--config.param_groups.whiten_bias.train_fraction=0",
      "param_groups.whiten_bias.train_fraction=0.0 must be a number in (0, 1]",
    ),
    ("--config.param_groups.head.match=head(", "param_groups.head.match='head(' is not a regex"),
  ],
)
def test_bad_parameter_groups_are_one_line_errors(tmp_path, override, message):
  workdir = tmp_path / "run"
  with pytest.raises(UserError, match=re.escape(message)):
    main.run(["--config", "configs/cifar_speedrun.py:smoke", f"--workdir={workdir}", override])
  assert not workdir.exists()


def test_num_train_steps_minus_1_the_default_trains_num_epochs():
  config = configuration.load(SMOKE)
  config.update(num_train_steps=configuration.load("configs/cifar_vgg.py").num_train_steps)
  config.num_epochs = 2
  training = setup(config)
  assert config.num_train_steps == -1 and training.num_steps == 2 * training.inputs.steps_per_epoch


def test_pipelines_that_map_pixel_values_alike_pass():
  config = configuration.load(SMOKE)
  config.augment = 'crop(4, "reflect")|flip_lr|standardize'  # the README's example
  validate.train_config(config, 8)
  config.update(augment="inception_crop(32)|scale(-1, 1)", eval_preprocess="scale(-1.0, high=1)")
  validate.train_config(config, 8)


def test_a_batch_that_does_not_divide_suggests_only_positive_multiples():
  config = configuration.load(SMOKE)
  config.batch_size = 3
  with pytest.raises(UserError, match=r"use a multiple of 8 \(e\.g\. 8\)$"):
    validate.train_config(config, 8)


def test_mixing_examples_needs_an_even_batch_on_each_device():
  config = configuration.load(SMOKE)
  config.update(augment="crop(4)|flip_lr|standardize|mixup(0.4)", batch_size=72)
  with pytest.raises(UserError, match=r"positions 2i and 2i \+ 1 .* not 9 \(batch_size=72 over 8"):
    validate.train_config(config, 8)
  validate.train_config(config, 4)  # 18 per device


def test_a_micro_batch_that_does_not_divide_the_device_batch_is_an_error():
  config = configuration.load(SMOKE)  # batch_size 64: 8 per device on 8 devices
  config.micro_batch_size = 3
  with pytest.raises(UserError, match="micro_batch_size=3 does not divide the 8 examples"):
    validate.train_config(config, 8)


@pytest.mark.end_to_end
def test_a_profile_window_before_the_resumed_step_or_past_the_last_is_an_error(tmp_path):
  config = configuration.load(SMOKE)
  config.update(num_train_steps=2, log_every_steps=1)
  train_and_evaluate(config, str(tmp_path))
  written = {p: p.read_bytes() for p in tmp_path.glob("*.json*")}
  for window, what in (((2, 4), "starts at or before step 2"), ((1, 2), "lies wholly before")):
    config.update(num_train_steps=4, profile_steps=window)
    with pytest.raises(UserError, match=f"{re.escape(what)}.*profile_steps='\\(3, "):
      train_and_evaluate(config, str(tmp_path))
  assert {p: p.read_bytes() for p in tmp_path.glob("*.json*")} == written
  config.update(num_train_steps=4, profile_steps=(3, 6))
  with pytest.raises(UserError, match=re.escape("(3, 6) ends after step 4, this run's last")):
    train_and_evaluate(config, str(tmp_path / "new"))  # a new run: nothing is written
  assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
  "placement",
  [dict(data_placement="streamed"), dict(data_placement="auto", resident_max_gb=1e-6)],
  ids=["streamed", "auto-over-the-limit"],
)
def test_streamed_data_needs_a_pipeline_that_starts_with_a_window_op(placement, tmp_path):
  config = configuration.load(SMOKE)  # crop(4)|flip_lr|standardize: it would see the padding
  config.update(dataset="folder", data_dir="tests/data/cifar10_slice", **placement)
  with pytest.raises(UserError, match="augment='crop.*must start with a window op"):
    train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_an_empty_class_directory_is_named_before_anything_is_written(tmp_path):
  data = Path(shutil.copytree(SLICE, tmp_path / "data"))
  (data / "train" / "zebra").mkdir()
  workdir = tmp_path / "run"
  args = ["--config", SMOKE, f"--workdir={workdir}", "--config.dataset=folder"]
  with pytest.raises(UserError, match=r"train/zebra holds no image files, so class 10 \(zebra\)"):
    main.run([*args, f"--config.data_dir={data}", "--config.model.num_classes=11"])
  assert not workdir.exists()


@pytest.mark.parametrize(
  "make, message",
  [
    (lambda p: p.write_text("notes"), "is a file; give a directory"),
    (lambda p: p.parent.joinpath("file").write_text(""), "is inside .*file, which is a file"),
  ],
)
def test_a_workdir_that_is_a_file_is_an_error_before_the_data_is_loaded(
  tmp_path, make, message, monkeypatch
):
  workdir = tmp_path / "run"
  make(workdir)
  if not workdir.exists():
    workdir = tmp_path / "file" / "run"
  loaded = []
  monkeypatch.setattr(inputs, "make", lambda *a, **k: loaded.append(1))
  with pytest.raises(UserError, match=message):
    main.run(["--config", SMOKE, f"--workdir={workdir}"])
  assert not loaded


@pytest.mark.parametrize("num_classes, classes", [(3, 3), (1000, 10)])
def test_synthetic_data_has_ten_classes_or_the_model_s_if_fewer(num_classes, classes):
  """Inception's `:synthetic` has a 1000-way model: its data keeps 10 classes (each one a
  full-size template in memory), all of them labels the model has."""
  config = configuration.load(SMOKE)
  config.model.num_classes = num_classes
  config.update(synthetic_train_size=64, synthetic_test_size=16)
  data = load_in_memory(config)
  assert data.num_classes == classes
  assert set(data.train_labels) | set(data.test_labels) == set(range(classes))


@pytest.mark.end_to_end
def test_evals_and_checkpoints_in_epochs_keep_their_schedule_when_the_batch_size_changes(
  tmp_path,
):
  config = configuration.load(SMOKE)  # 1024 training examples, batch 64: 16 steps an epoch
  config.update(eval_every_epochs=0.5, checkpoint_every_epochs=1.0, num_train_steps=24)
  train_and_evaluate(config, str(tmp_path))
  records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "eval_accuracy" in r] == [8, 16, 24]
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [16, 24]
  config.batch_size = 128  # 8 steps an epoch: the same epochs are other steps
  training = setup(config)
  assert (training.eval_every, training.checkpoint_every) == (4, 8)
  config.update(eval_every_steps=5, checkpoint_every_epochs=0.0)  # steps win, as for length
  training = setup(config)
  assert (training.eval_every, training.checkpoint_every) == (5, 0)
