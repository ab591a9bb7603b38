"""Several seeds in one program (`config.seeds`): each seed trains as its single run would,
a stopped run resumes exactly, and eval, predict, `trained.load` and `init_from` know seeds."""

import csv
import json

import jax
import numpy as np
import pytest
from PIL import Image

from research import configuration, train, trained
from research.errors import UserError
from research.train import train_and_evaluate
from tests.test_resilience import _events

SEEDS = (1, 2)  # config.seed = 1, config.seeds = 2
# A seed's run differs from its single run by float rounding at most. Traced apart (unroll,
# the default), each seed's step is the single step, run by the same kernels in the same order
# on the same machine: every step's loss is compared bit for bit (docs/seeds.md; so on both of
# .ci/run's kernel sets, measured 2026-11-27), the final eval as its comment says. The bounds
# below are the batched mode's (vmap): the seeds' convolutions run as one computation with
# other kernels and other rounding. Step 1 starts from the same parameters on the same
# examples: its loss, a mean of 64 float32 terms, agrees to rounding (1e-5 bounds it; measured
# 8e-8). After it the difference grows as rounding does in training, faster where it flips a
# max-pool's choice within a window or a ReLU's sign. Measured batched on VGG's :smoke run of
# 8 steps here, 8 devices (docs/seeds.md): losses 1e-3 relative apart at the last step (1e-2
# at most on the way), the final eval loss 2e-3, the accuracy one example of 250. The bounds
# allow ten times that.
FIRST_LOSS_RTOL = 1e-5
LAST_LOSS_RTOL = 1e-2
EVAL_LOSS_RTOL = 2e-2
EVAL_EXAMPLES = 10


def _config(name: str, **fields):
  config = configuration.load(f"configs/{name}.py:smoke")
  config.update(num_train_steps=8, log_every_steps=1, checkpoint_every_steps=4, seed=SEEDS[0])
  config.update(fields)
  return config


def _records(workdir):
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
  """config name -> {seed: the workdir of its single run}, each trained once."""
  made = {}

  def runs_of(name: str) -> dict:
    if name not in made:
      root = tmp_path_factory.mktemp(f"{name}-single")
      for seed in SEEDS:
        train_and_evaluate(_config(name, seed=seed), str(root / f"seed{seed}"))
      made[name] = {seed: root / f"seed{seed}" for seed in SEEDS}
    return made[name]

  return runs_of


def _fields(mode: str) -> dict:
  return dict(seeds=len(SEEDS), seeds_mode=mode)


@pytest.fixture(scope="module")
def seeds_runs(tmp_path_factory):
  """(config name, seeds_mode) -> the workdir of both seeds in one run, each trained once."""
  made = {}

  def run_of(name: str, mode: str):
    if (name, mode) not in made:
      workdir = tmp_path_factory.mktemp(f"{name}-{mode}") / "seeds"
      train_and_evaluate(_config(name, **_fields(mode)), str(workdir))
      made[name, mode] = workdir
    return made[name, mode]

  return run_of


# The models with BatchNorm and with dropout, their seeds as runs have them by default (each
# seed's step traced apart) and, for VGG, batched (vmap).
@pytest.fixture(
  scope="module",
  params=[("cifar_vgg", "unroll"), ("cifar_keras_cnn", "unroll"), ("cifar_vgg", "vmap")],
  ids=lambda p: "-".join(p),
)
def runs(request, seeds_runs, single_runs):
  """(config name, its fields, the workdir of both seeds in one run, {seed: its single run})."""
  name, mode = request.param
  return name, _fields(mode), seeds_runs(name, mode), single_runs(name)


def test_each_seed_trains_as_its_single_run(runs):
  _, fields, workdir, singles = runs
  records = _records(workdir)
  train_records = [r for r in records if "loss" in r]
  final = records[-1]
  assert final["per_seed"]["seed"] == list(SEEDS)
  for i, seed in enumerate(SEEDS):
    single = _records(singles[seed])
    single_train = [r for r in single if "loss" in r]
    mine = [r["per_seed"]["loss"][i] for r in train_records]
    theirs = [r["loss"] for r in single_train]
    eval_loss = final["per_seed"]["eval_loss"][i]
    accuracy = final["per_seed"]["eval_accuracy"][i]
    if fields["seeds_mode"] == "unroll":
      assert mine == theirs, seed  # every step's loss, bit for bit
      # The final eval is of the same parameters (the steps were), by the seeds' eval: one
      # forward batched over them (jax.vmap, research/inputs.py), whose kernels may round
      # otherwise. As for the same parameters on 1 and 8 devices (test_resilience.py): the
      # mean of 250 positive losses, each from float32 logits summed in another order, to
      # 1e-5 (measured: 1.1e-7 for VGG's seed 1, 0 otherwise; 0 on .ci/run's other kernels),
      # and the same accuracy (a flip needs two logits to tie within that rounding).
      np.testing.assert_allclose(eval_loss, single[-1]["eval_loss"], rtol=1e-5)
      assert accuracy == single[-1]["eval_accuracy"]
      continue
    np.testing.assert_allclose(mine[0], theirs[0], rtol=FIRST_LOSS_RTOL)
    np.testing.assert_allclose(mine[-1], theirs[-1], rtol=LAST_LOSS_RTOL)
    np.testing.assert_allclose(eval_loss, single[-1]["eval_loss"], rtol=EVAL_LOSS_RTOL)
    assert abs(accuracy - single[-1]["eval_accuracy"]) * 250 <= EVAL_EXAMPLES
  accuracies = final["per_seed"]["eval_accuracy"]
  assert final["eval_accuracy"] == pytest.approx(np.mean(accuracies))
  assert final["eval_accuracy_std"] == pytest.approx(np.std(accuracies, ddof=1))
  assert final["eval_examples"] == 250  # every seed counts each test example once


def test_each_seed_s_numbers_go_to_tensorboard(runs):
  _, _, workdir, _ = runs
  tags = {v.tag for e in _events(workdir) for v in e.summary.value}
  for seed in SEEDS:
    assert {f"train/loss/seed_{seed}", f"eval/accuracy/seed_{seed}"} <= tags, sorted(tags)
  assert {"train/loss", "eval/accuracy"} <= tags  # the seeds' means


def test_eval_reproduces_each_seed_s_final_eval(runs):
  _, _, workdir, _ = runs
  final = _records(workdir)[-1]
  record = trained.evaluate(workdir)
  assert record["per_seed"] == final["per_seed"]


def test_load_predicts_one_seed_or_the_ensemble_of_all(runs):
  _, _, workdir, _ = runs
  images = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3), np.uint8)
  each = [trained.load(workdir, seed=seed).predict(images) for seed in SEEDS]
  ensemble = trained.load(workdir).predict(images)
  np.testing.assert_allclose(ensemble, np.mean(each, axis=0), rtol=1e-5, atol=1e-7)
  assert not np.allclose(each[0], each[1])  # two trained networks, not one
  with pytest.raises(UserError, match=r"trained seeds 1, 2; choose one"):
    trained.load(workdir, seed=7)


def test_predict_writes_one_seed_s_or_the_ensemble_s_classes(runs, tmp_path):
  _, _, workdir, _ = runs
  rng = np.random.default_rng(1)
  for i in range(3):
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), np.uint8)).save(tmp_path / f"{i}.png")
  for seed in (*SEEDS, None):
    argv = ["predict", str(workdir), str(tmp_path), "--output", str(tmp_path / "out.csv")]
    assert trained.main(argv + ([f"--seed={seed}"] if seed is not None else [])) == 0
    rows = list(csv.DictReader((tmp_path / "out.csv").read_text().splitlines()))
    model = trained.load(workdir, seed=seed)
    expected = model.predict(sorted(tmp_path.glob("*.png")))
    assert [float(r["probability"]) for r in rows] == pytest.approx(expected.max(1), abs=1e-6)


def test_the_speedrun_s_seeds_whiten_with_their_own_images():
  """Parameters from data, per seed: each seed's whitening filters are its single run's."""
  config = configuration.load("configs/cifar_speedrun.py:smoke")
  config.update(seed=SEEDS[0], seeds=len(SEEDS))
  training = train.setup(config)
  together = training.from_data(training.state).params
  for i, seed in enumerate(SEEDS):
    config.update(seed=seed, seeds=1)
    single = train.setup(config)
    alone = single.from_data(single.state).params
    np.testing.assert_array_equal(
      jax.tree.map(lambda x, i=i: x[i], together)["whiten"]["kernel"], alone["whiten"]["kernel"]
    )


def test_a_fine_tune_starts_from_the_seed_it_names(runs):
  name, _, workdir, _ = runs
  with pytest.raises(UserError, match=r"trained seeds 1-2; choose .*--config.init_from_seed=N"):
    train.setup(_config(name, init_from=str(workdir)), warm_start=True)
  training = train.setup(_config(name, init_from=str(workdir), init_from_seed=2), True)
  saved = trained.load(workdir, seed=2).variables["params"]
  same = jax.tree.map(np.array_equal, training.state.params, saved)
  assert all(jax.tree.leaves(same))


def test_a_run_that_dies_resumes_exactly(seeds_runs, tmp_path, monkeypatch, capsys):
  """Dies at step 6 without a word (as a killed process: no checkpoint of its own), then
  resumes from step 4's checkpoint and ends as the run that never died, every seed. One run
  shows it (VGG's seeds batched): the checkpoint holds every seed's state."""
  name, fields = "cifar_vgg", _fields("vmap")
  uninterrupted = seeds_runs(name, "vmap")
  write = train.Progress.write

  def dies_at_6(self, step, *args):
    if step == 6:
      raise SystemExit("killed")
    write(self, step, *args)

  monkeypatch.setattr(train.Progress, "write", dies_at_6)
  with pytest.raises(SystemExit):
    train_and_evaluate(_config(name, **fields), str(tmp_path))
  monkeypatch.undo()
  capsys.readouterr()
  train_and_evaluate(_config(name, **fields), str(tmp_path))
  assert "resumed from the checkpoint at step 4" in capsys.readouterr().out
  last_train = lambda w: [r for r in _records(w) if "loss" in r][-1]["per_seed"]
  assert last_train(tmp_path) == last_train(uninterrupted)  # bit for bit
  assert _records(tmp_path)[-1]["per_seed"] == _records(uninterrupted)[-1]["per_seed"]


def test_seeds_that_do_not_fit_the_devices_stop_before_anything_is_written(tmp_path, monkeypatch):
  monkeypatch.setattr(train, "free_device_bytes", lambda: 1000)
  with pytest.raises(UserError, match=r"2 seeds in one program.*do not fit; not one seed fits"):
    train_and_evaluate(_config("cifar_vgg", seeds=2), str(tmp_path / "run"))
  assert not (tmp_path / "run" / "config.json").exists()


def test_seeds_need_resident_data():
  with pytest.raises(UserError, match=r"seeds=2 trains its seeds on one resident copy"):
    train.setup(_config("cifar_vgg", seeds=2, dataset="imagenette"))


def test_a_seed_that_diverges_stops_the_run_and_is_named(tmp_path, nan_after_step):
  """Seed 2's parameters turn NaN in step 2: the run stops at the next record, step 3's, and
  names seed 2 alone."""
  nan_after_step(2, seed=1)
  config = _config("cifar_vgg", seeds=2, checkpoint_every_steps=0)
  with pytest.raises(UserError, match=r"NaN/inf by step 3 in seed 2 \(loss"):
    train_and_evaluate(config, str(tmp_path))
