"""What a fork writes is checked where it meets the library: a normalization that does not
average over the devices, a metric that is not one value per example, an empty split, a model
that returns more than its logits; and what the records say of a fork's classes."""

import contextlib
import csv
import io
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from research import configuration, data, metrics, models, trained, validate
from research.errors import UserError
from research.setup import setup
from research.train import train_and_evaluate

CLASSES = ("red", "green", "blue")


class OwnNorm(nn.Module):
  """A normalization written for one device: its statistics are its own examples'."""

  @nn.compact
  def __call__(self, x, train: bool):
    mean = self.variable("batch_stats", "mean", jnp.zeros, x.shape[-1:])
    if train:
      mean.value = 0.9 * mean.value + 0.1 * x.mean((0, 1, 2))
      return x - x.mean((0, 1, 2))
    return x - mean.value


class OwnNormNet(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    x = OwnNorm()(nn.Conv(4, (3, 3))(x), train)
    return nn.Dense(3)(x.mean((1, 2)))


class TwoOutputs(nn.Module):
  returns: str

  @nn.compact
  def __call__(self, x, train: bool):
    logits = nn.Dense(3)(x.reshape(len(x), -1))
    return (logits, x) if self.returns == "tuple" else {"logits": logits}


def _corner(config, train_size=64, test_size=37):
  """32×32 images whose class is the brightest channel of the corner pixel: 3 named classes."""
  rng = np.random.default_rng(config.seed)

  def split(n):
    images = rng.integers(0, 256, (n, 32, 32, 3), np.uint8)
    return images, images[:, 0, 0].argmax(-1)

  return data.ImageDataset(
    "corner", "generated", *split(train_size), *split(test_size), num_classes=3, classes=CLASSES
  )


@pytest.fixture(autouse=True, scope="module")
def parts():
  """The fork's parts, registered for this module's tests alone."""
  from tests import guide

  with guide.registered():
    data.register("corner", num_classes=3)(_corner)
    data.register("no_test", num_classes=3)(lambda c: _corner(c, test_size=0))
    data.register("no_train", num_classes=3)(lambda c: _corner(c, train_size=0))
    data.register("unnamed", num_classes=3)(
      lambda c: data.ImageDataset(**{**vars(_corner(c)), "classes": ("red", "green")})
    )
    models.register("own_norm")(lambda model_config, axis_name: OwnNormNet())
    models.register("two_outputs", fields={"returns": "tuple"})(
      lambda model_config, axis_name: TwoOutputs(model_config.returns)
    )
    metrics.register("mean_only")(lambda logits, labels: (logits.argmax(-1) == labels).mean())
    metrics.register("per_class_only")(
      lambda logits, labels: jax.nn.one_hot(labels, logits.shape[-1]).sum(0)
    )
    yield


def _config(**fields):
  config = configuration.load("configs/cifar_vgg.py:smoke")
  config.update(dataset="corner", batch_size=16, eval_batch_size=16, num_train_steps=4)
  config.update(log_every_steps=2, checkpoint_every_steps=0)
  config.model.num_classes = 3
  config.update(fields)
  return config


@pytest.fixture(scope="module")
def per_device_run(tmp_path_factory):
  """(workdir, final record, what it printed) of VGG with per-device BatchNorm statistics, on
  the named classes, with per_class_accuracy."""
  workdir = tmp_path_factory.mktemp("per_device") / "run"
  config = _config(batch_norm_statistics="per_device", eval_metrics=("per_class_accuracy",))
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    final = train_and_evaluate(config, str(workdir))
  return workdir, final, printed.getvalue()


@pytest.mark.end_to_end
def test_per_device_statistics_are_said_to_make_results_depend_on_the_device_count(
  per_device_run,
):
  _, _, printed = per_device_run
  assert "BatchNorm statistics per device (batch_norm_statistics='per_device'): results " in printed


@pytest.mark.end_to_end
def test_eval_repeats_the_final_record_of_per_device_statistics_and_of_an_array_metric(
  per_device_run,
):
  """One copy of the running statistics on every device, in the checkpoint and in the eval."""
  workdir, final, _ = per_device_run
  record = trained.evaluate(workdir)
  for field in ("eval_loss", "eval_accuracy", "eval_per_class_accuracy"):
    assert record[field] == final[field], field
  assert len(final["eval_per_class_accuracy"]) == 3
  assert final["eval_examples"] == 37  # padded to 48 for the eval batches: counted once


@pytest.mark.end_to_end
def test_a_dataset_s_class_names_are_the_run_s(per_device_run, tmp_path):
  workdir, _, _ = per_device_run
  assert trained.load(workdir).classes == CLASSES
  Image.new("RGB", (32, 32), (250, 10, 10)).save(tmp_path / "red.png")
  out = tmp_path / "out.csv"
  assert trained.main(["predict", str(workdir), str(tmp_path / "red.png"), f"--output={out}"]) == 0
  assert next(csv.DictReader(out.read_text().splitlines()))["class"] in CLASSES
  metadata = json.loads((workdir / "metadata.jsonl").read_text().splitlines()[-1])
  assert metadata["classes"] == list(CLASSES)


def test_class_names_that_do_not_fit_the_labels_are_one_error_line():
  with pytest.raises(UserError, match=r"dataset 'unnamed': classes=\('red', 'green'\) must be 3"):
    setup(_config(dataset="unnamed"))


def test_a_normalization_of_its_own_that_differs_across_devices_stops_the_run(tmp_path):
  """One the step cannot point at its axis (not nn.BatchNorm): stopped after the first step."""
  with pytest.raises(UserError, match=r"model 'own_norm' keeps statistics \(batch_stats\) that"):
    train_and_evaluate(_config(model=dict(name="own_norm", num_classes=3)), str(tmp_path / "r"))


@pytest.mark.parametrize(
  "name, shape",
  [("mean_only", r"shape \(\) for a batch of 4"), ("per_class_only", r"shape \(3,\) for a b")],
)
def test_a_metric_that_is_not_one_value_per_example_is_one_error_line_before_any_compile(
  name, shape
):
  """A value per batch would be averaged over batches (and move with eval_batch_size); a
  vector of the class count, multiplied with a batch's mask where the two sizes agree."""
  with pytest.raises(UserError, match=rf"eval metric '{name}' returns {shape}.*\[batch, \.\.\.\]"):
    validate.train_config(_config(eval_metrics=(name,)), 8)


@pytest.mark.parametrize("dataset, split", [("no_test", "test"), ("no_train", "train")])
def test_an_empty_split_is_one_error_line(dataset, split):
  with pytest.raises(UserError, match=rf"dataset '{dataset}': its {split} split is empty"):
    setup(_config(dataset=dataset))


@pytest.mark.parametrize("returns", ["tuple", "dict"])
def test_a_model_that_returns_more_than_its_logits_is_told_to_sow_the_rest(returns):
  config = _config(model={"name": "two_outputs", "num_classes": 3, "dtype": "float32"})
  config.model.returns = returns
  with pytest.raises(
    UserError, match=rf"returns a {returns} where the step takes its logits .*sow"
  ):
    setup(config)


def test_modules_and_metrics_on_the_command_line_are_a_name_or_a_comma_list():
  config = _config()
  for text, expected in [("mine", ("mine",)), ("mine,theirs", ("mine", "theirs"))]:
    configuration.override(config, "modules", text)
    assert config.modules == expected
  configuration.override(config, "eval_metrics", "('top5',)")  # Python's tuple, as before
  assert config.eval_metrics == ("top5",)


def test_a_step_metric_named_like_a_standard_deviation_is_logged_and_a_clash_is_an_error():
  record = dict(step=1, loss=1.0, accuracy=0.5, examples_per_sec=1.0, sec_per_batch=1.0)
  record |= dict(input_wait_fraction=0.0, elapsed_sec=1.0, eta_sec=0.0, grad_std=0.25)
  assert ", grad_std 0.2500" in metrics.format_train_line(record)
  metrics.check_step_metrics(["loss", "grad_std"], several=True)  # no grad beside it
  with pytest.raises(UserError, match=r"metric 'loss_std', a name the train records give the poin"):
    metrics.check_step_metrics(["loss", "loss_std"], several=True)
  with pytest.raises(UserError, match=r"metric 'elapsed_sec', a name the train records give their"):
    metrics.check_step_metrics(["loss", "elapsed_sec"], several=False)
