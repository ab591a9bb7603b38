"""Every kind of part is registered one way: found by name, an unknown name or a clash is one
user error, a fork's modules are imported before the config is checked (docs/extending.md)."""

import subprocess
import sys

import pytest

from research import augment, configuration, data, losses, models, optim, steps, validate
from research.errors import UserError
from research.registry import Registry

REGISTRIES = {
  "model.name": (models.MODELS, "vgg"),
  "loss": (losses.LOSSES, "cross_entropy"),
  "dataset": (data.DATASETS, "cifar10"),
  "optimizer": (optim.OPTIMIZERS, "sgd"),
  "step": (steps.STEPS, "standard"),
}


def _config(**fields):
  config = configuration.load("configs/cifar_vgg.py:smoke")
  config.update(fields)
  return config


@pytest.mark.parametrize("field, value", [
  ("model.name", "resnet_from_a_paper"), ("loss", "focal"), ("dataset", "npz"),
  ("optimizer", "lion"), ("augment", "cutout(8)|standardize"), ("step", "sam"),
])  # fmt: skip
def test_an_unknown_name_is_one_error_listing_the_registered_and_how_to_add_one(field, value):
  config = _config()
  if field == "model.name":
    config.model.name = value
  else:
    config[field] = value
  with pytest.raises(UserError) as error:
    validate.train_config(config, 8)
  message = str(error.value)
  assert "config.modules" in message and "\n" not in message
  shipped = {"model.name": "vgg", "loss": "cross_entropy", "dataset": "cifar10",
             "optimizer": "sgd", "augment": "crop", "step": "standard"}[field]  # fmt: skip
  assert shipped in message


def test_with_modules_named_the_error_says_which_registered_nothing_of_that_name():
  config = _config(optimizer="lion", modules=("research.losses",))
  with pytest.raises(UserError, match=r"modules research\.losses registered no 'lion'"):
    validate.train_config(config, 8)


@pytest.mark.parametrize("registry, shipped", REGISTRIES.values(), ids=list(REGISTRIES))
def test_a_name_registered_twice_is_an_error(registry, shipped):
  with pytest.raises(UserError, match=f"{shipped!r} is registered twice"):
    registry.register(shipped)(lambda *args: None)


def test_an_augmentation_op_registered_twice_is_an_error():
  with pytest.raises(UserError, match="'crop' is registered twice"):
    augment.register("crop")(lambda: None)


def test_a_module_imported_again_registers_the_same_part_again():
  registry = Registry("thing", "thing", "research.things")

  def part():
    return 1

  registry.register("part")(part)
  registry.register("part")(part)  # the same definition: no clash
  assert registry.get("part") is part


def test_a_fork_registers_each_kind_and_the_config_finds_it(tmp_path, monkeypatch):
  (tmp_path / "fork_parts.py").write_text(
    "import optax\n"
    "from research import augment, data, losses, optim, steps\n"
    "losses.register('fork_loss')(losses.cross_entropy)\n"
    "optim.register('fork_sgd')(lambda learning_rate, fields: optax.sgd(learning_rate))\n"
    "augment.register('fork_identity')(lambda: lambda rng, image: image)\n"
    "data.register('fork_data', num_classes=10)(data.synthetic.load)\n"
    "steps.register('fork_step')(steps.standard_step)\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  config = _config(modules=("fork_parts",), loss="fork_loss", optimizer="fork_sgd")
  config.update(dataset="fork_data", augment="fork_identity|standardize", step="fork_step")
  validate.train_config(config, 8)  # imports fork_parts, then finds each name
  assert losses.LOSSES.get("fork_loss") is losses.cross_entropy
  assert steps.STEPS.get("fork_step") is steps.standard_step


def test_a_module_that_does_not_import_is_one_error():
  with pytest.raises(UserError, match=r"modules: 'no_such_fork' does not import"):
    configuration.import_modules(_config(modules=("no_such_fork",)))


def test_a_config_builds_on_another_and_adds_its_variants():
  from configs import cifar_vgg
  from configs.common import extend

  variants = {"tiny_lr": lambda c: c.update(learning_rate=1e-3)}
  config = extend(cifar_vgg, "smoke,tiny_lr", variants)
  assert config.dataset == "synthetic" and config.learning_rate == 1e-3  # both applied
  with pytest.raises(UserError, match="unknown config variant 'adamw'.*smoke.*tiny_lr"):
    extend(cifar_vgg, "adamw", variants)


@pytest.mark.end_to_end
def test_a_model_averaging_over_an_axis_the_step_lacks_stops_before_the_workdir(tmp_path):
  (tmp_path / "other_axis.py").write_text(
    "import flax.linen as nn\n"
    "from research import models\n"
    "class Net(nn.Module):\n"
    "  @nn.compact\n"
    "  def __call__(self, x, train):\n"
    "    x = nn.BatchNorm(use_running_average=not train, axis_name='replicas')(x)\n"
    "    return nn.Dense(10)(x.mean((1, 2)))\n"
    "models.register('other_axis')(lambda model_config, axis_name: Net())\n"
  )
  workdir = tmp_path / "run"
  command = [
    sys.executable, "-m", "research.main", "--config=configs/cifar_vgg.py:smoke",
    f"--workdir={workdir}", "--config.modules=('other_axis',)",
    "--config.model.name=other_axis",
  ]  # fmt: skip
  env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
  result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: model 'other_axis' averages over an axis")
  assert "'batch'" in lines[0] and not workdir.exists()


def test_a_name_the_model_s_code_lacks_keeps_its_own_error():
  """Only JAX's unbound axis is the model's axis error; a NameError of the model's own code
  (a typo) is not mistaken for one."""

  def step():
    raise NameError("name 'widht' is not defined")

  with pytest.raises(NameError, match="name 'widht' is not defined"):
    steps.axis_checked(step, "net")()
