"""The scaling report: one child process per device count, a CSV row each, a plot."""

import csv
import json

import pytest

from research import configuration
from research.errors import UserError
from tools import scaling

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)


def test_device_counts_double_up_to_all_devices():
  assert scaling.device_counts(8) == [1, 2, 4, 8]
  assert scaling.device_counts(6) == [1, 2, 4, 6]
  assert scaling.device_counts(1) == [1]


def test_report_writes_a_row_per_device_count_and_a_plot_and_a_rerun_trains_fresh(
  tmp_path, monkeypatch
):
  # 1 and all 8 devices: on 8 both modes train the config's global batch, measured once (three
  # child runs), and the smoke config's programs on 1 and 8 devices are those other tests run.
  monkeypatch.setattr(scaling, "device_counts", lambda n: [1, 8])
  spec = "configs/cifar_keras_cnn.py:smoke"
  config = configuration.load(spec)
  config.update(scaling_steps=6, scaling_strong=True)
  rows = scaling.run(config, spec, [("scaling_steps", "6")], tmp_path)

  with open(tmp_path / "scaling.csv") as f:
    saved = list(csv.DictReader(f))
  assert [(r["mode"], r["n_devices"], r["global_batch"]) for r in saved] == [
    ("weak", "1", "8"),  # the config's 8 per device (64 over 8 devices)
    ("weak", "8", "64"),
    ("strong", "1", "64"),
    ("strong", "8", "64"),
  ]
  # Strong scaling: one run at two speeds. That its losses are the same on any device count is
  # tests/test_device_count.py's (in float64); here, that each mode trains and is recorded.
  assert rows[0]["speedup"] == 1.0 and all(r["examples_per_sec"] > 0 for r in rows)
  assert (tmp_path / "scaling.png").stat().st_size > 10_000
  first = tmp_path / "scaling" / "run-1"
  assert sorted(p.name for p in first.iterdir() if p.is_dir()) == ["strong-1", "weak-1", "weak-8"]
  lines = (first / "weak-1" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(x)["step"] for x in lines if "loss" in x][0] == 1

  # A second report into the same workdir does not resume the first one's children: each
  # child trains in a directory of its own, which does not exist yet.
  children = []

  def measure(spec, overrides, run_dir, n, batch, config, backend):
    children.append((run_dir.relative_to(tmp_path / "scaling").as_posix(), run_dir.exists()))
    numbers = {"examples_per_sec": 100.0 * n, "sec_per_batch": 1.0, "input_wait_fraction": 0}
    numbers.update(final_loss=1.0, eval_accuracy=0.5)
    return {"n_devices": n, "global_batch": batch, "per_device_batch": batch // n, **numbers}

  monkeypatch.setattr(scaling, "_measure", measure)
  again = scaling.run(config, spec, [("scaling_steps", "6")], tmp_path)
  assert [(r["mode"], r["n_devices"]) for r in again] == [(r["mode"], r["n_devices"]) for r in rows]
  assert children == [("run-2/weak-1", False), ("run-2/weak-8", False), ("run-2/strong-1", False)]


def test_a_scaling_report_checks_every_device_count_before_the_first_runs():
  config = configuration.load("configs/cifar_vgg.py:smoke")
  config.update(scaling_report=True, scaling_strong=True, batch_size=18, eval_batch_size=18)
  with pytest.raises(UserError, match=r"batch_size=18 on \[1, 2, 4, 6\] devices; .* over 4"):
    scaling.check_config(config, 6)  # 6 GPUs: 18 divides over 1, 2 and 6, not over 4
