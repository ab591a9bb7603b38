"""Every config loads; every training config's :smoke variant trains end to end on 8 devices."""

import json
from pathlib import Path

import jax
import optax
import pytest

from research import configuration, models
from research.errors import UserError
from research.steps import AXIS, create_train_state
from research.train import train_and_evaluate

CONFIGS = sorted(
  str(p) for p in Path("configs").glob("*.py") if p.stem not in ("__init__", "common")
)


def _training_configs():
  return [c for c in CONFIGS if configuration.load(c).experiment == "train"]


@pytest.mark.parametrize("path", CONFIGS)
def test_config_loads_and_its_docstring_shows_the_command(path):
  config = configuration.load(path)
  assert config.experiment
  assert f"./launch.sh {path}" in Path(path).read_text()


@pytest.mark.parametrize("path", CONFIGS)
def test_smoke_variant_exists(path):
  assert configuration.load(f"{path}:smoke")


def test_a_file_without_get_config_is_not_a_config():
  with pytest.raises(UserError, match=r"configs/common.py defines no get_config\(\)") as e:
    configuration.load("configs/common.py")
  assert "configs/cifar_vgg.py" in str(e.value) and str(e.value).count("common.py") == 1


def test_unknown_variant_lists_the_variants():
  with pytest.raises(UserError, match="unknown config variant 'smok'.*smoke"):
    configuration.load("configs/cifar_vgg.py:smok")


def test_keras_cnn_has_the_keras_example_parameter_count():
  model = models.create(configuration.load("configs/cifar_keras_cnn.py").model, AXIS)
  state = create_train_state(jax.random.key(0), None, model, (32, 32, 3), tx=optax.sgd(0.1))
  assert sum(x.size for x in jax.tree.leaves(state.params)) == 1_250_858


def _records(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("path", _training_configs())
def test_smoke_trains_end_to_end_and_learns(path, tmp_path):
  config = configuration.load(f"{path}:smoke")
  final = train_and_evaluate(config, str(tmp_path))

  records = _records(tmp_path)
  train = [r for r in records if "loss" in r]
  assert len(train) >= 3
  first, last = train[1], train[-1]  # train[0] is step 1 alone: one batch, too noisy
  assert last["loss"] < first["loss"]  # learnable synthetic data: loss falls
  assert last["accuracy"] > first["accuracy"]  # and accuracy rises
  for field in ("examples_per_sec", "sec_per_batch", "param_norm", "input_wait_fraction"):
    assert all(r[field] >= 0 for r in train)
  assert records[-1]["eval_examples"] == config.synthetic_test_size == final["eval_examples"]
  # The eval sees what training learnt (BatchNorm's running statistics, if any, kept up).
  assert final["eval_accuracy"] >= 2 / config.model.num_classes, final
  assert final["train_sec"] > 0 and final["compile_sec"] > 0  # measured apart
  assert final["eval_sec"] > 0 and final["eval_compile_sec"] > 0  # resident: compiled ahead
  assert all(r["dataset_used"] == "synthetic" for r in records)
  assert json.loads((tmp_path / "config.json").read_text())["model"]["name"] == config.model.name
  meta = json.loads((tmp_path / "metadata.jsonl").read_text().splitlines()[-1])
  assert meta["dataset_used"] == "synthetic" and len(meta["devices"]) == meta["device_count"] == 8
  assert config.batch_size // 8 % meta["micro_batch"] == 0  # what the step ran, recorded
