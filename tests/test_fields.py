"""Every field has an owner: a typo in a config file, a model's sub-config or a parameter group
is one error line; a part declares the fields it reads, is handed those and its kind's, never
the whole config, and a fork's field is set from the command line as any other."""

import json
import re
import shutil
import sys

import flax.linen as nn
import ml_collections
import numpy as np
import optax
import pytest

from research import (
  configuration,
  data,
  fields,
  losses,
  main,
  metrics,
  models,
  optim,
  schedules,
  steps,
  trained,
  validate,
)
from research import workdir as workdir_lib
from research.errors import UserError
from research.setup import setup
from research.train import train_and_evaluate
from tests import float64

SEEN = {}  # kind -> the fields a part of it was handed


class _Net(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x, train: bool):
    return nn.Dense(3)(nn.relu(nn.Dense(self.hidden)(x.reshape(len(x), -1))))


def _seen(kind, view):
  SEEN[kind] = view
  return view


def _data(config):
  _seen("dataset", config)
  rng = np.random.default_rng(config.seed)
  images = lambda n: rng.integers(0, 256, (n, 4, 4, 3), np.uint8)
  labels = lambda n: rng.integers(0, 3, n)
  n = config.train_size
  return data.ImageDataset("fields", "generated", images(n), labels(n), images(16), labels(16), 3)


@pytest.fixture(autouse=True, scope="module")
def parts():
  """A fork's part of each kind, each declaring a field of its own and recording its view."""
  from tests import guide

  with guide.registered():
    models.register("fields_model", fields={"hidden": 4})(
      lambda model_config, axis_name: _Net(_seen("model", model_config).hidden)
    )
    losses.register("fields_loss", fields={"loss_weight": 1.0})(
      lambda logits, targets, intermediates, config: (
        _seen("loss", config).loss_weight * optax.softmax_cross_entropy(logits, targets)
      )
    )
    data.register("fields_data", num_classes=3, fields={"train_size": 64})(_data)
    optim.register("fields_sgd", fields={"fields_momentum": 0.5})(
      lambda learning_rate, f: optax.sgd(learning_rate, _seen("optimizer", f).fields_momentum)
    )
    schedules.register("fields_schedule", fields={"floor": 0.0}, traced=True)(
      lambda peak, n, per_epoch, f: lambda step: peak + _seen("schedule", f).floor
    )
    steps.register("fields_step", fields={"extra": 1.0})(
      lambda state, batch, run: (
        _seen("train step", run.fields),
        steps.standard_step(state, batch, run),
      )[1]
    )
    metrics.register("fields_metric", fields={"bonus": 0.0})(
      lambda logits, labels, f: (logits.argmax(-1) == labels) + _seen("eval metric", f).bonus
    )
    yield


def _fork_config(**overrides):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="fields_data", loss="fields_loss", optimizer="fields_sgd")
  config.update(schedule="fields_schedule", step="fields_step", eval_metrics=("fields_metric",))
  config.update(
    batch_size=16, eval_batch_size=16, num_train_steps=2, augment="", eval_preprocess=""
  )
  config.model = dict(name="fields_model", num_classes=3, dtype="float32")
  config.update(overrides)
  return config


@pytest.fixture(scope="module")
def fork_run(tmp_path_factory):
  """The workdir of a run whose every part is the fork's, and the final record."""
  SEEN.clear()
  workdir = tmp_path_factory.mktemp("fields") / "run"
  final = train_and_evaluate(_fork_config(), str(workdir))
  return workdir, final, dict(SEEN)


@pytest.mark.parametrize(
  "kind, declared",
  [
    ("model", {"hidden"}),
    ("loss", {"loss_weight"}),
    ("dataset", {"train_size"}),
    ("optimizer", {"fields_momentum"}),
    ("schedule", {"floor"}),
    ("train step", {"extra"}),
    ("eval metric", {"bonus"}),
  ],
)
def test_each_kind_of_part_is_handed_its_kind_s_fields_and_its_own_not_the_config(
  fork_run, kind, declared
):
  _, _, seen = fork_run
  view = seen[kind]
  assert isinstance(view, fields.View)
  kind_fields = {f.partition(".")[0] for f in fields.KINDS[kind]}
  assert set(view) == kind_fields | declared, set(view) ^ (kind_fields | declared)
  outside = rf"{kind} 'fields_\w+' reads the field 'data_workers'"
  with pytest.raises(UserError, match=outside):
    view.data_workers  # noqa: B018  (a field of the config, not of this part)
  if kind != "model":  # the others' views are of the config, which holds data_workers
    # a default never stands in for the config's value: `get`, getattr's and hasattr as well
    for read in (
      view.get,
      lambda name, d: getattr(view, name, d),
      lambda name, d: hasattr(view, name),
    ):
      with pytest.raises(UserError, match=outside):
        read("data_workers", 0)
  assert view.get("no_such_field", 7) == 7 and not hasattr(view, "no_such_field")


def test_a_run_records_the_fields_its_parts_declared_as_trained(fork_run):
  workdir, _, _ = fork_run
  recorded = json.loads((workdir / "config.json").read_text())
  assert recorded["train_size"] == 64 and recorded["extra"] == 1.0 and recorded["floor"] == 0.0
  assert recorded["model"]["hidden"] == 4


@pytest.mark.end_to_end
def test_an_old_workdir_without_today_s_fields_loads_evaluates_predicts_and_fine_tunes(
  fork_run, tmp_path
):
  """A flat config of before: no batch_norm_statistics, no declared fields (their defaults)."""
  workdir, final, _ = fork_run
  old = tmp_path / "old"
  shutil.copytree(workdir, old)
  config = json.loads((old / "config.json").read_text())
  for field in ("batch_norm_statistics", "train_size", "extra", "floor", "loss_weight", "bonus"):
    config.pop(field)
  config["model"].pop("hidden")
  (old / "config.json").write_text(json.dumps(config))
  launches = [json.loads(line) for line in (old / "launches.jsonl").read_text().splitlines()]
  for launch in launches:
    launch["config"] = config
  (old / "launches.jsonl").write_text("".join(json.dumps(r) + "\n" for r in launches))
  loaded = trained.load(old)
  assert loaded.config.model.hidden == 4 and loaded.config.batch_norm_statistics == "global"
  # resumed by today's code with the config it trained with: the same config, no change asked
  today = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
  workdir_lib.check_resumable(old, today, allow_change=False, complete=configuration.completed)
  with pytest.raises(UserError, match="batch_norm_statistics, bonus, extra, .* differ"):
    workdir_lib.check_resumable(old, today, allow_change=False)  # taken as recorded
  assert loaded.predict(np.zeros((2, 4, 4, 3), np.uint8)).shape == (2, 3)
  assert trained.evaluate(old)["eval_accuracy"] == final["eval_accuracy"]
  assert setup(_fork_config(init_from=str(old)), fine_tune=True).started_from["taken"] > 0


def _main(argv, monkeypatch, capsys, tmp_path) -> str:
  """research.main's exit code and stderr for `argv` (in this process: the suite's devices)."""
  workdir = tmp_path / "run"
  monkeypatch.setattr(sys, "argv", ["research.main", *argv, f"--workdir={workdir}"])
  code = main.main()
  err = capsys.readouterr().err
  assert code == 2 and not workdir.exists(), err
  return err


@pytest.mark.parametrize(
  "line, message",
  [
    (
      "c.learnig_rate = 0.5",
      "learnig_rate: no part of this run reads it; did you mean learning_rate?",
    ),
    ("c.model.widht = 0.5", "model.widht: no part of this run reads it; did you mean model.width?"),
    (
      "c.param_groups = {'head': dict(match='Dense', dataset='cifar10', momentun=0.8)}",
      "param_groups.head.dataset: a parameter group reads none such",
    ),
    (
      "c.param_groups = {'head': dict(match='Dense', momentun=0.8)}",
      "param_groups.head.momentun: a parameter group reads none such (.*); did you mean momentum?",
    ),
  ],
)
def test_a_typo_in_a_config_file_is_one_error_line_with_the_nearest_name(
  line, message, tmp_path, monkeypatch, capsys
):
  path = tmp_path / "mine.py"
  path.write_text(
    "from configs import cifar_vgg\n\n\ndef get_config(arg=None):\n"
    f"  c = cifar_vgg.get_config(arg)\n  {line}\n  return c\n"
  )
  err = _main([f"--config={path}:smoke"], monkeypatch, capsys, tmp_path)
  assert err.count("\n") == 1 and err.startswith("error: "), err
  assert re.search(message, err), err


def test_a_typo_on_the_command_line_is_the_same_error_line(tmp_path, monkeypatch, capsys):
  argv = ["--config=configs/cifar_vgg.py:smoke", "--config.learnig_rate=0.5"]
  err = _main(argv, monkeypatch, capsys, tmp_path)
  assert (
    err
    == "error: --config.learnig_rate: no part of this run reads it; did you mean learning_rate?\n"
  )


def test_a_fork_s_declared_field_is_set_on_the_command_line_of_a_shipped_config(guide_module):
  """myexp's warm-up + cosine on the Keras CNN: its warmup_steps, which the shipped config does
  not have, from the command line; the others' fields stay owned."""
  guide_module("myexp/parts.py")  # as module guide_parts
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  overrides = [("modules", "guide_parts"), ("schedule", "warmup_cosine"), ("warmup_steps", "3")]
  configuration.resolve(config, overrides)
  assert config.warmup_steps == 3 and isinstance(config.warmup_steps, int)
  with pytest.raises(UserError, match=r"--config.warmup_step: no part of this run reads it; did"):
    configuration.resolve(
      configuration.load("configs/cifar_keras_cnn.py:smoke"), [*overrides[:2], ("warmup_step", "3")]
    )


def test_a_part_that_reads_a_field_it_did_not_declare_is_one_error_line_naming_both(tmp_path):
  from tests import guide

  with guide.registered():
    losses.register("reads_undeclared")(
      lambda logits, targets, intermediates, config: (
        optax.softmax_cross_entropy(logits, targets) * config.warmup_steps
      )
    )
    config = configuration.load("configs/cifar_keras_cnn.py:smoke")
    config.update(loss="reads_undeclared", num_train_steps=2)
    with pytest.raises(
      UserError, match=r"loss 'reads_undeclared' reads the field 'warmup_steps'.*declare it"
    ):
      train_and_evaluate(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_declared_field_that_is_the_library_s_is_one_error_line_at_registration():
  with pytest.raises(
    UserError,
    match=r"losses.register\('mine', fields=...\): 'label_smoothing' is the library's own",
  ):
    losses.register("mine", fields={"label_smoothing": 0.1})


def test_a_field_of_a_part_the_run_does_not_name_is_said_not_refused(guide_module):
  """focal_gamma after --config.loss=cross_entropy: kept (it cannot be unset from the command
  line), and the run says nothing reads it."""
  guide_module("myexp/parts.py")
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  configuration.resolve(
    config, [("modules", "guide_parts"), ("loss", "focal"), ("focal_gamma", "1.0")]
  )
  configuration.override(config, "loss", "cross_entropy")
  configuration.check_owned(config)
  assert configuration.unused(config) == [
    "note: focal_gamma is loss 'focal''s, which this run does not use"
  ]


@pytest.mark.end_to_end
def test_a_sweep_of_a_fork_s_declared_float_field_trains_each_point_as_its_single_run(
  guide_module, tmp_path, x64
):
  """focal_gamma, declared by the guide's focal loss: an argument of the compiled step, each
  point's losses those of its single run, in float64 (the sweep's own bound and measurements,
  tests/test_sweep.py). The point off the default (0.5) is compared with its single run, the
  other with the first: the sweep's machinery for every point is tests/test_sweep.py's; here,
  that a fork's field is swept at all (one run fewer)."""
  guide_module("myexp/parts.py")
  base = dict(loss="focal", num_train_steps=2, log_every_steps=1, checkpoint_every_steps=0)

  def train_records(workdir, overrides):
    config = configuration.load("configs/cifar_vgg.py:smoke")
    config.update(modules=("guide_parts",), **base)
    configuration.resolve(config, [*float64.FIELDS.items(), *overrides])
    train_and_evaluate(config, str(workdir))
    return [r for r in map(json.loads, (workdir / "metrics.jsonl").open()) if "loss" in r]

  swept = train_records(tmp_path / "sweep", [("sweep", "focal_gamma=0.5,2")])
  alone = train_records(tmp_path / "single", [("focal_gamma", "0.5")])
  mine, other = ([r["per_point"]["loss"][i] for r in swept] for i in (0, 1))
  float64.assert_close(mine, [r["loss"] for r in alone], what="losses")
  assert mine[0] != other[0]  # the default's point (gamma 2) weighs the same examples otherwise
  point = trained.load(tmp_path / "sweep", point="focal_gamma=2").config
  assert (point.focal_gamma, point.sweep) == (2.0, "")


def test_a_fork_s_part_checks_its_own_fields_in_the_config_in_a_group_and_at_each_point():
  """register(..., check=): before any data loads, each part the config names checks its view,
  the model its sub-config's, a group's optimizer the group's, and a sweep's every point; the
  field spelt as the config spells it (`View.name_of`)."""
  from tests import guide

  def positive(field):
    def check(view):
      if view[field] <= 0:
        raise UserError(f"{view.name_of(field)}={view[field]} must be > 0")

    return check

  with guide.registered():
    models.register("checked_model", fields={"hidden": 4}, check=positive("hidden"))(
      lambda model_config, axis_name: _Net(model_config.hidden)
    )
    optim.register("checked_sgd", fields={"pull": 0.5}, check=positive("pull"))(
      lambda learning_rate, f: optax.sgd(learning_rate, f.pull)
    )
    losses.register("checked_loss", fields={"weight": 1.0}, check=positive("weight"))(
      lambda logits, targets, intermediates, config: (
        config.weight * optax.softmax_cross_entropy(logits, targets)
      )
    )

    def check(**overrides):
      config = _fork_config(loss="checked_loss", optimizer="checked_sgd", **overrides)
      config.model = dict(name="checked_model", num_classes=3, dtype="float32")
      return config

    validate.train_config(check(), 8)  # every part's defaults pass
    config = check()
    config.model.hidden = 0
    with pytest.raises(UserError, match=r"^model.hidden=0 must be > 0$"):
      validate.train_config(config, 8)
    with pytest.raises(UserError, match=r"^weight=-1.0 must be > 0$"):
      validate.train_config(check(weight=-1.0), 8)
    groups = {"head": dict(match="Dense_1", optimizer="checked_sgd", pull=-0.5)}
    with pytest.raises(UserError, match=r"^param_groups.head.pull=-0.5 must be > 0$"):
      validate.train_config(check(param_groups=groups), 8)
    with pytest.raises(UserError, match=r"its point weight=-1: weight=-1.0 must be > 0$"):
      validate.train_config(check(sweep="weight=0.5,-1"), 8)


def test_a_sweep_of_a_field_no_part_of_the_step_reads_is_one_error_line():
  """The fork metric's `bonus`: read by the eval, outside the compiled step, so every point would
  train alike."""
  config = _fork_config(sweep="bonus=0.5,1.0")
  configuration.complete(config)
  with pytest.raises(
    UserError, match=r"sweep: bonus cannot be swept: eval metric 'fields_metric' reads it, outside"
  ):
    validate.train_config(config, 8)


def test_a_group_s_train_fraction_is_set_on_the_command_line_where_the_group_leaves_it():
  config = configuration.load("configs/cifar_speedrun.py:smoke")
  assert "train_fraction" not in config.param_groups.norm_biases
  configuration.resolve(config, [("param_groups.norm_biases.train_fraction", "0.5")])
  assert config.param_groups.norm_biases.train_fraction == 0.5


def test_a_metric_called_with_arguments_its_signature_does_not_take_is_one_error_line():
  from tests import guide

  with guide.registered():
    metrics.register("declares_but_takes_two", fields={"cutoff": 0.5})(
      lambda logits, labels: logits.argmax(-1) == labels
    )
    with pytest.raises(UserError, match=r"is called as metric\(logits, labels, fields\)"):
      metrics.bound("declares_but_takes_two", {})


def test_a_part_cannot_declare_the_model_s_sub_config():
  with pytest.raises(UserError, match="'model' is the library's own field"):
    losses.register("mine", fields={"model": {}})


def test_a_field_of_a_part_whose_module_is_not_named_says_so():
  """--config.loss=focal --config.focal_gamma=1 with the fork's module left out."""
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  with pytest.raises(UserError, match=r"loss 'not_imported' is not registered: is the module"):
    configuration.resolve(config, [("loss", "not_imported"), ("not_imported_gamma", "1.0")])
