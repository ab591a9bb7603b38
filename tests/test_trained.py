"""A trained run used again: its checkpoint evaluated (on 8 devices and on 1), loaded in Python."""

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from PIL import Image

from research import checkpoint, configuration, metrics, trained
from research.errors import EXIT_USER_ERROR, UserError
from research.setup import setup
from research.train import train_and_evaluate
from tests import launches

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

ROOT = Path(__file__).parent.parent
SLICE = Path(__file__).parent / "data" / "cifar10_slice"  # 16 train + 8 test real JPEGs a class


@metrics.register("test_top3")
def top3(logits, labels):
  """1 where the label is among the 3 highest logits: an eval metric as a fork adds one."""
  return (jax.lax.top_k(logits, 3)[1] == labels[:, None]).any(-1)


def _config(data: Path):
  """The Keras CNN's :smoke on the real-image slice at `data`, 10 steps."""
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(data), batch_size=32, eval_batch_size=16)
  config.update(num_train_steps=10, log_every_steps=5)
  return config


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
  """(workdir, final eval record) of the Keras CNN's :smoke trained on the real-image slice."""
  root = tmp_path_factory.mktemp("trained")
  config = _config(Path(shutil.copytree(SLICE, root / "data")))
  final = train_and_evaluate(config, str(root / "run"))
  return root / "run", final


def test_eval_reproduces_the_final_eval_and_leaves_the_training_s_files_alone(run):
  workdir, final = run
  before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
  record = trained.evaluate(workdir)
  for field in ("step", "eval_loss", "eval_accuracy", "eval_examples"):
    assert record[field] == final[field], field
  after = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
  assert after.pop(trained.EVALS) and after == before
  assert json.loads((workdir / trained.EVALS).read_text().splitlines()[-1])["overrides"] == {}


@pytest.fixture(scope="module")
def on_one_device(run, tmp_path_factory) -> list:
  """[(exit code, output)] of the run's eval (at another eval batch), its predict over the test
  folder and a fine-tune from it, each on 1 device, in one child process."""
  workdir, _ = run
  here = tmp_path_factory.mktemp("one_device")
  test = workdir.parent / "data" / "test"
  tune = ["--config=configs/cifar_keras_cnn.py:smoke", f"--workdir={here / 'fine'}"]
  tune += [f"--config.init_from={workdir}", "--config.dataset=folder"]
  tune += [f"--config.data_dir={_five_classes(here)}", "--config.model.num_classes=5"]
  tune += ["--config.num_train_steps=2", "--config.batch_size=16"]
  return launches.run(
    1,
    [
      ("research.trained", ["eval", str(workdir), "--config.eval_batch_size=20"]),
      ("research.trained", ["predict", str(workdir), str(test), f"--output={here / 'one.csv'}"]),
      ("research.main", tune),
    ],
    here,
  )


# The numbers of an eval and a predict on another device count are test_device_count's (in
# float64); here the commands on 1 device of a run trained on 8.
def test_eval_on_one_device_of_a_run_trained_on_8_counts_every_example(run, on_one_device):
  workdir, _ = run
  code, output = on_one_device[0]
  assert code == 0, output[-2000:]
  assert re.search(r"eval at step 10: loss = [\d.]+, accuracy = [\d.]+ over 80 examples", output)
  records = [json.loads(line) for line in (workdir / trained.EVALS).read_text().splitlines()]
  assert {"eval_batch_size": "20"} in [r["overrides"] for r in records]


def test_load_predicts_the_eval_s_classes_from_images(run):
  workdir, final = run
  model = trained.load(workdir)
  assert model.step == 10 and model.config.model.name == "keras_cnn"
  assert model.classes[:3] == ("airplane", "automobile", "bird")  # the folder's class names
  paths = sorted((workdir.parent / "data" / "test").rglob("*.jpg"))
  images = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths])  # 32×32
  labels = np.array([model.classes.index(p.parent.name) for p in paths])
  probabilities = model.predict(images)
  assert probabilities.shape == (80, 10)
  np.testing.assert_allclose(probabilities.sum(-1), 1, rtol=1e-5)
  correct = np.sum(probabilities.argmax(-1) == labels)
  assert correct == round(final["eval_accuracy"] * final["eval_examples"])  # float32 record


def test_load_predicts_on_image_files_and_pil_images_as_predict_does(run, tmp_path):
  """`load(WORKDIR).predict` of files or PIL images reads them as `./launch.sh predict` does
  (any size: the shorter side resized, the centre cropped): the same probabilities."""
  workdir, _ = run
  photos = tmp_path / "photos"
  photos.mkdir()
  for i, path in enumerate(sorted((SLICE / "test" / "cat").glob("*.jpg"))[:3]):
    Image.open(path).resize((57 + 9 * i, 31 + 5 * i)).save(photos / f"{i}.png")  # not 32×32
  paths = sorted(photos.glob("*.png"))
  rows = trained.predict(workdir, [photos], top_k=10)
  model = trained.load(workdir)
  from_files = model.predict([str(p) for p in paths])
  from_pil = model.predict([Image.open(p) for p in paths])
  np.testing.assert_array_equal(from_files, from_pil)
  for row, p in zip(rows, from_files, strict=True):
    by_class = dict(zip(row["classes"], row["probabilities"], strict=True))
    np.testing.assert_array_equal([by_class[c] for c in model.classes], p)
  squashed = np.stack([np.asarray(Image.open(p).convert("RGB").resize((32, 32))) for p in paths])
  assert not np.array_equal(model.predict(squashed), from_files)  # a crop, not a squash


def test_eval_s_bad_inputs_are_user_errors_before_anything_is_written(run, tmp_path):
  workdir, _ = run
  with pytest.raises(UserError, match="holds no checkpoint of step 3; it holds steps \\[10\\]"):
    trained.evaluate(workdir, step=3)
  with pytest.raises(UserError, match="eval does not change learning_rate"):
    trained.evaluate(workdir, overrides=[("learning_rate", "0.1")])
  with pytest.raises(UserError, match="holds no config.json"):
    trained.evaluate(tmp_path)
  other = Path(shutil.copytree(SLICE, tmp_path / "other"))
  shutil.move(other / "train" / "truck", other / "train" / "lorry")
  shutil.move(other / "test" / "truck", other / "test" / "lorry")
  with pytest.raises(UserError, match="same classes"):
    trained.evaluate(workdir, overrides=[("data_dir", str(other))])
  empty = tmp_path / "empty"
  shutil.copytree(workdir, empty, ignore=shutil.ignore_patterns("checkpoints"))
  with pytest.raises(UserError, match="holds no checkpoint; train into it first"):
    trained.evaluate(empty)
  with pytest.raises(SystemExit) as e:  # argparse: its usage and an error line
    trained.main(["eval"])
  assert e.value.code == EXIT_USER_ERROR
  assert trained.main(["evaluate", str(workdir)]) == EXIT_USER_ERROR


def test_predict_over_the_test_folder_gives_the_eval_s_accuracy_in_its_csv(run, tmp_path):
  workdir, final = run
  test = workdir.parent / "data" / "test"
  odd = tmp_path / "odd"
  odd.mkdir()
  Image.new("I;16", (57, 31), 40000).save(odd / "wide16.png")  # any size and mode
  (odd / "broken.jpg").write_bytes(b"not a jpeg")
  output = tmp_path / "predictions.csv"
  code = trained.main(
    ["predict", str(workdir), str(test), str(odd), "--top_k=3", f"--output={output}"]
  )
  assert code == 0
  with open(output) as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0]) == [
    "path",
    "class",
    "probability",
    "class_2",
    "probability_2",
    "class_3",
    "probability_3",
  ]
  assert len(rows) == 80 + 1  # the broken file skipped
  from_test = [r for r in rows if Path(r["path"]).is_relative_to(test)]
  correct = [Path(r["path"]).parent.name == r["class"] for r in from_test]
  assert sum(correct) == round(final["eval_accuracy"] * final["eval_examples"])
  assert all(float(r["probability"]) >= float(r["probability_2"]) for r in rows)


def test_predict_s_bad_inputs_are_user_errors(run, tmp_path, capsys):
  workdir, _ = run
  assert trained.main(["predict", str(workdir), str(tmp_path / "absent.jpg")]) == EXIT_USER_ERROR
  assert "absent.jpg does not exist" in capsys.readouterr().err
  assert trained.main(["predict", str(workdir), str(tmp_path), "--top_k=11"]) == EXIT_USER_ERROR
  (tmp_path / "notes.txt").write_text("no images here")
  assert trained.main(["predict", str(workdir), str(tmp_path)]) == EXIT_USER_ERROR
  assert "no image files under" in capsys.readouterr().err


def _five_classes(tmp_path) -> Path:
  """The slice's last 5 classes: another task for the pretrained network."""
  data = tmp_path / "five"
  for split in ("train", "test"):
    for name in sorted(p.name for p in (SLICE / split).iterdir())[5:]:
      shutil.copytree(SLICE / split / name, data / split / name)
  return data


def test_a_fine_tune_starts_from_the_run_s_weights_with_a_new_head_and_a_frozen_backbone(
  run, tmp_path, capsys
):
  workdir, _ = run
  source = trained.load(workdir)
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(_five_classes(tmp_path)), batch_size=16)
  config.update(eval_batch_size=8, num_train_steps=3, log_every_steps=1, init_from=str(workdir))
  config.model.num_classes = 5
  config.param_groups = {"backbone": {"match": "^Conv_", "optimizer": "frozen"}}
  final = train_and_evaluate(config, str(tmp_path / "fine"))
  line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("initialised from")]
  assert line == [
    f"initialised from {workdir} (step 10): 10 arrays of params and BatchNorm statistics taken; "
    "2 initialised afresh (another shape, or absent there): params/Dense_1/bias, "
    "params/Dense_1/kernel; optimizer state and step start fresh"
  ]
  assert final["init_from"]["fresh"] == ["params/Dense_1/bias", "params/Dense_1/kernel"]
  tuned = trained.load(tmp_path / "fine")
  for name in ("Conv_0", "Conv_3"):  # frozen: exactly the pretrained weights
    np.testing.assert_array_equal(
      tuned.variables["params"][name]["kernel"], source.variables["params"][name]["kernel"]
    )
  assert tuned.variables["params"]["Dense_1"]["kernel"].shape == (512, 5)
  # A resumed fine-tune resumes its own checkpoint and never reads init_from again (a path
  # that does not exist: reading it would be an error).
  config.update(num_train_steps=4, init_from=str(tmp_path / "gone"))
  train_and_evaluate(config, str(tmp_path / "fine"), allow_data_change=True)
  output = capsys.readouterr().out
  assert "resumed from the checkpoint at step 3" in output and "initialised from" not in output
  lines = (tmp_path / "fine" / "metrics.jsonl").read_text().splitlines()
  assert [r["step"] for r in map(json.loads, lines) if "loss" in r] == [1, 2, 3, 4]  # none twice
  launches = (tmp_path / "fine" / "launches.jsonl").read_text().splitlines()
  assert [json.loads(x)["steps"] for x in launches] == [[0, 3], [3, 4]]


def test_init_from_a_missing_path_or_another_architecture_is_a_user_error(run, tmp_path):
  workdir, _ = run
  config = configuration.load("configs/cifar_vgg.py:smoke")
  # No data there: each error below comes before any data is looked for.
  config.update(dataset="folder", data_dir=str(tmp_path / "no-data"))
  config.init_from = str(tmp_path / "absent")
  with pytest.raises(UserError, match="neither a run's workdir nor one of its checkpoints"):
    train_and_evaluate(config, str(tmp_path / "a"))
  config.init_from = str(workdir / "checkpoints" / "3")
  with pytest.raises(UserError, match="holds no checkpoint of step 3"):
    train_and_evaluate(config, str(tmp_path / "b"))
  config.init_from = str(workdir)  # a Keras CNN's weights for VGG
  with pytest.raises(UserError, match="none of its parameters matches this model's"):
    train_and_evaluate(config, str(tmp_path / "c"))
  assert not any((tmp_path / d).exists() for d in "abc")


def test_a_workdir_keeps_what_each_launch_used_and_a_rerun_on_other_data_does_not_rewrite_it(
  tmp_path,
):
  first = Path(shutil.copytree(SLICE, tmp_path / "first"))
  other = Path(shutil.copytree(SLICE, tmp_path / "other"))
  first_cat, second_cat = sorted(other.glob("train/cat/*.jpg"))[:2]
  shutil.copyfile(second_cat, first_cat)  # the same classes and size, other content
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(dataset="folder", data_dir=str(first), batch_size=32, eval_batch_size=16)
  config.update(num_train_steps=2, log_every_steps=1)
  workdir = tmp_path / "run"
  train_and_evaluate(config, str(workdir))
  trained_on = (workdir / "data.json").read_text(), (workdir / "config.json").read_text()
  # The rerun a newcomer tried for an eval on other data: it trains nothing.
  config.data_dir = str(other)
  train_and_evaluate(config, str(workdir), allow_data_change=True)
  assert ((workdir / "data.json").read_text(), (workdir / "config.json").read_text()) == trained_on
  launches = [json.loads(x) for x in (workdir / "launches.jsonl").read_text().splitlines()]
  assert [r["steps"] for r in launches] == [[0, 2], [2, 2]]
  assert [r["config"]["data_dir"] for r in launches] == [str(first), str(other)]
  # The original command still resumes: the run was trained on the first folder only.
  config.update(data_dir=str(first), num_train_steps=3)
  train_and_evaluate(config, str(workdir))
  # Training on the other folder, refused, names which launch used which data.
  config.update(data_dir=str(other), num_train_steps=4)
  with pytest.raises(
    UserError, match=r"was trained on folder \(content \w+\) in launches 1, 3, but"
  ):
    train_and_evaluate(config, str(workdir))


def test_predict_and_a_fine_tune_run_on_one_device_as_on_8(run, on_one_device, tmp_path):
  workdir, _ = run
  (_, _), (code, output), (tuned, tune_output) = on_one_device
  assert code == 0, output[-2000:]
  one = Path(re.search(r"wrote \d+ predictions to (\S+)", output)[1])
  test = workdir.parent / "data" / "test"
  assert (
    trained.main(["predict", str(workdir), str(test), f"--output={tmp_path / 'eight.csv'}"]) == 0
  )
  rows = lambda path: list(csv.DictReader(path.read_text().splitlines()))
  assert [row["path"] for row in rows(one)] == [row["path"] for row in rows(tmp_path / "eight.csv")]
  assert {row["class"] for row in rows(one)} <= set(trained.load(workdir).classes)
  assert tuned == 0, tune_output[-2000:]
  assert "2 initialised afresh (another shape, or absent there): params/Dense_1/bias" in tune_output


def test_ctrl_c_in_predict_is_one_line_and_130_and_leaves_the_output_file_as_it_was(tmp_path):
  output = tmp_path / "predictions.csv"
  output.write_text("an earlier file\n")
  # A Ctrl-C while the CSV is being written: the earlier file stays, no partial file is left.
  program = f"""
import csv, sys
from research import trained
class Interrupted:
  def __init__(self, f): pass
  def writerow(self, row): pass
  def writerows(self, rows): raise KeyboardInterrupt
csv.writer = Interrupted
rows = [dict(path="a.jpg", classes=["cat"], probabilities=[1.0])]
trained.predict = lambda *args, **kwargs: trained._write(rows, 1, {str(output)!r})
sys.exit(trained.main(["predict", "WORKDIR", "a.jpg", "--output={output}"]))
"""
  result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
  assert result.returncode == 130
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert lines == ["predict interrupted (Ctrl-C); nothing more was written"], result.stderr
  assert output.read_text() == "an earlier file\n"
  assert list(tmp_path.iterdir()) == [output]


def test_an_ema_run_with_a_fork_s_eval_metric_evaluates_loads_and_fine_tunes(tmp_path):
  """The EMA of the weights is what eval, load and init_from use; an eval metric registered
  here is in the run's records and `eval` reproduces it."""
  config = _config(SLICE)
  config.ema_decay, config.eval_metrics = 0.5, ("test_top3",)
  final = train_and_evaluate(config, str(tmp_path / "run"))
  assert final["eval_weights"] == "ema"
  assert final["eval_accuracy"] < final["eval_test_top3"] < 1  # top-3 counts more, not all
  _, saved = checkpoint.read(tmp_path / "run")
  leaves = jax.tree.leaves
  pairs = lambda a, b: zip(leaves(a), leaves(b), strict=True)
  assert any(not np.array_equal(a, b) for a, b in pairs(saved["ema_params"], saved["params"]))
  for a, b in pairs(trained.load(tmp_path / "run").variables["params"], saved["ema_params"]):
    np.testing.assert_array_equal(a, b)  # load and predict use the average
  record = trained.evaluate(tmp_path / "run")
  assert record["eval_weights"] == "ema" and record["eval_loss"] == final["eval_loss"]
  assert record["eval_test_top3"] == final["eval_test_top3"]
  config.update(init_from=str(tmp_path / "run"), ema_decay=0.0)
  for a, b in pairs(setup(config, fine_tune=True).state.params, saved["ema_params"]):
    np.testing.assert_array_equal(a, b)  # a fine-tune starts from the average
