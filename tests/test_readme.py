"""The README is a tested document: its fork recipe passes the suite as written."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from PIL import Image

from research import configuration
from research.train import train_and_evaluate

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
  return README.split(f"\n## {title}\n")[1].split("\n## ")[0]


def _files(section: str) -> dict[str, str]:
  """{path: text} of each code block preceded by a line naming its file: `path`:"""
  return dict(re.findall(r"\n`([\w/]+\.py)`:\n\n```python\n(.*?)```", section, re.S))


def test_the_fork_recipe_copied_verbatim_passes_ruff_and_the_config_tests(tmp_path):
  files = _files(_section("Adding an experiment"))
  assert sorted(files) == ["configs/cifar_resnet.py", "research/models/resnet.py"]
  scratch = tmp_path / "checkout"
  ignore = shutil.ignore_patterns(".git", ".venv", "runs", ".pytest_cache", "__pycache__")
  shutil.copytree(ROOT, scratch, ignore=ignore)
  for path, text in files.items():
    assert not (scratch / path).exists(), f"{path} is in the repository; the recipe adds it"
    (scratch / path).write_text(text)

  ruff = Path(sys.executable).parent / "ruff"
  for check in (["check"], ["format", "--check"]):
    result = subprocess.run(
      [str(ruff), *check, *files], cwd=scratch, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr

  # The config tests, run on the scratch checkout as the suite would run them on a fork; the
  # persistent compilation cache is the suite's own (set in conftest.py, inherited here).
  result = subprocess.run(
    [sys.executable, "-m", "pytest", "-o", "addopts=-q", "-p", "no:cacheprovider"]
    + ["tests/test_configs.py", "-k", "cifar_resnet"],
    cwd=scratch,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  # It loads, has :smoke, trains, and its documented commands pass the checks.
  assert re.search(r"\b6 passed\b", result.stdout), result.stdout[-2000:]

  # Its loss and mixup train: the focal loss is below cross-entropy from the first step on
  # (the same initial parameters and batch), and the run with both ends with an eval.
  def first_loss(variants):
    workdir = scratch / "runs" / variants.replace(",", "-")
    command = [
      sys.executable,
      "-m",
      "research.main",
      f"--config=configs/cifar_resnet.py:{variants}",
    ]
    command += [f"--workdir={workdir}", "--config.num_train_steps=2", "--config.log_every_steps=1"]
    run = subprocess.run(command, cwd=scratch, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "eval at step 2" in run.stdout, run.stderr[-2000:]
    return json.loads((workdir / "metrics.jsonl").read_text().splitlines()[0])["loss"]

  assert first_loss("smoke,focal") < first_loss("smoke")
  first_loss("smoke,mixup,focal")


def test_the_python_example_of_using_a_trained_model_runs_as_written(tmp_path):
  code = re.search(r"```python\n(.*?)```", _section("Using a trained model"), re.S).group(1)
  workdir = re.search(r'trained\.load\("([^"]+)"\)', code).group(1)
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(num_train_steps=2, log_every_steps=1)
  train_and_evaluate(config, str(tmp_path / workdir))
  Image.new("RGB", (40, 30), (200, 120, 40)).save(tmp_path / "cat.jpg")
  result = subprocess.run(
    [sys.executable, "-c", code],
    cwd=tmp_path,
    env={**os.environ, "PYTHONPATH": str(ROOT)},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  name, probability = result.stdout.split()
  assert name in [str(i) for i in range(10)] and 0.1 <= float(probability) <= 1  # synthetic data
