"""The report measures on a CPU host too, and every table of results is its records rendered."""

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from research.errors import EXIT_USER_ERROR, UserError
from tests.test_resilience import STOPS_ITSELF
from tools import measure, report, results

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

ROOT = Path(__file__).parent.parent.parent


def test_the_readme_results_page_and_benchmarks_tables_are_the_committed_records_rendered():
  rendered = results.rendered(results.load(), report.expected_rows())
  assert set(rendered) == {ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "BENCHMARKS.md"}
  for path, text in rendered.items():
    assert path.read_text() == text, (
      f"{path.relative_to(ROOT)} differs from results/; ./launch.sh report --render"
    )


def _speedrun_record(numbers: dict | None = None, **fields) -> dict:
  """A committed record (a CPU's float32 speedrun, seed 2) with other `fields` and `numbers`."""
  record = json.loads(
    (results.RESULTS / "amd-epyc-2-cores/main-cifar_speedrun-seed2.json").read_text()
  )
  record.update(fields)
  record["numbers"].update(numbers or {})
  return record


def test_the_readme_summary_is_each_config_s_latest_run_of_each_dtype_on_its_fastest_machine(
  tmp_path,
):
  gpu = {"kind": "NVIDIA H100", "count": 1, "platform": "gpu", "cpu_model": "x", "host_cores": 16}
  on_gpu = dict(machine="1x-nvidia-h100", device=gpu)
  fast = {"examples_per_sec": 90000.0}
  for seed, date in ((0, "2026-11-24"), (1, "2026-11-26")):  # one recipe's seeds: one row
    name, label = f"cifar_speedrun-bfloat16-seed{seed}", f"Speedrun (8 epochs), seed {seed}"
    results.write(
      _speedrun_record(name=name, label=label, dtype="bfloat16", date=date, numbers=fast, **on_gpu),
      tmp_path,
    )
  results.write(
    _speedrun_record(name="cifar_speedrun-seed0", label="Speedrun (8 epochs), seed 0",
                     date="2026-11-20", numbers=fast, **on_gpu),
    tmp_path,
  )  # fmt: skip
  seeds4 = _speedrun_record(
    name="cifar_speedrun-bfloat16-seeds4", label="Speedrun (8 epochs), 4 seeds in one program",
    dtype="bfloat16", date="2026-11-25", **on_gpu,
    numbers={**fast, "seeds": [0, 1, 2, 3], "test_accuracy": [0.90, 0.91, 0.92, 0.93]},
  )  # fmt: skip
  results.write(seeds4, tmp_path)
  results.write(_speedrun_record(), tmp_path)  # float32 on a CPU, later than the GPU's float32

  rows = results.summary_table(results.load(tmp_path)).splitlines()[2:]
  assert [row.split(" | ")[0] for row in rows] == [
    "| Speedrun (8 epochs), bfloat16, seeds 0–1",
    "| Speedrun (8 epochs), float32, seed 0",
  ]
  assert rows[0].endswith("| 1× NVIDIA H100, 2026-11-24 – 2026-11-26 |")
  assert rows[1].endswith("| 1× NVIDIA H100, 2026-11-20 |")

  results.write({**seeds4, "date": "2026-11-27"}, tmp_path)  # now the latest in bfloat16
  rows = results.summary_table(results.load(tmp_path)).splitlines()[2:]
  assert rows[0].startswith("| Speedrun (8 epochs), 4 seeds in one program, bfloat16 |")
  assert len(rows) == 2


def test_the_seeds_of_one_recipe_share_a_row_with_their_mean_and_spread(tmp_path):
  seed0 = json.loads(
    (results.RESULTS / "amd-epyc-2-cores/main-cifar_speedrun-seed2.json").read_text()
  )  # a committed record, made seed 0 of a resumed run
  seed0.update(name="cifar_speedrun-seed0", label="Speedrun (8 epochs), seed 0", date="2026-11-24")
  seed0["numbers"].update(test_accuracy=0.9088, test_accuracy_first_view=0.8984)
  seed0["command"] = seed0["command"].replace("--config.seed=2", "--config.seed=0")
  seed0["overrides"]["seed"] = 0
  del seed0["numbers"]["train_sec"]
  seed1 = json.loads(json.dumps(seed0))
  seed1.update(name="cifar_speedrun-seed1", label="Speedrun (8 epochs), seed 1", date="2026-11-25")
  seed1["numbers"].update(test_accuracy=0.9012, test_accuracy_first_view=0.8920, wall_time_sec=3600)
  seed1["numbers"]["train_sec"] = 3500.0  # one launch; seed 0 was resumed: no training time
  seed1["command"] = seed0["command"].replace("--config.seed=0", "--config.seed=1")
  for record in (seed0, seed1):
    results.write(record, tmp_path)
  table = results.main_table(results.load(tmp_path), report.expected_rows())
  rows = [line for line in table.splitlines() if "Speedrun (8 epochs), float32" in line]
  mean_time = results._duration((seed0["numbers"]["wall_time_sec"] + 3600) / 2)
  assert rows[0].startswith(
    "| Speedrun (8 epochs), float32, seeds 0–1 | cifar10-jpeg (50,000 train, 10,000 test) | "
    f"mean 90.50 ± 0.54 % with TTA (mean 89.52 ± 0.45 % without) | mean {mean_time} |"
  ), rows
  assert "2-core AMD EPYC (1 CPU device), 2026-11-24 – 2026-11-25 |" in rows[0]
  assert "(training" not in rows[0]  # not every seed has it
  assert (
    "--config.seed=SEED --config.dataset=folder --config.data_dir=DIR` (SEED = 0, 1) |" in rows[0]
  )
  assert (
    rows[1].startswith("| Speedrun (8 epochs), float32, seed 2 |") and "not measured yet" in rows[1]
  )
  assert len(rows) == 2
  results.plot(results.load(tmp_path), tmp_path / "plot.png")
  assert (tmp_path / "plot.png").stat().st_size > 0


def test_seeds_in_one_program_are_a_row_with_their_mean_spread_and_time_a_seed(tmp_path):
  record = json.loads(
    (results.RESULTS / "amd-epyc-2-cores/main-cifar_speedrun-seed2.json").read_text()
  )  # a committed record, made a run of seeds 0-3 in one program
  label = "Speedrun (8 epochs), 4 seeds in one program"
  record.update(name="cifar_speedrun-bfloat16-seeds4", label=label, dtype="bfloat16")
  record["numbers"].update(
    test_accuracy=[0.90, 0.91, 0.92, 0.93],
    test_accuracy_first_view=[0.89, 0.90, 0.91, 0.92],
    seeds=[0, 1, 2, 3],
    train_sec=10.0,
  )
  results.write(record, tmp_path)
  table = results.main_table(results.load(tmp_path), report.expected_rows())
  row = next(line for line in table.splitlines() if label in line and "%" in line)
  assert "| mean 91.50 ± 1.29 % with TTA (mean 90.50 ± 1.29 % without) |" in row
  assert "(training 10.0 s), 2.50 s a seed |" in row


def test_the_speedrun_against_airbench_takes_the_place_of_its_not_measured_row(tmp_path):
  (m,) = [m for m in report.plan("gpu", 16) if m.name == "cifar_speedrun-airbench"]
  device = {
    "kind": "NVIDIA H100",
    "count": 1,
    "platform": "gpu",
    "cpu_model": "x",
    "host_cores": 16,
  }
  numbers = {
    "runs": 2,
    "train_sec": [2.8, 3.2],
    "span_sec": [3.0, 3.4],
    "compile_sec": [41.0, 43.0],
    "test_accuracy": [0.91, 0.92],
    "peer_time_sec": [2.5, 2.7],
    "peer_test_accuracy": [0.905, 0.915],
    "ratio": 3.2 / 2.6,
  }
  record = measure._record(
    m, device, measure.speedrun_peer_command(m), numbers, dataset="cifar10-jpeg"
  )
  expected = report.expected_rows()
  before = results.main_table([], expected)
  assert "| Speedrun (8 epochs) against airbench94_muon, bfloat16 | cifar10-jpeg (50,000 " in before
  table = results.main_table([record], expected)
  assert (
    "| Speedrun (8 epochs) against airbench94_muon, bfloat16 | cifar10-jpeg (50,000" not in table
  )
  assert (
    "| Speedrun (8 epochs) against airbench94_muon, bfloat16, 2 runs each | cifar10-jpeg | "
    "ours mean 91.50 ± 0.71 % with TTA, airbench94_muon mean 91.00 ± 0.71 % | whitening init, "
    "training and TTA eval: ours 3.20 ± 0.28 s (training alone 3.00 ± 0.28 s; compile 42 s "
    "apart), airbench94_muon 2.60 ± 0.14 s; ours ÷ theirs 1.23 |  | "
    "1× NVIDIA H100, "
  ) in table
  assert "`./launch.sh report --only peer:cifar_speedrun-airbench --airbench " in table
  assert "airbench94_muon: its revision not recorded |" in table  # a record made before


def test_a_peer_record_names_the_script_that_ran_its_source_revision_and_checksum(tmp_path):
  script = tmp_path / "cifar10_speedrun.py"
  script.write_text("print('an edited copy')\n")
  peer = measure.SPEEDRUN_PEERS["hiverge"]
  sha256 = hashlib.sha256(script.read_bytes()).hexdigest()
  edited = peer.identity(script)
  assert edited["revision"].startswith("unknown") and edited["sha256"] == sha256
  pinned = dataclasses.replace(peer, sha256=sha256).identity(script)  # as if it were the file
  assert pinned == {
    "source": f"github.com/hiverge/cifar10-speedrun/blob/{peer.revision}/cifar10_speedrun.py",
    "revision": peer.revision,
    "sha256": sha256,
  }
  assert peer.url.endswith(f"/hiverge/cifar10-speedrun/{peer.revision}/cifar10_speedrun.py")
  cell = lambda script: results._peer_script({"peer_script": script})
  assert cell(pinned) == f"{pinned['source']} (sha256 {sha256[:12]}…)"
  assert cell(edited) == f"not the pinned file (sha256 {sha256[:12]}…)"


def _report(tmp_path, *args, program=("-m", "tools.report")):
  command = [sys.executable, *program, "--scale=tiny", *args]
  command += [f"--results={tmp_path / 'results'}", f"--workdir={tmp_path / 'runs'}"]
  return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)


# The report, its training run made one that sends itself SIGTERM once step 2 is logged
# (tests/test_resilience.py's STOPS_ITSELF, argv[1]): stopped as the budget stops a run (the
# budget's SIGTERM), but after it has trained, and at a step the test does not wait for.
REPORT_WHOSE_RUN_STOPS_ITSELF = """
import signal, sys
from tools import measure, report
run_child, stops_itself = measure.run_child, sys.argv.pop(1)

def run_stopping_itself(command, **kwargs):
  python, _, _, *args = command  # python -m research.main ARGS
  return run_child([python, "-c", stops_itself, str(int(signal.SIGTERM)), "2", *args], **kwargs)

measure.run_child = run_stopping_itself
sys.exit(report.main())
"""


def test_the_report_writes_records_resumes_a_stopped_run_and_its_table_renders(tmp_path):
  data = f"--data={ROOT / 'tests' / 'data' / 'cifar10_slice'}"
  # The budget spent before the run has trained (a second): stopped, nothing recorded.
  stopped = _report(tmp_path, "--only=main", data, "--budget=0.1")
  assert "stopped at the budget; run the report again" in stopped.stdout, stopped.stdout
  assert not (tmp_path / "results").exists()
  # Stopped again once it has trained a step or two (SIGTERM after step 2: it checkpoints)...
  program = ("-c", REPORT_WHOSE_RUN_STOPS_ITSELF, STOPS_ITSELF)
  stopped = _report(tmp_path, "--only=main", data, program=program)
  assert "stopped at the budget; run the report again" in stopped.stdout, stopped.stdout
  assert not (tmp_path / "results").exists()
  # ... the next report resumes it from its checkpoint and finishes it.
  done = _report(tmp_path, "--only=main", data)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  assert "main       vgg_smoke                  to measure" in done.stdout
  resumed = int(re.search(r"resumed from the checkpoint at step (\d+)", done.stdout)[1])
  assert resumed in (2, 3), done.stdout  # the step after which the stop was taken
  (workdir,) = (tmp_path / "runs").glob("*/main-vgg_smoke")
  launches = [json.loads(x)["steps"] for x in (workdir / "launches.jsonl").read_text().splitlines()]
  assert launches[-2:] == [[0, 6], [resumed, 6]]  # [from step, to step]: the second resumed
  trained = [r["step"] for r in measure._metrics(workdir) if "loss" in r]
  assert resumed in trained and trained == sorted(set(trained)) and trained[-1] == 6  # once each
  (record_path,) = (tmp_path / "results").glob("*/main-vgg_smoke.json")
  record = json.loads(record_path.read_text())
  assert record["numbers"]["eval_examples"] == 80 and record["numbers"]["steps"] == 6
  # Stopped after step 2, the run took its checkpoint before step 2's eval: the curve has the
  # evals that ran (where the signal is taken is the OS's: either is checked exactly).
  assert [step for _, step, _ in record["curve"]] == ([2, 4, 6] if resumed == 3 else [4, 6])
  assert record["device"]["count"] == 8 and record["versions"]["jax"]
  assert re.fullmatch(r"[0-9a-f]{40}(\+changes)?", record["code"])  # the commit measured
  assert record["command"].startswith("./launch.sh configs/cifar_vgg.py:smoke ")
  table = results.main_table(results.load(tmp_path / "results"), report.expected_rows())
  accuracy = f"{record['numbers']['test_accuracy']:.2%}".replace("%", " %")
  assert f"| VGG :smoke, float32 | cifar10_slice (160 train, 80 test) | {accuracy} |" in table
  assert (
    "| VGG-16 (200 epochs), bfloat16 | cifar10-jpeg (50,000 train, 10,000 test) | not measured"
    in table
  )

  again = _report(tmp_path, "--only=main", data)
  assert "recorded (--again redoes it)" in again.stdout and "wrote" not in again.stdout
  # --again trains anew: not the recorded run's final eval once more, under a new date
  redo = _report(tmp_path, "--only=main", data, "--again")
  assert "--again: removed" in redo.stdout and redo.returncode == 0, redo.stdout + redo.stderr
  assert "train_sec" in json.loads(record_path.read_text())["numbers"]  # one launch, step 0 on


def test_the_throughput_part_records_speed_flops_and_the_largest_batch_tried(tmp_path):
  result = _report(tmp_path, "--only=throughput:vgg_smoke-float32")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  records = {r["name"]: r for r in results.load(tmp_path / "results")}
  default, largest = records["vgg_smoke-float32"], records["vgg_smoke-float32-largest"]
  assert (default["numbers"]["batch_size"], largest["numbers"]["batch_size"]) == (64, 128)
  for record in (default, largest):
    numbers = record["numbers"]
    assert numbers["examples_per_sec"] > 0 and numbers["flops_per_step"] > 0
    rounds = numbers["examples_per_sec_rounds"]  # the steps timed twice, the median recorded
    assert len(rounds) == 2 and numbers["examples_per_sec"] == sum(rounds) / 2
    spread = f"{min(rounds):,.0f}–{max(rounds):,.0f} in 2 timings"
    assert spread in results.throughput_table([record])
    assert 0 < numbers["mfu"] < 1 and numbers["peak_source"].startswith("measured")
  assert largest["numbers"]["flops_per_step"] > 1.9 * default["numbers"]["flops_per_step"]
  assert largest["search_end"] == "limit" and "search_end" not in default  # 2 × the default


def test_the_flops_counted_are_the_models_and_the_step_traces_with_its_forms_after(monkeypatch):
  """A throughput record's FLOPs are counted on the lowered step with XLA's own ops (a GPU's
  compiled step calls cuDNN, which the analysis of a compiled program counts as nothing):
  the model's whether the step splits its batch into micro-batches or not (the split adds
  the micro-batches' gradients: about one add per parameter), and the step traces with its
  CPU forms, before the count and after it (JAX caches traces)."""
  import jax

  from research import configuration
  from research.placement import replicate
  from research.setup import setup
  from research.steps import AXIS

  def step(micro_batch_size):
    config = configuration.load("configs/cifar_keras_cnn.py:smoke")
    config.update(batch_size=128, synthetic_train_size=256, micro_batch_size=micro_batch_size)
    training = setup(config)
    args = replicate(training.state), next(training.inputs.batches(0))
    return training.micro_batch, training.train_step, args, training.state.params

  (split, split_step, args, params), (whole, whole_step, whole_args, _) = step(8), step(16)
  assert (split, whole) == (8, 16)  # 2 micro-batches of 8 on each of 8 devices, or 1 of 16
  p_split = jax.pmap(split_step, axis_name=AXIS)
  p_split.lower(*args)  # the split step traced with its forms before its count
  count = measure.model_flops(split_step, *args)
  # as on a plugin backend (CUDA's), where JAX has no analysis of a lowered program
  monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", lambda self: None)
  whole_count = measure.model_flops(whole_step, *whole_args)
  # the whole step traced after its count, as traced afresh
  after_count = jax.pmap(whole_step, axis_name=AXIS).lower(*whole_args).as_text()
  jax.clear_caches()
  assert jax.pmap(whole_step, axis_name=AXIS).lower(*whole_args).as_text() == after_count
  parameters = sum(x.size for x in jax.tree.leaves(params))
  assert whole_count > 1e10 and abs(count - whole_count) < 2 * parameters * jax.device_count()


@pytest.mark.parametrize("end", ["budget", "memory"])
def test_the_batch_search_records_the_largest_it_timed_and_why_it_ended_there(monkeypatch, end):
  """A fake step on a fake clock: a batch takes as many seconds as its size (twice the last
  at each doubling). With 300 s, batch 64 ends at 64 s and 128 at 192 s; 256 would end near
  448 s, so it is not started. Out of memory at 256 ends the search there too."""
  clock, tried = [0.0], []

  def step_speed(config, steps, rounds):
    tried.append(config.batch_size)
    if end == "memory" and config.batch_size == 256:
      raise RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating 1 GB")
    clock[0] += config.batch_size
    b = config.batch_size
    return dict(batch_size=b, examples_per_sec=1.0, flops_per_step=1e6 * b, micro_batch=b)

  monkeypatch.setattr(measure, "step_speed", step_speed)
  device = measure.device_info()
  monkeypatch.setattr(measure, "time", types.SimpleNamespace(time=lambda: clock[0]))
  monkeypatch.setattr(measure, "peak_tflops", lambda device, dtype: (1.0, "a test's"))
  smoke = measure.Measurement(
    "throughput", "vgg_smoke-float32", "VGG :smoke", "configs/cifar_vgg.py:smoke", steps=2,
    search_batch=True,
  )  # fmt: skip
  budget_end = 300.0 if end == "budget" else float("inf")
  records = measure.throughput(smoke, device, budget_end)
  assert tried == ([64, 128] if end == "budget" else [64, 128, 256])
  default, largest = records
  assert (default["numbers"]["batch_size"], largest["numbers"]["batch_size"]) == (64, 128)
  assert largest["name"] == "vgg_smoke-float32-largest" and largest["search_end"] == end
  row = results.throughput_table(records).splitlines()[-1]
  assert f"| 128 ({results.SEARCH_ENDS[end]}) |" in row


def test_peer_measurements_are_skipped_where_torch_does_not_import(tmp_path):
  hidden = tmp_path / "hidden" / "torch"
  hidden.mkdir(parents=True)
  (hidden / "__init__.py").write_text('raise ModuleNotFoundError("torch", name="torch")\n')
  env = {**os.environ, "PYTHONPATH": str(hidden.parent)}
  command = [sys.executable, "-m", "tools.report", "--scale=tiny", "--only=peer"]
  command += [f"--results={tmp_path / 'results'}", f"--workdir={tmp_path / 'runs'}"]
  result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
  assert result.returncode == 0 and "peer: skipped, torch does not import here" in result.stdout


def test_a_measurement_of_the_other_plan_is_named_with_its_scale(monkeypatch, capsys, tmp_path):
  only = "--only=peer:cifar_speedrun-airbench"  # the GPU plan's row, asked for on CPU
  argv = ["report", only, "--scale=cpu", f"--results={tmp_path}", f"--workdir={tmp_path}"]
  monkeypatch.setattr(sys, "argv", argv)
  assert report.main() == EXIT_USER_ERROR
  error = capsys.readouterr().err
  assert error.startswith("error: --only=peer:cifar_speedrun-airbench names no measurement of ")
  assert "the cpu plan; it is in the gpu plan (--scale=gpu)" in error and "\n" not in error[:-1]
  assert not any(tmp_path.iterdir())  # nothing written


def test_a_sigterm_to_the_report_stops_its_child_run_first():
  """The child stands in for a training run: on SIGTERM it checkpoints, then exits."""
  child = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('checkpointed', flush=True), sys.exit(0)))\n"
    "print('training', flush=True)\n"
    "time.sleep(60)\n"
  )
  report = (
    "import sys\n"
    "from tools import measure\n"
    "try:\n"
    f"  measure.run_child([sys.executable, '-c', {child!r}])\n"
    "except measure.Stopped:\n"
    "  print('stopped after its child', flush=True)\n"
  )
  process = subprocess.Popen(
    [sys.executable, "-c", report], cwd=ROOT, stdout=subprocess.PIPE, text=True
  )
  try:
    assert process.stdout.readline() == "training\n"
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
  finally:
    process.kill()
  assert output == "checkpointed\nstopped after its child\n" and process.returncode == 0


def test_a_run_preempted_by_someone_else_is_not_recorded_as_finished(tmp_path, monkeypatch):
  """A run that a cluster preempts exits 0, as a finished one does; only the log tells."""
  log = tmp_path / "metrics.jsonl"
  ends = {
    "preempted": {"step": 75, "eval_accuracy": 0.7},
    "finished": {"step": 200, "train_sec": 9},
  }
  for end, finished in (("preempted", False), ("finished", True)):
    log.write_text(json.dumps({"step": 1, "loss": 2.3}) + "\n" + json.dumps(ends[end]) + "\n")
    monkeypatch.setattr(measure, "run_child", lambda *a, **k: 0)
    assert measure._train(["configs/cifar_speedrun.py"], tmp_path, budget_end=0) is finished


def test_a_run_that_fails_stops_the_report_with_an_error(tmp_path, monkeypatch):
  """A bad data folder, say: the run has printed its own error line; a rerun would fail too."""
  for code, how in ((EXIT_USER_ERROR, "failed (exit code 2)"), (-9, "was killed by signal 9")):
    monkeypatch.setattr(measure, "run_child", lambda *a, code=code, **k: code)
    with pytest.raises(UserError, match=re.escape(f"the training run {how}; what it printed")):
      measure._train(["configs/cifar_vgg.py:smoke"], tmp_path, budget_end=0)


@pytest.mark.parametrize("budget", ["0", "-5"])
def test_a_budget_of_no_time_is_an_error(budget, monkeypatch, capsys, tmp_path):
  argv = ["report", f"--budget={budget}", f"--results={tmp_path}", f"--workdir={tmp_path}"]
  monkeypatch.setattr(sys, "argv", argv)
  assert report.main() == EXIT_USER_ERROR
  error = capsys.readouterr().err
  assert error == f"error: --budget={budget}: give the seconds a part may take, above 0\n"
  assert not any(tmp_path.iterdir())


def test_a_measurement_name_not_in_the_plan_lists_the_part_s_names(monkeypatch, capsys, tmp_path):
  argv = ["report", "--only=main:bogus", "--scale=tiny", f"--workdir={tmp_path}"]
  monkeypatch.setattr(sys, "argv", argv)
  assert report.main() == EXIT_USER_ERROR
  error = capsys.readouterr().err
  assert error.endswith(
    "names no measurement of the tiny plan; main's measurements: main:vgg_smoke\n"
  )


def test_a_tiny_report_records_beside_its_runs_not_in_the_readme_s_results(
  monkeypatch, capsys, tmp_path
):
  monkeypatch.setattr(
    sys, "argv", ["report", "--scale=tiny", "--only=main", f"--workdir={tmp_path}"]
  )  # no --data: nothing trains
  assert report.main() == 0
  output = capsys.readouterr().out
  assert f"into {tmp_path / 'results'}/" in output and "rendered the tables" not in output


def test_a_damaged_data_archive_is_an_error_and_leaves_nothing_extracted(tmp_path, monkeypatch):
  monkeypatch.setattr("research.data.CACHE", tmp_path / "cache")
  broken = tmp_path / "cifar10-jpeg.tar.gz"
  broken.write_bytes(
    subprocess.run(
      ["tar", "-cz", "-C", str(ROOT / "tests" / "data"), "."], capture_output=True, check=True
    ).stdout[:3000]
  )
  with pytest.raises(UserError, match=r"cannot extract --data=.*; give an intact \.tar\.gz"):
    report.image_folder(str(broken))
  assert not (tmp_path / "cache" / "report" / "cifar10-jpeg").exists()


def test_a_readme_without_its_table_markers_is_an_error_line():
  with pytest.raises(UserError, match="<!-- results --> and <!-- /results --> that hold a table"):
    results.replace_between("# README\n\nno table here\n", "results", "| a |")


def test_a_record_names_the_version_that_imports_where_a_package_is_installed_twice(
  tmp_path, monkeypatch
):
  # Wheels carried onto PYTHONPATH over a site's own copy: the first on sys.path imports.
  for folder, version in (("carried", "9.9.9"), ("site", "0.0.1")):
    info = tmp_path / folder / f"optax-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: optax\nVersion: {version}\n")
  monkeypatch.syspath_prepend(str(tmp_path / "site"))
  monkeypatch.syspath_prepend(str(tmp_path / "carried"))
  assert measure._versions()["optax"] == "9.9.9"
