"""docs/extending.md is a tested document: its fork package, copied verbatim beside research/,
registers all five kinds of part and trains, evaluates and predicts through ./launch.sh."""

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
import pytest
from PIL import Image

from research import (
  augment,
  configuration,
  fields,
  host_memory,
  losses,
  main,
  metrics,
  models,
  steps,
  trained,
  validate,
)
from research.errors import UserError
from research.placement import first_replica, replicate
from research.setup import setup
from research.train import train_and_evaluate
from tests import float64, guide

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

ROOT = Path(__file__).parent.parent


def _command(scratch, capsys, call) -> subprocess.CompletedProcess:
  """A command of the fork's checkout run in this process: its return code (0 where it returns
  nothing), output and error; the fork's modules are imported from `scratch` for it alone."""
  sys.path.insert(0, str(scratch))
  capsys.readouterr()
  try:
    with guide.registered():
      code = call() or 0
  finally:
    sys.path.remove(str(scratch))
    for name in [m for m in sys.modules if m == "myexp" or m.startswith("myexp.")]:
      del sys.modules[name]
  out = capsys.readouterr()
  return subprocess.CompletedProcess((), code, out.out, out.err)


def _main(monkeypatch, argv) -> int:
  """research.main as its command line runs it, leaving this process's malloc and garbage
  collector as the suite has them (research/host_memory.py's one arena, for the rest of the
  process, would slow every compile after it), as tests/test_cli.py runs it."""
  monkeypatch.setattr(sys, "argv", ["research.main", *argv])
  monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: False)
  monkeypatch.setattr(main, "_freeze_start_up_objects", lambda: None)  # the collector too
  return main.main()


def test_the_fork_package_copied_verbatim_trains_evaluates_predicts_and_loads(
  tmp_path, capsys, monkeypatch
):
  files = guide.files()
  assert sorted(files) == [
    "myexp/__init__.py", "myexp/config.py", "myexp/model.py", "myexp/parts.py",
    "myexp/spots.py", "myexp/vgg_lion.py",
  ]  # fmt: skip
  scratch = tmp_path / "checkout"

  def ignore(directory, names):  # the checkout's own files: no venv, runs, caches or scratch
    top = Path(directory) == ROOT
    return [n for n in names if n == "__pycache__" or top and (n.startswith(".") or n == "runs")]

  shutil.copytree(ROOT, scratch, ignore=ignore)
  for path, text in files.items():
    assert not (scratch / path).exists(), f"{path} is in the repository; the guide adds it"
    (scratch / path).parent.mkdir(exist_ok=True)
    (scratch / path).write_text(text)
  ruff = Path(sys.executable).parent / "ruff"
  for check in (["check"], ["format", "--check"]):
    result = subprocess.run(
      [str(ruff), *check, "myexp"], cwd=scratch, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr

  # As research.main and research.trained run them, in this process: each command imports the
  # fork's modules itself (they are forgotten, and their parts unregistered, after each).
  workdir = scratch / "runs" / "myexp"
  argv = [f"--config={scratch / 'myexp' / 'config.py'}:smoke", f"--workdir={workdir}"]
  train = _command(scratch, capsys, lambda: _main(monkeypatch, argv))
  assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in records if "loss" in r]
  final = [r for r in records if "eval_accuracy" in r][-1]
  assert len(losses) >= 3 and losses[-1] < losses[0]  # the focal loss falls under Lion
  assert final["eval_examples"] == 256 and final["eval_accuracy"] > 0.6  # 2 classes
  assert final["eval_loss_kind"] == "cross_entropy" and final["eval_top5"] == 1.0  # 2 classes
  assert 0.5 < final["eval_balanced_accuracy"] <= 1  # its classes' mean: neither class left out
  assert final["eval_weights"] == "ema"  # the smoke run's ema_decay
  assert json.loads((workdir / "config.json").read_text())["modules"] == ["myexp"]

  # eval and predict import the run's modules themselves: the names are in its config.
  evaluated = _command(scratch, capsys, lambda: trained.main(["eval", str(workdir)]))
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  assert f"accuracy = {final['eval_accuracy']:.4f}" in evaluated.stdout
  assert "top5 = 1.0000" in evaluated.stdout
  assert f"balanced_accuracy = {final['eval_balanced_accuracy']:.4f}" in evaluated.stdout
  Image.new("RGB", (32, 32), (90, 90, 90)).save(tmp_path / "grey.png")
  argv = ["predict", str(workdir), str(tmp_path / "grey.png")]
  predicted = _command(scratch, capsys, lambda: trained.main(argv))
  assert predicted.returncode == 0 and "grey.png" in predicted.stdout, predicted.stderr[-2000:]
  shape = lambda: print(trained.load(workdir).predict(np.zeros((1, 32, 32, 3), np.uint8)).shape)
  python = _command(scratch, capsys, shape)
  assert python.stdout.strip() == "(1, 2)", python.stderr[-2000:]

  # A config built on another's adds its variant and keeps the parent's; it passes the checks a
  # run makes before its data loads (myexp's Lion trains above, cifar_vgg's :smoke in
  # tests/test_configs.py).
  def built():
    for spec in ("vgg_lion.py:smoke,lion", "config.py:spots"):  # :spots: test_model_calls.py
      c = configuration.load(str(scratch / "myexp" / spec))
      validate.train_config(c, jax.device_count())
      print(c.model.name, c.model.get("depth"), c.dataset, c.optimizer, c.modules)

  lines = _command(scratch, capsys, built).stdout.splitlines()
  assert lines == ["vgg 11 synthetic lion ('myexp',)", "cnn None spots lion ('myexp',)"]


def test_the_guide_s_balanced_accuracy_is_the_mean_of_each_class_s_accuracy(guide_module):
  """Summed over the split by the eval (each example once, padding masked), finished once."""
  guide_module("myexp/parts.py")
  rng = np.random.default_rng(0)
  logits, labels = rng.normal(size=(50, 4)).astype(np.float32), rng.integers(0, 3, 50)  # no 3
  mask = (np.arange(50) < 45).astype(np.float32)  # the last 5: an eval batch's padding
  named = metrics.shapes(("balanced_accuracy",), 4)
  preprocess = augment.build("")
  state = trained.Weights({}, {}, lambda variables, x, train: logits)  # the logits above
  images = np.zeros((50, 1, 1, 3), np.uint8)
  totals = steps.eval_sums(state, images, labels, mask, preprocess=preprocess, metrics=named)
  value = metrics.eval_record(1, totals)["eval_balanced_accuracy"]
  right, real = logits.argmax(-1) == labels, mask > 0
  expected = np.mean([right[real & (labels == k)].mean() for k in range(3)])
  assert value == pytest.approx(expected, rel=1e-12)


class _Linear(nn.Module):
  dtype: str = "float32"  # its computation's and its parameters'

  @nn.compact
  def __call__(self, x, train: bool):
    return nn.Dense(10, dtype=self.dtype, param_dtype=self.dtype)(x.reshape(len(x), -1))


# The pmapped step and the reference below differ in the order of sums only (the gradient of 16
# examples' mean over 2 devices, then its norm), and the step's 1e-12 beside the norm: in float64
# (tests/float64.py) 4.3e-14 apart at most on both kernel sets; each device perturbing by its own
# gradient (the first pmean left out of the guide's step): 9.0e-3.
def test_the_guide_s_sam_step_applies_the_gradient_at_the_perturbed_weights(guide_module, x64):
  parts = guide_module("myexp/parts.py")
  assert steps.STEPS.get("sam") is parts.sam
  rng = np.random.default_rng(0)
  images_u8, labels = rng.integers(0, 256, (16, 4, 4, 3), np.uint8), rng.integers(0, 10, 16)
  model, rho, tx = (
    _Linear("float64"),
    0.05,
    optax.sgd(1.0),
  )  # lr 1: the update is minus the gradient
  state = steps.create_train_state(jax.random.key(0), None, model, (4, 4, 3), tx)
  config = ml_collections.ConfigDict({"sam_rho": rho, "label_smoothing": 0.0})
  run = steps.Run(
    step=parts.sam,
    gather=lambda step, batch: steps.Examples(*batch),
    augment=augment.build(""),
    loss_fn=losses.cross_entropy,
    num_classes=10,
    fields=fields.of_part(steps.STEPS, "sam", config),
    loss_fields=fields.of_part(losses.LOSSES, "cross_entropy", config),
  )
  step = functools.partial(steps.train_step, run=run)
  devices = jax.local_devices()[:2]
  split = lambda x: x.reshape(2, -1, *x.shape[1:])
  keys = jax.random.wrap_key_data(np.broadcast_to(jax.random.key_data(jax.random.key(1)), (2, 2)))
  batch = (split(images_u8), split(labels), keys)
  rstate, metrics = jax.pmap(step, axis_name=steps.AXIS, devices=devices)(
    replicate(state, devices), batch
  )
  taken = first_replica(rstate.params)

  def loss(params):  # the mean loss over the whole batch, on one device
    logits = model.apply({"params": params}, images_u8 / 255.0, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  g = jax.grad(loss)(state.params)
  perturbed = jax.tree.map(lambda p, d: p + rho * d / optax.tree.norm(g), state.params, g)
  expected = jax.tree.map(lambda p, d: p - d, state.params, jax.grad(loss)(perturbed))
  assert jax.tree.leaves(taken)[0].dtype == np.float64
  float64.assert_close(taken, expected, start=state.params, what="update")
  float64.assert_close(first_replica(metrics)["loss"], loss(state.params), what="loss")
  assert first_replica(metrics)["sam_loss"] > first_replica(metrics)["loss"]  # uphill


@steps.register("test_applied_learning_rate")
def _applied_learning_rate(state, batch, run):
  """The shipped step, which also reports the learning rate its update applied: plain SGD
  moves the parameters by lr times the gradient."""
  new_state, metrics = steps.standard_step(state, batch, run)
  moved = optax.tree.norm(jax.tree.map(lambda a, b: a - b, new_state.params, state.params))
  metrics["applied_learning_rate"] = moved / metrics["grad_norm"]
  return new_state, metrics


models.register("test_linear")(lambda model_config, axis_name: _Linear())


# Each parameter after the update is rounded to a unit (6e-8) of itself, and so is its
# difference from before: the moved norm is off by at most 2·6e-8·|params| = 1e-6 here, against
# moves of lr·|g| >= 3e-3 once the warm-up's first step (lr 0, moved exactly 0) is past.
def test_the_logged_learning_rate_is_the_one_applied_under_the_guide_s_schedule(
  tmp_path, guide_module
):
  guide_module("myexp/parts.py")  # registers warmup_cosine
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.model.name, config.step = "test_linear", "test_applied_learning_rate"
  config.update(synthetic_train_size=64, synthetic_test_size=16, synthetic_image_size=4)
  config.update(batch_size=16, eval_batch_size=16, num_train_steps=-1, num_epochs=3)
  config.update(log_every_steps=1, optimizer="sgd", momentum=0.0, weight_decay=0.0)
  config.update(schedule="warmup_cosine", learning_rate=0.5, lr_batch_size=0, augment="")
  config.warmup_steps = 4
  train_and_evaluate(config, str(tmp_path / "run"))
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
  trained = [r for r in records if "loss" in r]
  assert [r["step"] for r in trained] == list(range(1, 13))  # 3 epochs of 4 steps: 12
  logged = np.array([r["learning_rate"] for r in trained])
  applied = np.array([r["applied_learning_rate"] for r in trained])
  np.testing.assert_allclose(applied, logged, rtol=1e-4, atol=1e-6)
  expected = optax.warmup_cosine_decay_schedule(0.0, 0.5, 4, 12)(np.arange(12))
  np.testing.assert_allclose(logged, expected, rtol=1e-6)  # told the length the epochs set


def test_a_schedule_that_refuses_the_run_s_length_is_one_error_line(tmp_path, guide_module):
  """The guide's warm-up + cosine (optax's constructor) over a run no longer than its warm-up:
  optax's ValueError becomes one error line, from setup, which writes nothing."""
  guide_module("myexp/parts.py")
  config = guide_module("myexp/config.py").get_config("spots")
  config.modules, config.num_train_steps = (), 2  # its warm-up: 2 steps
  guide_module("myexp/spots.py")
  with pytest.raises(UserError, match=r"schedule='warmup_cosine' refuses this run's numbers") as e:
    setup(config)
  assert "\n" not in str(e.value)
