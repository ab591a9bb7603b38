"""Several runs in one program: seeds (`config.seeds`) and a sweep's points (`config.sweep`).
Each trains as its single run would, a stopped run resumes exactly, and eval, predict,
`trained.load` and `init_from` take a seed or a point."""

import csv
import json

import jax
import numpy as np
import pytest
from PIL import Image

from research import init_from, metrics, progress, schedules, sweep, train, trained
from research.errors import UserError
from research.setup import setup
from research.train import train_and_evaluate
from tests import float64
from tests.test_resilience import _events

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

SEEDS = (1, 2)  # config.seed = 1, config.seeds = 2
RATES = (1e-3, 3e-3)  # the Keras CNN :smoke's learning rate (single_runs' seed 1) and another
SWEEP = "learning_rate=0.001,0.003"
LABELS = ["learning_rate=0.001", "learning_rate=0.003"]
# A seed's run differs from its single run by float rounding at most, and every run here is
# float64 (tests/float64.py), where rounding stays far below the bounds. Traced apart (unroll, the
# default), each seed's step is the single step, run by the same kernels in the same order: every
# step's loss is compared bit for bit (docs/sweeps.md), the final eval (one forward batched over
# the seeds, jax.vmap) to float64.RTOL. Batched (vmap), the seeds' convolutions run as one
# computation with other kernels and other rounding: every step's loss and the final eval loss to
# float64.RTOL. Measured (tests/float64.py): 3.9e-16 at most, relative, on both kernel sets (0 for
# every unrolled loss); every point given the first seed: the unrolled losses no longer bit for
# bit, the batched ones 2.7e-2 apart.


@pytest.fixture(scope="module", autouse=True)
def _float64():
  """JAX's 64-bit types on for this module's runs and tests (`_config`'s float64)."""
  with float64.on():
    yield


def _config(name: str, **fields):
  config = float64.config(f"configs/{name}.py:smoke")
  config.update(num_train_steps=4, log_every_steps=1, checkpoint_every_steps=2, seed=SEEDS[0])
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
    else:
      float64.assert_close(mine, theirs, what="losses")
    float64.assert_close(eval_loss, single[-1]["eval_loss"], what="eval loss")
    assert accuracy == single[-1]["eval_accuracy"]
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
  shape = trained.load(workdir).example_shape  # 16 pixels for the Keras CNN (tests/float64.py)
  images = np.random.default_rng(0).integers(0, 256, (5, *shape), np.uint8)
  each = [trained.load(workdir, seed=seed).predict(images) for seed in SEEDS]
  ensemble = trained.load(workdir).predict(images)
  float64.assert_close(ensemble, np.mean(each, axis=0), what="ensemble")
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
  config = float64.config("configs/cifar_speedrun.py:smoke")
  config.update(seed=SEEDS[0], seeds=len(SEEDS))
  training = setup(config)
  together = training.from_data(training.state).params
  for i, seed in enumerate(SEEDS):
    config.update(seed=seed, seeds=1)
    single = setup(config)
    alone = single.from_data(single.state).params
    np.testing.assert_array_equal(
      jax.tree.map(lambda x, i=i: x[i], together)["whiten"]["kernel"], alone["whiten"]["kernel"]
    )


def test_a_fine_tune_starts_from_the_seed_it_names(runs):
  name, _, workdir, _ = runs
  with pytest.raises(UserError, match=r"trained seeds 1-2; choose .*--config.init_from_seed=N"):
    setup(_config(name, init_from=str(workdir)), fine_tune=True)
  training = setup(_config(name, init_from=str(workdir), init_from_seed=2), True)
  saved = trained.load(workdir, seed=2).variables["params"]
  same = jax.tree.map(np.array_equal, training.state.params, saved)
  assert all(jax.tree.leaves(same))


def test_a_run_that_dies_resumes_exactly(seeds_runs, tmp_path, monkeypatch, capsys):
  """Dies at step 3 without a word (as a killed process: no checkpoint of its own), then
  resumes from step 2's checkpoint and ends as the run that never died, every seed. One run
  shows it (VGG's seeds batched): the checkpoint holds every seed's state."""
  name, fields = "cifar_vgg", _fields("vmap")
  uninterrupted = seeds_runs(name, "vmap")
  write = progress.Progress.write

  def dies_at_3(self, step, *args):
    if step == 3:
      raise SystemExit("killed")
    write(self, step, *args)

  monkeypatch.setattr(progress.Progress, "write", dies_at_3)
  with pytest.raises(SystemExit):
    train_and_evaluate(_config(name, **fields), str(tmp_path))
  monkeypatch.undo()
  capsys.readouterr()
  train_and_evaluate(_config(name, **fields), str(tmp_path))
  assert "resumed from the checkpoint at step 2" in capsys.readouterr().out
  last_train = lambda w: [r for r in _records(w) if "loss" in r][-1]["per_seed"]
  assert last_train(tmp_path) == last_train(uninterrupted)  # bit for bit
  assert _records(tmp_path)[-1]["per_seed"] == _records(uninterrupted)[-1]["per_seed"]


@pytest.mark.parametrize(
  "name, fields, what",
  [("cifar_vgg", dict(seeds=2), "seed"), ("cifar_keras_cnn", dict(sweep=SWEEP), "point")],
)
def test_points_that_do_not_fit_the_devices_stop_before_anything_is_written(
  tmp_path, monkeypatch, name, fields, what
):
  monkeypatch.setattr(train, "free_device_bytes", lambda: 1000)
  message = rf"2 {what}s in one program.*do not fit; not one {what} fits"
  with pytest.raises(UserError, match=message):
    train_and_evaluate(_config(name, **fields), str(tmp_path / "run"))
  assert not (tmp_path / "run" / "config.json").exists()


def test_seeds_need_resident_data():
  with pytest.raises(UserError, match=r"2 seeds train on one resident copy of the data"):
    setup(_config("cifar_vgg", seeds=2, dataset="imagenette"))


def test_a_seed_that_diverges_stops_the_run_and_is_named(tmp_path, nan_after_step):
  """Seed 2's parameters turn NaN in step 2: the run stops at the next record, step 3's, and
  names seed 2 alone."""
  nan_after_step(2, seed=1)
  config = _config("cifar_vgg", seeds=2, checkpoint_every_steps=0)
  with pytest.raises(UserError, match=r"NaN/inf by step 3 in seed 2 \(loss nan\)"):
    train_and_evaluate(config, str(tmp_path))


# --- a sweep: points of float fields' values (times seeds), one program -------------------------


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory, single_runs):
  """(the workdir of the Keras CNN's two learning rates in one run, [each's single run])."""
  root = tmp_path_factory.mktemp("sweep")
  train_and_evaluate(_config("cifar_keras_cnn", sweep=SWEEP), str(root / "sweep"))
  other = root / "single-3e-3"
  train_and_evaluate(_config("cifar_keras_cnn", learning_rate=RATES[1]), str(other))
  return root / "sweep", [single_runs("cifar_keras_cnn")[SEEDS[0]], other]


# A point's step is the single step with its value a slice of the [points] argument where the
# single run has a scalar: XLA may fuse that product otherwise, and the update then rounds
# otherwise. In float64 (tests/float64.py) every step's loss and the final eval loss are 0 apart
# on both kernel sets (here, in test_fields' sweep of a fork's field and in the sweep of a field
# groups inherit); every point given the first point's values: 6.0e-2 (the weight decay sweep's
# 2 steps: 1.8e-5).
def test_each_point_of_a_sweep_trains_as_its_single_run(sweep_run):
  """Each point trains as its single run: the same initial parameters and examples (the first
  loss the same), its own learning rate applied (the logged rates the same), each step's loss
  and the final eval to float rounding."""
  workdir, singles = sweep_run
  records = _records(workdir)
  train_records = [r for r in records if "loss" in r]
  final = records[-1]
  assert final["per_point"]["point"] == LABELS
  assert final["per_point"]["swept"] == {"learning_rate": list(RATES)}
  for i, single in enumerate(map(_records, singles)):
    single_train = [r for r in single if "loss" in r]
    mine = [r["per_point"]["loss"][i] for r in train_records]
    assert mine[0] == single_train[0]["loss"]
    float64.assert_close(mine, [r["loss"] for r in single_train], what="losses")
    rates = [r["per_point"]["learning_rate"][i] for r in train_records]
    assert rates == [r["learning_rate"] for r in single_train]  # the same function of the step
    eval_loss, accuracy = final["per_point"]["eval_loss"][i], final["per_point"]["eval_accuracy"][i]
    float64.assert_close(eval_loss, single[-1]["eval_loss"], what="eval loss")
    assert accuracy == single[-1]["eval_accuracy"]
  each = final["per_point"]
  best = np.lexsort((each["eval_loss"], -np.asarray(each["eval_accuracy"])))[0]
  assert final["best_point"] == LABELS[best]


def test_a_sweep_of_other_values_loads_its_step_from_the_compilation_cache(sweep_run, tmp_path):
  """The values are the step's arguments: one program for every point, and for a sweep of
  other values of the same fields (as for a single run of another learning rate). `sweep_run`
  compiled it (or, on a machine that ran the suite before, loaded it)."""
  config = _config("cifar_keras_cnn", sweep="learning_rate=0.0005,0.002", num_train_steps=2)
  final = train_and_evaluate(config, str(tmp_path / "other"))
  assert final["step_from_cache"]
  assert final["per_point"]["point"] == ["learning_rate=0.0005", "learning_rate=0.002"]


def test_the_best_point_is_the_highest_eval_accuracy_s_then_the_lowest_cross_entropy_s():
  """Not the lowest training loss (a swept loss scale changes it), nor the first of a tie."""
  columns = {"point": ["a", "b", "c"], "seed": [0, 0, 0], "swept": {"x": [1.0, 2.0, 3.0]}}
  values = {"eval_accuracy": [1.0, 1.0, 0.5], "eval_loss": [0.2, 0.1, 0.05]}
  record = metrics.per_point(values, columns)
  assert record["best_point"] == "b"
  assert "by final eval accuracy, then eval cross-entropy" in metrics.format_eval_line(
    {"step": 1, "eval_examples": 10, **record}
  )
  assert [line.split()[1] for line in metrics.sweep_table(record).splitlines()[1:4]] == list("bac")
  train = metrics.per_point({"loss": [0.3, 0.2, 0.1]}, columns)  # no eval: no best by loss
  assert "best_point" not in train and train["loss"] == pytest.approx(0.2)
  assert "focal_gamma changes the loss itself" in metrics.loss_title(
    {"focal_gamma": []}, ("focal_gamma",)
  )
  assert "changes" not in metrics.loss_title({"learning_rate": []}, ("focal_gamma",))


def test_a_sweep_ends_with_its_points_sorted_and_a_plot(sweep_run):
  workdir, _ = sweep_run
  final = _records(workdir)[-1]
  with Image.open(workdir / "sweep.png") as plot:
    assert plot.size[0] > plot.size[1] > 300  # two panels side by side
  lines = metrics.sweep_table(final).splitlines()
  each = final["per_point"]
  order = np.lexsort((each["eval_loss"], -np.asarray(each["eval_accuracy"])))
  assert [line.split()[1] for line in lines[1:3]] == [LABELS[i] for i in order]
  assert lines[-1].startswith(f"best: {final['best_point']}")


def test_each_point_is_a_tensorboard_run_of_its_own(sweep_run):
  workdir, _ = sweep_run
  for label in LABELS:
    tags = {v.tag for e in _events(workdir, label) for v in e.summary.value}
    assert {"train/loss", "train/learning_rate", "eval/accuracy"} <= tags, sorted(tags)


def test_eval_reproduces_each_point_s_final_record(sweep_run):
  workdir, _ = sweep_run
  final = _records(workdir)[-1]
  assert trained.evaluate(workdir)["per_point"] == final["per_point"]
  for i, label in enumerate(LABELS):
    record = trained.evaluate(workdir, point=label)
    assert record["point"] == label
    assert record["eval_accuracy"] == final["per_point"]["eval_accuracy"][i]
    float64.assert_close(record["eval_loss"], final["per_point"]["eval_loss"][i], what="eval loss")


def test_load_predict_and_init_from_take_the_best_point_or_the_named_one(sweep_run, tmp_path):
  workdir, _ = sweep_run
  best = LABELS.index(_records(workdir)[-1]["best_point"])
  params = lambda model: model.variables["params"]
  each = [params(trained.load(workdir, point=label)) for label in LABELS]
  same = lambda a, b: all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))
  assert same(params(trained.load(workdir)), each[best])
  assert same(params(trained.load(workdir, point=str(1 - best))), each[1 - best])  # an index
  assert not same(each[0], each[1])
  with pytest.raises(UserError, match=r"point=learning_rate=0.01 matches none"):
    trained.load(workdir, point="learning_rate=0.01")
  for i, label in enumerate(LABELS):  # a point's config is its single run's
    config = trained.load(workdir, point=label).config
    assert (config.learning_rate, config.sweep, config.seeds) == (RATES[i], "", 1)
  training = setup(_config("cifar_keras_cnn", init_from=str(workdir)), fine_tune=True)
  assert same(training.state.params, each[best])
  assert training.started_from["point"] == LABELS[best]  # in the final record, and said:
  assert f"(step 4, its point {LABELS[best]})" in init_from.describe(training.started_from)
  config = _config("cifar_keras_cnn", init_from=str(workdir), init_from_point=LABELS[1 - best])
  assert same(setup(config, fine_tune=True).state.params, each[1 - best])
  Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
  out = tmp_path / "out.csv"
  for point, i in ((None, best), (LABELS[1 - best], 1 - best)):
    argv = ["predict", str(workdir), str(tmp_path / "a.png"), "--output", str(out)]
    assert trained.main(argv + ([f"--point={point}"] if point else [])) == 0
    row = next(csv.DictReader(out.read_text().splitlines()))
    expected = trained.load(workdir, point=LABELS[i]).predict([str(tmp_path / "a.png")])
    assert float(row["probability"]) == pytest.approx(expected.max(), abs=1e-6)


def test_a_point_that_diverges_stops_alone(tmp_path, nan_after_step, capsys):
  """The second point's parameters turn NaN in step 2: named at the next record, it leaves the
  best point and the ranges; the first point trains on to the end, as it would alone."""
  nan_after_step(2, seed=1)
  config = _config("cifar_keras_cnn", sweep=SWEEP, num_train_steps=4, checkpoint_every_steps=2)
  final = train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr().out
  assert f"point {LABELS[1]} diverged by step 3" in out
  assert final["diverged"] == {LABELS[1]: 3}
  assert final["best_point"] == LABELS[0]
  assert np.isfinite(final["per_point"]["eval_loss"][0])
  assert f"{LABELS[1]}  diverged by step 3" in out  # the sorted table, last


@pytest.mark.parametrize(
  "sweep, message",
  [
    ("learning_rate", r"'learning_rate' is not FIELD=V1,V2"),
    ("learning_rate=0.1,x", r"is not FIELD=V1,V2,\.\.\. \(numbers\)"),
    ("learning_rate=0.1,0.1", r"names 'learning_rate' or one of its values twice"),
    ("lerning_rate=0.1,0.2", r"lerning_rate cannot be swept: the config has no such field"),
    ("batch_size=32,64", r"batch_size cannot be swept: it is an int field; only float"),
    ("optimizer=1,2", r"optimizer cannot be swept: it is a string field, and strings cannot be"),
    ("warmup_epochs=0,1", r"warmup_epochs cannot be swept: it sizes or times the run"),
    ("seed=1,2", r"seed cannot be swept: seeds are the sweep's other axis: use --config.seeds"),
    ("grad_clip_norm=0,1", r"grad_clip_norm cannot be swept: 0 turns clipping off"),
    (
      "learning_rate=0.1,-1",
      r"its point learning_rate=-1: learning_rate=-1.0 must be a number > 0",
    ),
    ("learning_rate=0.1,0.1000001", r"has values that print alike \(learning_rate=0.1, learning"),
    ("model.width=0.5,1", r"model.width cannot be swept: only the config's own float fields"),
    ("ema_decay=0,0.9", r"ema_decay cannot be swept: 0 turns the average off"),
  ],
)
def test_a_field_that_cannot_be_swept_is_one_error_line(sweep, message):
  with pytest.raises(UserError, match=message):
    setup(_config("cifar_keras_cnn", sweep=sweep))


def test_a_learning_rate_built_in_python_cannot_be_swept(monkeypatch):
  """A schedule registered without traced=True (optax's constructors check their numbers in
  Python) holds the learning rate as a constant of the program."""
  monkeypatch.setitem(schedules.SCHEDULES.parts, "in_python", schedules.SCHEDULES.get("cosine"))
  monkeypatch.setitem(schedules.SCHEDULES.options, "in_python", {})
  config = _config("cifar_vgg", sweep="learning_rate=0.1,0.2", schedule="in_python")
  with pytest.raises(UserError, match=r"learning_rate cannot be swept: a schedule of this run"):
    setup(config)


def test_a_sweep_s_points_are_its_grid_times_its_seeds():
  config = _config("cifar_vgg", sweep="learning_rate=0.1,0.2;weight_decay=0,5e-4", seeds=2)
  points = sweep.points_of(config)
  assert [p.values for p in points[::2]] == [
    {"learning_rate": lr, "weight_decay": wd} for lr in (0.1, 0.2) for wd in (0.0, 5e-4)
  ]
  assert [p.seed for p in points] == [1, 2] * 4
  assert sweep.labels(config)[:2] == (
    "learning_rate=0.1,weight_decay=0,seed=1",
    "learning_rate=0.1,weight_decay=0,seed=2",
  )
  hyper = sweep.hyper(config)  # each point's values: a 0 is a value, not a missing transform
  np.testing.assert_array_equal(hyper["weight_decay"], np.float32([0, 0, 5e-4, 5e-4] * 2))
  assert sweep.structure(config).weight_decay == 5e-4


@pytest.mark.parametrize("vectorized", [False, True], ids=["unroll", "vmap"])
def test_each_point_steps_with_its_seed_and_its_values(vectorized):
  """sweep.each_point, unrolled or batched, runs the one-run step for each point with its own
  state, its part of the batch, its seed and its values of the swept fields; the fields not
  swept (scalars) and the data (None in batch_axes) are shared."""

  def step(state, batch, horizon, seed, hyper):
    data, order = batch
    new = state * hyper["momentum"] + hyper["learning_rate"] * seed + data.sum() + order
    return new, {"horizon": horizon}

  points = [sweep.Point(seed, {}) for seed in (3, 4, 3)]
  hyper = {"learning_rate": np.float32([0.1, 0.2, 0.3]), "momentum": np.float32(0.5)}
  state, batch = np.float32([1, 2, 3]), (np.ones(4, np.float32), np.float32([10, 20, 30]))
  new, metrics = jax.jit(sweep.each_point(step, points, (None, 0), vectorized=vectorized))(
    state, batch, np.int32(7), hyper
  )
  np.testing.assert_allclose(
    new, [1 * 0.5 + 0.3 + 4 + 10, 2 * 0.5 + 0.8 + 4 + 20, 3 * 0.5 + 0.9 + 4 + 30], rtol=1e-6
  )
  np.testing.assert_array_equal(metrics["horizon"], [7, 7, 7])


def test_a_point_is_chosen_by_its_label_its_index_or_its_seed():
  config = _config("cifar_vgg", sweep="learning_rate=0.1,0.2", seeds=2)  # seeds 1, 2
  runs = sweep.runs_of(config)
  choose = lambda **named: sweep.chosen_point(None, runs, what="run", **named)
  assert choose(point="learning_rate=0.2,seed=2") == 3
  assert choose(point="learning_rate=0.2", seed=1) == 2
  assert choose(point="1") == 1
  both = r"\(learning_rate=0.1,seed=2, learning_rate=0.2,seed=2\); name one"
  with pytest.raises(UserError, match=r"run seed=2 matches 2 of the run's points " + both):
    choose(seed=2)  # the seed of two points, and no other, listed: name the point too
  with pytest.raises(UserError, match=r"run point=seed=2 matches 2 of the run's points " + both):
    choose(point="seed=2")
  with pytest.raises(UserError, match=r"run seed=5: the run trained seeds 1, 2; choose one"):
    choose(seed=5)
  config.update(seeds=1)  # labels without the seed: the seed still chooses
  runs = sweep.runs_of(config)
  assert choose(point="learning_rate=0.1", seed=1) == 0


def test_a_sweep_of_a_field_parameter_groups_inherit_trains_each_point(tmp_path):
  """A group that leaves weight_decay unset takes the config's: each point's (its 0 too), so
  the group's optimizer is built for the swept value as the config's is."""
  groups = {"head": {"match": r"Dense_1/kernel$"}}
  fields = dict(param_groups=groups, num_train_steps=2, checkpoint_every_steps=0)
  final = train_and_evaluate(
    _config("cifar_keras_cnn", sweep="weight_decay=0,5e-4", **fields), str(tmp_path / "sweep")
  )
  alone = train_and_evaluate(
    _config("cifar_keras_cnn", weight_decay=5e-4, **fields), str(tmp_path / "alone")
  )
  loss = lambda workdir: [r for r in _records(workdir) if "loss" in r][-1]
  swept, alone_loss = (
    loss(tmp_path / "sweep")["per_point"]["loss"][1],
    loss(tmp_path / "alone")["loss"],
  )
  float64.assert_close(swept, alone_loss, what="the point's loss")
  assert final["per_point"]["swept"] == {"weight_decay": [0.0, 5e-4]}
  assert all(np.isfinite(final["per_point"]["eval_loss"]))
  assert alone["eval_accuracy"] == final["per_point"]["eval_accuracy"][1]


def test_a_sweep_of_one_point_is_its_single_run_used_as_one(tmp_path):
  config = _config("cifar_keras_cnn", sweep="learning_rate=0.003", num_train_steps=2)
  train_and_evaluate(config, str(tmp_path))
  model = trained.load(tmp_path)
  assert model.seeds == ()
  assert model.predict(np.zeros((1, 16, 16, 3), np.uint8)).shape == (1, 10)  # tests/float64.py
  with pytest.raises(UserError, match=r"arrays of shape \(1, 32, 32, 3\), where the run's exa"):
    model.predict(np.zeros((1, 32, 32, 3), np.uint8))  # another size: said, before the model
