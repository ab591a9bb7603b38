"""Models as flax writes them: a `__call__` without `train`, or with `deterministic`, and an NNX
module, train, evaluate and predict as written; what the step cannot call, or logits of another
width than the data's classes, is one error line before any image is decoded."""

import flax.linen as nn
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from research import checkpoint, configuration, data, models, trained
from research.errors import UserError
from research.setup import setup
from research.train import train_and_evaluate

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)


class _Plain(nn.Module):
  """No mode at all, as flax's examples/mnist linen CNN."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(10)(x.reshape(len(x), -1))


class _Deterministic(nn.Module):
  """The mode named `deterministic`, as flax's transformer examples name it."""

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    x = nn.Dropout(0.5)(x.reshape(len(x), -1), deterministic=deterministic)
    return nn.Dense(10)(x)


class _NeedsRngs(nn.Module):
  @nn.compact
  def __call__(self, x, rngs):
    return nn.Dense(10)(x.reshape(len(x), -1))


class _TenOutputs(nn.Module):
  """Ten logits whatever model.num_classes says."""

  @nn.compact
  def __call__(self, x, train: bool):
    return nn.Dense(10)(x.reshape(len(x), -1))


class _Nnx(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.linear = nnx.Linear(3, 10, rngs=rngs)

  def __call__(self, x):
    return self.linear(x.mean((1, 2)))


for name, make in (
  ("test_plain", _Plain),
  ("test_deterministic", _Deterministic),
  ("test_needs_rngs", _NeedsRngs),
  ("test_ten_outputs", _TenOutputs),
  ("test_nnx_instance", lambda: _Nnx(nnx.Rngs(0))),
):
  models.register(name)(lambda model_config, axis_name, make=make: make())


def _config(model: str):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.model.name = model
  config.update(synthetic_train_size=64, synthetic_test_size=32, synthetic_image_size=8)
  config.update(batch_size=16, eval_batch_size=16, num_train_steps=4, log_every_steps=2)
  return config


@pytest.mark.parametrize("model", ["test_plain", "test_deterministic"])
def test_a_model_without_train_trains_evaluates_and_predicts_as_written(model, tmp_path):
  final = train_and_evaluate(_config(model), str(tmp_path / "run"))
  assert final["eval_examples"] == 32 and np.isfinite(final["eval_loss"])
  run = trained.load(tmp_path / "run")
  assert run.predict(np.zeros((2, 8, 8, 3), np.uint8)).shape == (2, 10)


def test_the_guide_s_nnx_cnn_trains_on_one_channel_images_evaluates_predicts_and_checkpoints(
  tmp_path, guide_module
):
  for part in ("spots", "parts"):  # the NNX CNN and the spots dataset; the loss, Lion, ...
    guide_module(f"myexp/{part}.py")
  config = guide_module("myexp/config.py").get_config("spots")
  config.modules = ()  # myexp is no package here: its parts are registered above
  final = train_and_evaluate(config, str(tmp_path / "run"))
  assert final["eval_examples"] == 64 and final["eval_accuracy"] > 0.5  # 10 classes
  _, saved = checkpoint.read(tmp_path / "run")
  assert saved["batch_stats"]["nnx"]["norm1"]["mean"].shape == (16,)  # its statistics
  run = trained.load(tmp_path / "run")
  probabilities = run.predict(np.zeros((3, 28, 28, 1), np.uint8))
  assert probabilities.shape == (3, 10) and np.allclose(probabilities.sum(-1), 1, atol=1e-5)
  # An image file is read as the run's examples are stored: 28×28, one channel (gray).
  spots = data.DATASETS.get("spots")(config)
  Image.fromarray(spots.test_images[0, ..., 0], "L").save(tmp_path / "spot.png")
  Image.fromarray(np.repeat(spots.test_images[0], 3, -1), "RGB").save(tmp_path / "rgb.png")
  expected = run.predict(spots.test_images[:1])
  for file in ("spot.png", "rgb.png"):  # an RGB file of gray pixels: the same gray
    np.testing.assert_allclose(run.predict([str(tmp_path / file)]), expected, rtol=1e-5, atol=1e-6)
  (row,) = trained.predict(tmp_path / "run", [tmp_path / "spot.png"])
  assert row["classes"] == [run.classes[int(expected.argmax())]]
  # fine-tuned from it: its one-channel weights are taken (init_from), and it trains on
  config.update(init_from=str(tmp_path / "run"), num_train_steps=4)
  tuned = train_and_evaluate(config, str(tmp_path / "tuned"))
  assert tuned["init_from"]["fresh"] == [] and tuned["init_from"]["taken"] > 0  # every array


def test_the_mode_keyword_follows_the_model_s_call():
  assert models.mode(_Deterministic(), train=True) == {"deterministic": False}
  assert models.mode(_TenOutputs(), train=False) == {"train": False}
  assert models.mode(_Plain(), train=True) == {}


@pytest.mark.parametrize(
  "model, message",
  [
    ("test_needs_rngs", r"its __call__ needs rngs, which the step does not pass.*returns Your"),
    ("test_nnx_instance", r"nor an NNX Module class; return the NNX class itself"),
  ],
)
def test_a_model_the_step_cannot_call_is_one_error_line(model, message):
  with pytest.raises(UserError, match=message) as error:
    setup(_config(model))
  assert "\n" not in str(error.value)


def test_logits_of_another_width_than_the_classes_stop_before_any_image_is_decoded(tmp_path):
  for split in ("train", "test"):
    for label in ("a", "b", "c"):
      (tmp_path / split / label).mkdir(parents=True)
      Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / split / label / "0.png")
  (tmp_path / "train" / "a" / "broken.png").write_bytes(b"not a png")  # decoding would fail
  config = _config("test_ten_outputs")
  config.update(dataset="folder", data_dir=str(tmp_path), host_image_size=8)
  config.model.num_classes = 3
  with pytest.raises(UserError, match=r"returns \(1, 10\).*3 classes need logits \[batch, 3\]"):
    setup(config)
