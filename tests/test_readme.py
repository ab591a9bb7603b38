"""The README is a tested document: its Python example runs as written (its fork guide,
docs/extending.md, is tested in test_extending.py)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from research import configuration, trained
from research.train import train_and_evaluate

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
  return README.split(f"\n## {title}\n")[1].split("\n## ")[0]


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
  # What the example printed is the run's prediction for that image, computed here again: the
  # same program on the same kernels gives the same float32. print() writes a float32 as the
  # shortest decimal that reads back as it, within half a unit in its last place (2^-24 of it).
  run = trained.load(tmp_path / workdir)
  expected = run.predict([str(tmp_path / "cat.jpg")])  # [1, 10]: the example's image
  assert name == run.classes[expected.argmax()]
  assert abs(float(probability) - float(expected.max())) <= 2**-24 * float(expected.max())
