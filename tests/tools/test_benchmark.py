"""The benchmarks' own code paths run (their ratios are measured on real hosts, not here)."""

import json
import sys

import pytest

from research import configuration
from research.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR
from tools import benchmark

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)


def test_host_augmented_batches_from_worker_processes_train_the_step():
  config = configuration.load("configs/cifar_vgg.py:smoke")
  assert benchmark.host_augmented(config, steps=2, workers=1) > 0  # examples/s


def test_the_seeds_bench_times_each_way_of_running_seeds():
  # :smoke's sizes and tests/test_sweep.py's first seed: the steps its runs train with
  smoke, same = "configs/cifar_vgg.py:smoke", dict(synthetic_train_size=1024, seed=1)
  rows = benchmark.seeds_cost(smoke, False, [1, 2], rounds=1, seconds=0.01, **same)
  assert list(rows) == ["1", "2 vmap", "2 unroll"]
  assert rows["1"]["per_seed_step_vs_one"] == 1.0
  assert all(r["sec_per_step"] > 0 for r in rows.values())


def test_the_sweep_bench_sweeps_learning_rates_around_the_config_s(monkeypatch):
  """`--only sweep` times seeds_cost's steps (above) over a sweep of N learning rates."""

  class Built(Exception):
    pass

  def bare(config):  # the config it would time, before anything is compiled
    raise Built(config.sweep)

  monkeypatch.setattr(benchmark, "_bare", bare)
  with pytest.raises(Built, match=r"^learning_rate=0.00025,0.0005,0.001,0.002$"):  # :smoke's 1e-3
    benchmark.seeds_cost("configs/cifar_keras_cnn.py:smoke", False, [4], 1, axis="sweep")


def test_a_bench_stopped_early_keeps_what_it_measured(tmp_path, monkeypatch, capsys):
  """Each measurement is written as it ends: a GPU lease's time limit or a Ctrl-C in the
  second config's forms leaves the first's."""
  first, second = "configs/cifar_keras_cnn.py:smoke", "configs/cifar_vgg.py:smoke"

  def form_gains(path, variants, rounds):
    if path == second:
      raise KeyboardInterrupt
    return {"gain": {"a variant": 1.5}}

  def exit_interrupted(message):  # the real one ends the process at once (os._exit)
    print(message, file=sys.stderr)
    raise SystemExit(EXIT_INTERRUPTED)

  monkeypatch.setattr(benchmark, "form_gains", form_gains)
  monkeypatch.setattr(benchmark, "exit_interrupted", exit_interrupted)
  workdir = tmp_path / "bench"
  argv = ["benchmark", f"--workdir={workdir}", "--only=forms", f"--configs={first},{second}"]
  monkeypatch.setattr(sys, "argv", [*argv, "--system-malloc"])
  with pytest.raises(SystemExit) as exit:
    benchmark.main()
  assert exit.value.code == EXIT_INTERRUPTED
  output = capsys.readouterr()
  assert f"measured forms {first}" in output.out and f"forms {second}" not in output.out
  assert output.err.strip() == f"interrupted: what was measured is in {workdir / 'benchmark.json'}"
  written = json.loads((workdir / "benchmark.json").read_text())
  assert written["forms"] == {first: {"gain": {"a variant": 1.5}}} and not written["finished"]


@pytest.mark.parametrize(
  "args, message",
  [
    (["--only=train", "--steps=0"], "--steps=0: give a number above 0"),
    (["--only=decode", "--jpegs=0"], "--jpegs=0: give a number above 0"),
    (
      ["--only=forms", "--variants=all,bogus"],
      "--variants: no variant 'bogus'; there are 'default', ",
    ),
    (["--only=forms", "--configs=configs/nope.py,"], "config file configs/nope.py not found"),
    (["--only=decode", "--workdir=/etc/passwd/x"], "--workdir=/etc/passwd/x is inside /etc/passwd"),
    (["--only=seeds", "--seeds=1,0"], "--seeds='1,0': give seed counts of 1 or more"),
  ],
)
def test_bad_arguments_are_one_error_line_before_anything_runs(
  args, message, tmp_path, monkeypatch, capsys
):
  workdir = tmp_path / "bench"
  # --system-malloc: this pytest process's allocator stays as it is
  argv = ["benchmark", f"--workdir={workdir}", *args, "--system-malloc"]  # args win
  monkeypatch.setattr(sys, "argv", argv)
  with pytest.raises(SystemExit) as exit:
    benchmark.main()
  assert exit.value.code == EXIT_USER_ERROR
  error = capsys.readouterr().err
  assert error.startswith(f"error: {message}") and error.count("\n") == 1
  assert not workdir.exists()
