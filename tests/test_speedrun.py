"""The mechanisms the fastest CIFAR-10 recipe (configs/cifar_speedrun.py) needs, each usable by
any config: parameters from data, parameter groups, the summed loss, epoch-aware ops, eval
views, bfloat16 compute; and its step on 8 devices equal to its step on 1."""

import dataclasses
import functools
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util

from research import augment, configuration, cpu_forms, models, optim, steps, train, validate
from research.errors import UserError
from research.models import speedrun
from research.placement import first_replica, replicate
from research.setup import setup
from research.steps import AXIS
from research.train import train_and_evaluate
from tests import float64

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

SMOKE = "configs/cifar_speedrun.py:smoke"


@pytest.fixture(scope="module")
def training():
  return setup(configuration.load(SMOKE))


@pytest.fixture(scope="module")
def training64():
  """The recipe in float64 (tests/float64.py): for the steps compared with another order."""
  with float64.on():
    return setup(float64.config(SMOKE))


def _one_step(training, state, images_u8, labels, n_devices, **bind):
  """One pmapped step of the config's step over `n_devices`, the global batch split evenly."""
  devices = jax.local_devices()[:n_devices]
  as_given = lambda step, batch: steps.Examples(*batch)
  bind = dict(gather=as_given, micro_batch=None, **bind)  # the whole device batch at once
  run = dataclasses.replace(training.run, **bind)
  step = jax.pmap(functools.partial(steps.train_step, run=run), AXIS, devices=devices)
  split = lambda x: x.reshape(n_devices, -1, *x.shape[1:])
  keys = jax.random.wrap_key_data(
    np.broadcast_to(jax.random.key_data(jax.random.key(1)), (n_devices, 2))
  )
  new_state, metrics = step(replicate(state, devices), (split(images_u8), split(labels), keys))
  return first_replica(new_state), first_replica(metrics)


def _batch(n=64, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n)


def _newton_schulz(x):
  """One of Muon's Newton-Schulz steps on a singular value: optax's quintic (its default)."""
  return 3.4445 * x - 4.7750 * x**3 + 2.0315 * x**5


def test_muon_in_bfloat16_keeps_its_momentum_and_orthogonalises_in_bfloat16(training):
  """`muon_dtype="bfloat16"` (a parameter group's field): the filters' momentum is bfloat16,
  their update finite and, computed in bfloat16, orthogonalised as the recipe's 3
  Newton-Schulz steps orthogonalise; the speedrun's "model" follows `model.dtype` (float32
  keeps the state's layout); another dtype is an error line."""
  config = configuration.load(SMOKE)
  params = training.state.params
  momenta = lambda state: [
    leaf.dtype
    for path, leaf in jax.tree_util.tree_leaves_with_path(state)
    if "mu" in jax.tree_util.keystr(path) and "conv" in jax.tree_util.keystr(path)
  ]
  init = lambda config: jax.eval_shape(optim.create_optimizer(config, 1, 10).init, params)
  assert config.param_groups.filters.muon_dtype == "model"
  assert set(momenta(init(config))) == {jnp.dtype("float32")}
  config.model.dtype = "bfloat16"
  assert set(momenta(init(config))) == {jnp.dtype("bfloat16")}
  config.model.dtype = "float32"
  config.param_groups.filters.muon_dtype = "bfloat16"
  tx = optim.create_optimizer(config, 1, 10)
  state = jax.jit(tx.init)(params)
  assert set(momenta(state)) == {jnp.dtype("bfloat16")}
  grads = jax.tree.map(lambda p: np.full_like(p, 1e-3), params)
  updates, _ = jax.jit(tx.update)(grads, state, params)
  assert all(bool(jnp.isfinite(u).all()) for u in jax.tree.leaves(updates))
  # Orthogonalised: each filter's gradient, as the matrix Muon takes ([3·3·in, out]), has
  # singular values s from 1 to 10; Muon alone (learning rate 1, no decay, no renormalising)
  # gives singular values p(p(p(s / |s|))), p a Newton-Schulz step: 0.68 to 1.20 in exact
  # arithmetic (float32: within 1e-6 of it). bfloat16 rounds every product of the 3 steps to 8
  # bits: measured within 0.052 of it (5 draws of 6 kernels, on both of .ci/run's kernel sets,
  # 2026-11-27); the bound allows twice that, and a gradient not orthogonalised stays 1 to 10.
  fields = optim.group_fields(config)["filters"]
  fields.update(weight_decay=0.0, normalize_weights=False)
  muon = optim.muon(1.0, fields)
  flat = traverse_util.flatten_dict(params, sep="/")
  kernels = {name: p for name, p in flat.items() if re.search(fields.match, name)}
  assert len(kernels) == 6  # 2 convolutions in each of 3 groups
  rng, grads, expected = np.random.default_rng(0), {}, {}
  for name, kernel in kernels.items():
    rows, columns = int(np.prod(kernel.shape[:-1])), kernel.shape[-1]
    u = np.linalg.qr(rng.standard_normal((rows, columns)))[0]  # orthonormal columns
    v = np.linalg.qr(rng.standard_normal((columns, columns)))[0]
    singular = np.geomspace(1, 10, columns)
    grads[name] = (u * singular @ v.T).reshape(kernel.shape).astype(np.float32)
    expected[name] = singular / np.linalg.norm(singular)  # Muon scales the matrix to norm 1
    for _ in range(fields.ns_steps):  # 3, the recipe's
      expected[name] = _newton_schulz(expected[name])
  updates, _ = jax.jit(muon.update)(grads, muon.init(kernels), kernels)
  for name, update in updates.items():
    assert update.dtype == jnp.bfloat16, name
    matrix = np.asarray(update, np.float64).reshape(-1, update.shape[-1])
    singular = np.linalg.svd(matrix, compute_uv=False)
    np.testing.assert_allclose(np.sort(singular), np.sort(expected[name]), atol=0.1, err_msg=name)
  config.param_groups.filters.muon_dtype = "int8"
  with pytest.raises(UserError, match="param_groups.filters.muon_dtype='int8' is not one of"):
    validate.train_config(config, 8)


def _convolutions(step, state, training) -> int:
  """The convolutions in `step`'s program, with XLA's own convolutions (no CPU forms)."""
  batch = next(training.inputs.batches(0))
  with cpu_forms.without_cpu_forms():
    text = jax.pmap(step, axis_name=AXIS).lower(state, batch).as_text()
  return text.count("stablehlo.convolution")


def test_the_frozen_whitening_kernel_is_not_differentiated(training):
  """The step has the convolutions it needs: 7 forward, a kernel gradient for each of the 6
  trained ones (not for the frozen whitening), an input gradient for the 6 after the
  whitening (its bias trains for 3 epochs)."""
  state = replicate(training.state)
  assert _convolutions(training.train_step, state, training) == 7 + 6 + 6
  unfrozen = functools.partial(steps.train_step, run=dataclasses.replace(training.run, frozen=None))
  assert _convolutions(unfrozen, state, training) == 7 + 7 + 6


def test_the_whitening_in_float32_on_the_device_is_the_float64_one_to_1e_4():
  """The filters from `data_statistics` (float32, the device's program) and `init_from_data`
  match a float64 covariance of all 2×2 patches to 1e-4 of their largest entry, on real
  CIFAR-10 images as the recipe's eval shows them (the committed slice: 240 images)."""
  from PIL import Image

  config = configuration.load("configs/cifar_speedrun.py")
  paths = sorted(Path(__file__).parent.glob("data/cifar10_slice/*/*/*.jpg"))
  images_u8 = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths])
  preprocess = augment.build(config.eval_preprocess, 0).first_view
  images = jax.jit(preprocess)(jax.random.key(0), images_u8)
  statistics = jax.device_get(jax.jit(functools.partial(speedrun.data_statistics, None))(images))
  params = {"whiten": {"kernel": None, "bias": None}}
  view = models.view(config.model)
  kernel = speedrun.init_from_data(view, params, statistics)["whiten"]["kernel"]

  patches = np.lib.stride_tricks.sliding_window_view(np.asarray(images), (2, 2), axis=(1, 2))
  patches = patches.transpose(0, 1, 2, 4, 5, 3).reshape(-1, 12).astype(np.float64)
  eigenvalues, eigenvectors = np.linalg.eigh(patches.T @ patches / len(patches))
  scaled = eigenvectors / np.sqrt(eigenvalues + config.model.whiten_eps)
  expected = np.concatenate([scaled, -scaled], axis=1).reshape(2, 2, 3, 24)
  assert np.abs(np.asarray(kernel) - expected).max() <= 1e-4 * np.abs(expected).max()


# In float64 (tests/float64.py): the loss, the update and the BatchNorm statistics 7.9e-16 apart
# at most, relative, on the default kernels, 8.2e-16 on the other set; one device's gradient in
# place of the devices' mean: 2.7.
def test_the_recipe_s_step_on_8_devices_equals_its_step_on_1(training64, x64):
  training = training64
  state = training.from_data(training.state)
  deterministic = augment.build("normalize")  # the same pixels on any device count
  one, m1 = _one_step(training, state, *_batch(), 1, augment=deterministic)
  eight, m8 = _one_step(training, state, *_batch(), 8, augment=deterministic)
  float64.assert_close(m8["loss"], m1["loss"], what="loss")
  float64.assert_close(eight.params, one.params, start=state.params, what="update")
  float64.assert_close(eight.batch_stats, one.batch_stats, what="statistics")


def test_the_whitening_filters_come_from_the_data_and_whiten_it(training):
  state = training.from_data(training.state)
  config = configuration.load(SMOKE)
  images = training.inputs.first_images(config.model.init_examples, config.seed)
  images = np.asarray(jax.jit(augment.build("normalize"))(jax.random.key(0), images))
  kernel = np.asarray(state.params["whiten"]["kernel"])  # [2, 2, 3, 24]: 12 filters and negatives
  np.testing.assert_allclose(kernel[..., 12:], -kernel[..., :12])
  out = jax.lax.conv_general_dilated(
    images, kernel[..., :12], (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  flat = np.asarray(out, np.float64).reshape(-1, 12)
  covariance = flat.T @ flat / len(flat)  # whitened: the identity, less what whiten_eps keeps
  assert np.abs(covariance - np.diag(np.diag(covariance))).max() < 1e-3
  assert np.diag(covariance).min() > 0.5 and np.diag(covariance).max() < 1.001
  assert not np.allclose(kernel, training.state.params["whiten"]["kernel"])


def test_the_warm_up_run_changes_nothing_the_run_computes(tmp_path):
  """`warm_up` (the recipe's default) runs the step and the eval once before the clock on a
  copy of the state: the run's losses and final eval are the same, bit for bit, without it."""
  runs = {}
  for warm_up in (True, False):
    config = configuration.load(SMOKE)
    config.num_train_steps, config.log_every_steps, config.warm_up = 3, 1, warm_up
    final = train_and_evaluate(config, str(tmp_path / str(warm_up)))
    lines = (tmp_path / str(warm_up) / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in lines if '"loss"' in line]
    runs[warm_up] = (losses, final["eval_loss"], final["eval_accuracy"])
  assert runs[True] == runs[False]


def test_a_resumed_run_takes_its_data_computed_parameters_from_the_checkpoint(
  tmp_path, monkeypatch
):
  config = configuration.load(SMOKE)
  config.num_train_steps, config.log_every_steps = 2, 1
  config.eval_every_steps = 1  # as the full config's every 25: the first view, mid-run
  assert train_and_evaluate(config, str(tmp_path))["init_from_data_sec"] > 0  # timed apart
  hooks = models.MODELS.options["speedrun"]  # what the model registered with
  monkeypatch.setitem(hooks, "init_from_data", lambda *a: pytest.fail("computed again"))
  config.num_train_steps = 3
  train_and_evaluate(config, str(tmp_path))  # resumes at step 2
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in records if "eval_accuracy" in r]
  assert [r["step"] for r in evals] == [1, 2, 3]
  assert [("eval_accuracy_first_view" in r) for r in evals] == [False, True, True]  # TTA: final


def _groups_config(**groups):
  config = configuration.load(SMOKE)
  config.param_groups = ml_collections.ConfigDict(groups)
  return config


def _update(config, params, grads, steps_done=0, num_steps=10):
  """The optimizer's update after `steps_done` steps of the same gradient."""
  tx = optim.create_optimizer(config, 1, num_steps)
  opt_state, update = jax.jit(tx.init)(params), jax.jit(tx.update)  # one program each
  for _ in range(steps_done + 1):
    updates, opt_state = update(grads, opt_state, params)
  return updates


def test_parameter_groups_freeze_end_early_and_orthogonalise():
  params = {
    "a": {"kernel": jnp.ones((3, 3, 4, 8))},
    "b": {"bias": jnp.ones(8)},
    "c": {"bias": jnp.ones(8)},
  }
  keys = iter(jax.random.split(jax.random.key(0), 3))
  grads = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), params)  # full rank
  config = _groups_config(
    frozen=dict(match=r"^c/", optimizer="frozen"),
    early=dict(match=r"^b/", optimizer="sgd", learning_rate=0.1, momentum=0.0, train_fraction=0.5),
    muon=dict(match=r"kernel$", optimizer="muon", learning_rate=1.0, momentum=0.0, ns_steps=5),
  )
  first, late = _update(config, params, grads), _update(config, params, grads, steps_done=6)
  assert not np.any(first["c"]["bias"]) and not np.any(late["c"]["bias"])
  np.testing.assert_allclose(first["b"]["bias"], -0.1 * grads["b"]["bias"], rtol=1e-6)
  assert not np.any(late["b"]["bias"])  # its half of the 10 steps is over
  matrix = np.asarray(first["a"]["kernel"]).reshape(36, 8)  # [kh·kw·in, out]
  singular = np.linalg.svd(matrix, compute_uv=False)
  assert singular.min() > 0.6 and singular.max() < 1.3  # orthogonalised: all near 1


def test_muon_can_renormalise_each_kernel_before_its_update():
  params = {"k": {"kernel": 3.0 * jnp.ones((3, 3, 2, 4))}}
  grads = {"k": {"kernel": jnp.ones((3, 3, 2, 4))}}
  config = _groups_config(
    k=dict(match="kernel", optimizer="muon", learning_rate=1e-9, normalize_weights=True)
  )
  updates = _update(config, params, grads)
  new = params["k"]["kernel"] + updates["k"]["kernel"]
  np.testing.assert_allclose(np.linalg.norm(new), 2.0, rtol=1e-5)  # sqrt(4 output channels)


def test_a_parameter_group_that_matches_nothing_is_an_error(training):
  config = _groups_config(typo=dict(match="^haed/", optimizer="frozen"))
  with pytest.raises(UserError, match=r"param_groups.typo.match='\^haed/' matches no parameter"):
    optim.labels(config.param_groups, training.state.params)


def _with_optimizer(state, config, learning_rate):
  config.learning_rate = learning_rate
  tx = optim.create_optimizer(config, 1, 100)
  return state.replace(tx=tx, opt_state=tx.init(state.params))


# The summed loss with the learning rate / 32 and the mean loss: one update in two orders of
# scaling. In float64 (tests/float64.py) the logged loss and the update are 0 apart (×32 is
# exact) on both kernel sets; the summed loss without its first example: 3.1e-2.
def test_the_summed_loss_steps_as_the_mean_loss_with_the_batch_times_the_learning_rate(
  training64, x64
):
  training = training64
  state = training.from_data(training.state)
  images, labels = _batch(32)
  plain = augment.build("normalize")
  config = float64.config(SMOKE)
  config.param_groups = ml_collections.ConfigDict()
  config.optimizer, config.momentum, config.weight_decay = "sgd", 0.0, 0.0
  lr = config.learning_rate
  (a, ma), (b, mb) = [
    _one_step(training, _with_optimizer(state, config, lr * lr_factor), images, labels, 1,
              augment=plain, loss_scale=loss_scale)
    for lr_factor, loss_scale in ((1, 32.0), (32, 1.0))
  ]  # fmt: skip
  float64.assert_close(ma["loss"], mb["loss"], what="loss")  # the logged loss is the mean
  float64.assert_close(a.params, b.params, start=state.params, what="update")


def test_the_alternating_flip_mirrors_each_example_the_other_way_every_other_epoch():
  flip = jax.jit(augment.build("flip_alternating", seed=0))
  images = np.random.default_rng(0).integers(0, 256, (64, 4, 4, 3), dtype=np.uint8)
  ids = jnp.arange(64) * 7
  by_epoch = [np.asarray(flip(jax.random.key(e), images, epoch=e, ids=ids)) for e in range(3)]
  mirror = images[:, :, ::-1] / 255
  mirrored = [np.all(np.abs(x - mirror) < 1e-6, axis=(1, 2, 3)) for x in by_epoch]
  np.testing.assert_array_equal(mirrored[0], mirrored[2])  # the example's own draw
  np.testing.assert_array_equal(mirrored[1], ~mirrored[0])  # odd epochs: the other way
  assert 16 < mirrored[0].sum() < 48
  half = np.asarray(flip(jax.random.key(9), images[:32], epoch=0, ids=ids[:32]))
  np.testing.assert_array_equal(half, by_epoch[0][:32])  # by identity, not batch or key


def test_eval_views_weight_the_mirror_and_one_pixel_translations():
  views = augment.build("tta(1)")
  assert views.weights == (0.25, 0.25, 0.125, 0.125, 0.125, 0.125)
  images = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
  out = np.asarray(jax.jit(views)(jax.random.key(0), images)) * 255  # [views, batch, H, W, C]
  assert out.shape == (6, 2, 8, 8, 3)
  np.testing.assert_allclose(out[0], images, atol=1e-4)
  np.testing.assert_allclose(out[1], images[:, :, ::-1], atol=1e-4)
  np.testing.assert_allclose(out[2][:, 1:, 1:], images[:, :-1, :-1], atol=1e-4)  # down-right
  np.testing.assert_allclose(out[4][:, :-1, :-1], images[:, 1:, 1:], atol=1e-4)  # up-left
  np.testing.assert_allclose(views.first_view(jax.random.key(0), images) * 255, images, atol=1e-4)
  with pytest.raises(UserError, match="views op, which must be last"):
    augment.build("tta|normalize")


def test_the_final_eval_reports_test_time_augmentation_and_the_plain_accuracy(training):
  state = replicate(training.from_data(training.state))
  tta, plain = training.inputs.evaluate(state, True), training.inputs.evaluate(state, False)
  assert tta["count"] == plain["count"] == 256
  assert tta["correct_first_view"] == plain["correct"]
  assert "correct_first_view" not in plain


def test_bfloat16_computes_in_bfloat16_and_keeps_float32_parameters_and_statistics():
  config = configuration.load(SMOKE + ",bf16")
  training = setup(config)
  state = training.from_data(training.state)
  new, metrics = _one_step(training, state, *_batch(), 8)
  for leaf in jax.tree.leaves((new.params, new.batch_stats)):
    assert leaf.dtype == jnp.float32 and np.all(np.isfinite(leaf))
  assert np.isfinite(metrics["loss"])
  model = speedrun.create(config.model, None)
  variables = {"params": new.params, "batch_stats": new.batch_stats}
  apply = functools.partial(
    model.apply, train=False, capture_intermediates=True, mutable=["intermediates"]
  )
  logits, captured = jax.jit(apply)(variables, jnp.zeros((2, 32, 32, 3)))
  conv = captured["intermediates"]["group1"]["conv1"]["__call__"][0]
  assert conv.dtype == jnp.bfloat16 and logits.dtype == jnp.float32


# Both programs do the same float operations for every parameter that trains; XLA may fuse them
# apart and round otherwise: compared in float64 (tests/float64.py), 0 apart on both kernel sets.
# No mutation was run for this bound.
def test_once_the_whitening_bias_stops_training_the_step_no_longer_differentiates_it(x64):
  """The whitening bias trains over the first 3/8 of the run (6 of :smoke's 16 steps), then
  its learning rate is 0: from the state's step 6 the run switches to a step without its
  gradient, one convolution fewer (the first convolution's input gradient fed only it), and
  three steps past the switch the parameters are those of the first step alone."""
  config = float64.config(SMOKE)
  config.batch_size = 32  # 4 per device: the recipe's float64 steps cost by the example
  training = setup(config)
  ((at, later),), state = training.later_steps, replicate(training.from_data(training.state))
  assert at == 6 and _convolutions(later, state, training) == 7 + 5 + 6
  stream = training.inputs.batches(0)
  batches = [next(stream) for _ in range(9)]
  switching, _ = train.compile_step(training, state, batches[0])
  first_only, _ = train.compile_step(
    dataclasses.replace(training, later_steps=()), state, batches[0]
  )
  a, b = state, jax.tree.map(lambda x: x.copy(), state)
  start = jax.device_get(first_replica(state.params))  # before the steps take (donate) it
  norms = []  # the gradient's norm: the later program's leaves the whitening bias out
  for batch in batches:
    a, metrics_a = switching(a, batch)
    b, metrics_b = first_only(b, batch)
    norms.append([float(first_replica(m)["grad_norm"]) for m in (metrics_a, metrics_b)])
  assert [x == y for x, y in norms] == [True] * 6 + [False] * 3  # switched at step count 6
  (a_params, b_params) = (first_replica(s.params) for s in (a, b))  # its momentum decays
  assert jax.tree.leaves(a_params)[0].dtype == np.float64
  float64.assert_close(a_params, b_params, start=start, what="parameters")


def test_hiverge_s_muon_renormalises_every_2_plus_15_progress_updates():
  """Muon.step() of hiverge's script: at update n of a run of 30, the period is 2 + int(15 ·
  n / 30) and the kernels are rescaled where n - the last rescaling update >= it: at updates 3,
  9 and 21; between them the (zero) updates leave the kernel as it is."""
  kernel = {"k": jnp.full((3, 3, 4, 2), 2.0)}  # norm 12, rescaled to sqrt(2)
  tx = optim.renormalize_weights((2, 15), steps=30)
  state, rescaled_at = tx.init(kernel), []
  for n in range(1, 31):
    updates, state = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, kernel), state, kernel)
    if float(jnp.abs(updates["k"]).max()) > 0:
      rescaled_at.append(n)
  assert rescaled_at == [3, 9, 21]
  every = optim.renormalize_weights()  # airbench's: at every update
  updates, _ = every.update(jax.tree.map(jnp.zeros_like, kernel), every.init(kernel), kernel)
  np.testing.assert_allclose(jnp.linalg.norm(kernel["k"] + updates["k"]), np.sqrt(2), rtol=1e-6)


# The same products on the same values: zero padding adds exact zeros, and XLA's products of
# other shapes may sum in another order: in float64 (tests/float64.py) 0 apart on the default
# kernels, 9.3e-16 on the other set; padding of 1e-3 in place of zeros: 7.3e-2.
def test_newton_schulz_on_the_kernels_stacked_gives_each_kernel_its_own_iterations(x64):
  shapes = {"a": (3, 3, 24, 64), "b": (3, 3, 64, 64), "c": (3, 3, 64, 256), "d": (2, 2, 3, 24)}
  keys = jax.random.split(jax.random.key(0), len(shapes))
  grads = {
    n: jax.random.normal(k, s, jnp.float64) for (n, s), k in zip(shapes.items(), keys, strict=True)
  }
  config = configuration.load(SMOKE)
  fields = optim.group_fields(config)["filters"]
  fields.update(weight_decay=0.0, normalize_weights=False, ns_coeffs=(3.4576, -4.7391, 2.0843))
  fields.muon_dtype = "float64"
  updates = []
  for stacked in (False, True):
    fields.ns_stacked = stacked
    muon = optim.muon(1.0, fields, steps=10)
    updates.append(jax.jit(muon.update)(grads, muon.init(grads), grads)[0])
  assert updates[1]["a"].dtype == np.float64
  for name in shapes:
    float64.assert_close(updates[1][name], updates[0][name], what=name)


def test_a_step_that_reads_the_gradient_itself_keeps_one_program(guide_module):
  """The guide's SAM step takes the gradient's norm: a group frozen part-way would change it,
  so its run does not switch programs (steps.register's optimizer_only)."""
  guide_module("myexp/parts.py")
  config = configuration.load(SMOKE)
  config.update(step="sam", sam_rho=0.05)
  assert setup(config).later_steps == ()
  assert len(setup(configuration.load(SMOKE)).later_steps) == 1


@pytest.mark.parametrize(
  "override, message",
  [
    ("--config.model.activation=relu", "model.activation='relu' is not one of 'gelu', 'silu'"),
    ("--config.model.whiten_eps=0", "model.whiten_eps=0.0 must be a number > 0"),
    ("--config.model.init_examples=0", "model.init_examples=0 must be a number >= 1"),
    (
      "--config.param_groups.filters.ns_coeffs=(1.0, 2.0)",
      "param_groups.filters.ns_coeffs=(1.0, 2.0): give three",
    ),
    (
      "--config.param_groups.filters.normalize_every=(2,)",
      "param_groups.filters.normalize_every=(2,): give (first",
    ),
    ("--config.param_groups.filters.ns_steps=0", "param_groups.filters.ns_steps=0 must be a"),
  ],
)
def test_a_bad_speedrun_field_is_one_error_line_before_the_workdir_is_made(
  override, message, tmp_path
):
  from research import main

  config = "configs/cifar_speedrun.py:hiverge,smoke"  # its filters set every Muon field
  with pytest.raises(UserError, match=re.escape(message)) as error:
    main.run(["--config", config, f"--workdir={tmp_path / 'run'}", override])
  assert "\n" not in str(error.value) and not (tmp_path / "run").exists()
