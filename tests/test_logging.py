"""What a run says while it runs: every line with elapsed time and ETA, never silent for long."""

import importlib.metadata
import json
import re

import pytest

from research import configuration, progress
from research.train import train_and_evaluate


@pytest.mark.end_to_end
def test_lines_carry_elapsed_and_eta_slow_steps_log_on_time_and_long_runs_are_named(
  tmp_path, capsys, monkeypatch
):
  monkeypatch.setattr(progress, "LONG_RUN_SEC", 0.0)  # any projection counts as long here
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  # Steps alone would log at 1 and 6; time makes every step a log step.
  config.update(num_train_steps=6, log_every_steps=1000, log_every_seconds=1e-9)
  train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr().out
  lines = [line for line in out.splitlines() if line.startswith("step ")]
  assert [int(line.split(",")[0].removeprefix("step ")) for line in lines] == [1, 2, 3, 4, 5, 6]
  assert all(re.search(r"elapsed \d+:\d\d:\d\d, ETA \d+:\d\d:\d\d$", line) for line in lines)
  assert out.count("steps left take about") == 1 and ":smoke variant" in out


@pytest.mark.end_to_end
def test_metadata_records_the_installed_package_versions(tmp_path):
  config = configuration.load("configs/cifar_keras_cnn.py:smoke")
  config.update(num_train_steps=1)
  train_and_evaluate(config, str(tmp_path))
  meta = json.loads((tmp_path / "metadata.jsonl").read_text().splitlines()[0])
  for name in ("jax", "jaxlib", "flax", "optax", "numpy", "orbax-checkpoint"):
    assert meta["packages"][name] == importlib.metadata.version(name), name
