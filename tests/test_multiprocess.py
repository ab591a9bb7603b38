"""Two processes × 4 CPU devices (jax.distributed, gloo) train like one process."""

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from research import checkpoint, environment, main, models, optim, peers
from research.errors import UserError
from research.steps import AXIS, create_train_state
from research.train import train_and_evaluate
from tests import float64

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

SMOKE = "configs/cifar_vgg.py:smoke"
SLICE = Path(__file__).parent / "data" / "cifar10_slice"  # 16 train + 8 test JPEGs per class
STEPS = 2  # the resumed pair's steps
# Every run here: a log record (and an agreement on stopping) every 2 steps, and no periodic
# checkpoints, only the stop's.
SETTINGS = {"log_every_steps": 2, "checkpoint_every_steps": 0}
# research.main with every process's compiled programs written to the suite's compilation cache.
# JAX writes from process 0 only (against contended writes to a shared filesystem), and on CPU a
# process's cache key holds its own topology: without this, process 1 of every pair started here
# compiles all its programs again. Written by one process per key, on this machine's disk.
MAIN = """
import sys
from jax._src import compilation_cache, compiler, distributed
write = compiler._cache_write
def cache_write(key, seconds, name, backend, executable):
  if distributed.global_state.process_id == 0:
    return write(key, seconds, name, backend, executable)
  compilation_cache.put_executable_and_time(key, name, executable, backend, int(seconds))
compiler._cache_write = cache_write
from research import main
sys.exit(main.main())
"""


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--coordinator_address=127.0.0.1", "--process_id=0"], "'127.0.0.1' .* is not HOST:PORT"),
    (["--coordinator_address=127.0.0.1:99999", "--process_id=0"], "is not HOST:PORT"),
    (["--coordinator_address=127.0.0.1:1²", "--process_id=0"], "is not HOST:PORT"),
    (["--coordinator_address=::1", "--process_id=0"], "is not HOST:PORT"),
    (["--coordinator_address=:1234", "--process_id=0"], "is not HOST:PORT"),
    (["--coordinator_address=127.0.0.1:1234", "--process_id=2"], "own id from 0 to"),
    (["--coordinator_address=127.0.0.1:1234", "--process_id=-1"], "own id from 0 to"),
    (["--process_id=0"], "need --coordinator_address=HOST:PORT, --num_processes=N and"),
  ],
)
def test_bad_distributed_flags_are_user_errors_before_jax_distributed_starts(flags, message):
  args, _ = main.parse_args(["--config", SMOKE, "--num_processes=2", *flags])
  with pytest.raises(UserError, match=message):
    main.start_distributed(args)


@pytest.mark.parametrize("flags", [["--process_id=1"], ["--num_processes=0"]])
def test_a_distributed_flag_alone_is_an_error_not_a_single_process_run(flags):
  args, _ = main.parse_args(["--config", SMOKE, *flags])
  with pytest.raises(UserError, match="need --coordinator_address=HOST:PORT, --num_processes"):
    main.start_distributed(args)


def test_distributed_settings_from_the_environment_are_checked_as_flags(monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "[::1]:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "5")
  args, _ = main.parse_args(["--config", SMOKE])
  with pytest.raises(UserError, match=r"process id 5 of 2 .*JAX_PROCESS_ID and JAX_NUM_PROC"):
    main.start_distributed(args)
  monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
  with pytest.raises(UserError, match="JAX_NUM_PROCESSES='two' is not a whole number"):
    main.parse_args(["--config", SMOKE])


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _config(steps: int):
  """The config the pair of the float64 test runs with."""
  config = float64.config(SMOKE)
  config.update(num_train_steps=steps, **SETTINGS)
  return config


def _params(workdir, config, step: int):
  """The parameters of the workdir's latest checkpoint, which is of `step`."""
  model = models.create(config.model, AXIS)
  tx = optim.create_optimizer(config, 16, config.num_train_steps)
  template = create_train_state(jax.random.key(0), False, model, (32, 32, 3), tx)
  ckpts = checkpoint.Checkpoints(workdir, config)
  state = ckpts.restore_latest(template)
  ckpts.close()
  assert int(state.step) == step
  return state.params


def _start_two(workdir, *overrides, second=()):
  """Two processes of 4 CPU devices each, joined through jax.distributed (gloo); `second`:
  arguments of process 1 only. Their output goes to files beside `workdir`: a pipe nobody
  reads until the end would stop a process that fills it."""
  port = _free_port()
  env = environment.for_devices(4, "cpu")
  command = _command(
    workdir, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", *overrides
  )
  processes = []
  for i in range(2):
    with open(_log(workdir, i), "w") as log:
      processes.append(
        subprocess.Popen(
          [*command, f"--process_id={i}", *(second if i else ())], env=env, stdout=log, stderr=log
        )
      )
  return processes


def _command(workdir, *overrides) -> list[str]:
  """research.main (MAIN) training SMOKE in `workdir`."""
  return [sys.executable, "-c", MAIN, "--config", SMOKE, f"--workdir={workdir}", *overrides]


def _log(workdir, process_id: int):
  return workdir.with_name(f"{workdir.name}-{process_id}.log")


def _reap(processes) -> None:
  """Kills and waits for the processes: none is left training after the test."""
  for p in processes:
    p.kill()
    p.wait()


def _finish_two(processes, workdir, returncode=0) -> list[str]:
  """Each process's output, once both have exited with `returncode` (killed after 300 s)."""
  try:
    for p in processes:
      p.wait(timeout=300)
  finally:
    _reap(processes)  # even on timeout
  outputs = [_log(workdir, i).read_text() for i in range(2)]
  for p, output in zip(processes, outputs, strict=True):
    assert p.returncode == returncode, output[-3000:]
  return outputs


def _train_records(workdir) -> list[dict]:
  path = workdir / "metrics.jsonl"
  lines = path.read_text().splitlines() if path.exists() else []
  return [r for r in map(json.loads, lines) if "loss" in r]


def _logged_steps(workdir) -> list[int]:
  return [r["step"] for r in _train_records(workdir)]


def test_sigterm_to_one_process_stops_both_after_the_same_step_with_one_checkpoint(tmp_path):
  """SIGTERM reaches one of two processes: both stop after the same step with one checkpoint,
  and each says how to resume itself. (Which step depends on when the signal lands: the pair's
  steps are compared with one process's from a state the test fixes, below.)"""
  two = tmp_path / "two"
  args = [f"--config.{field}={value}" for field, value in SETTINGS.items()]
  processes = _start_two(two, "--config.num_train_steps=2000", *args)
  deadline = time.monotonic() + 240
  try:
    while max(_logged_steps(two), default=0) < 3:  # process 0 logs; both are training
      assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
      time.sleep(0.05)
  except BaseException:  # their output is in two-*.log
    _reap(processes)
    raise
  processes[1].send_signal(signal.SIGTERM)  # the cluster preempts one host only
  outputs = _finish_two(processes, two)
  stopped = [int(re.search(r"preempted at step (\d+)", out)[1]) for out in outputs]
  assert stopped[0] == stopped[1] and stopped[0] % 2 == 0, stopped
  assert sorted(p.name for p in (two / "checkpoints").iterdir()) == [str(stopped[0])]
  assert "| 8 devices" in outputs[0] and "| 8 devices" not in outputs[1]  # process 0 prints
  for i, output in enumerate(outputs):  # each process's resume command is its own
    assert f"--num_processes=2 --process_id={i}\n" in output, output[-2000:]


# Two processes × 4 devices against one process × 8, both in float64 (tests/float64.py) from the
# same initial state, each stopped at step 2's checkpoint and resumed to step 4: the losses of
# steps 2 and 4 and the update of steps 3-4 (parameters at 4 − at 2, one process's): 9.6e-15
# apart at most, relative, on the default kernels, 9.5e-15 on the other set. The error it is here
# for: processes that take another's examples; both processes reading process 0's part of the
# global batch (inputs.py's process_index() · n_local as 0) moved it by 2.2e-2.
def test_two_processes_resumed_from_their_checkpoint_step_as_one_process(tmp_path, x64):
  two, one = tmp_path / "two", tmp_path / "one"
  fields = {**SETTINGS, **float64.FIELDS}
  args = [f"--config.{field}={value}" for field, value in fields.items()]
  _finish_two(_start_two(two, "--config.num_train_steps=2", *args), two)  # its checkpoint: 2
  outputs = _finish_two(_start_two(two, f"--config.num_train_steps={2 + STEPS}", *args), two)
  assert "resumed from the checkpoint at step 2" in outputs[0]
  # Only process 0 writes the log: each step is recorded once.
  steps = _logged_steps(two)
  assert steps == sorted(set(steps)) and steps[-1] == 2 + STEPS, steps

  # One process on the suite's 8 devices, the same two launches here.
  train_and_evaluate(_config(2), str(one))
  start = _params(one, _config(2), 2)
  train_and_evaluate(_config(2 + STEPS), str(one))
  # The steps every run logs (each leg's last); a log by time may add others
  losses = lambda workdir: {r["step"]: r["loss"] for r in _train_records(workdir)}
  pair, single = ([losses(w)[step] for step in (2, 2 + STEPS)] for w in (two, one))
  float64.assert_close(pair, single, what="losses")
  config = _config(2 + STEPS)
  end = [_params(workdir, config, 2 + STEPS) for workdir in (two, one)]
  float64.assert_close(*end, start=start, what="update")


def _saved(workdir) -> list[int]:
  """The steps of the complete checkpoints (orbax writes under a temporary name first)."""
  return [int(p.name) for p in workdir.glob("checkpoints/*") if p.name.isdigit()]


LOST_AFTER = 5  # lost_process_after_sec in the test below
# What the survivor may take beyond LOST_AFTER on a loaded 2-core machine: the watch asks the
# store every second and judges every half second; the rest is the exit itself.
LOST_SLACK = 20


@pytest.mark.parametrize("how, lost", [("SIGKILL", 1), ("SIGSTOP", 1), ("SIGKILL", 0)])
def test_a_lost_process_stops_the_other_soon_with_an_error_and_the_rerun_resumes(
  tmp_path, how, lost
):
  """SIGKILL closes the lost process's connections (gloo fails at once); SIGSTOP leaves them
  open and silent, as a host that vanished from the network does (the watch notices). Process
  0 lost: JAX aborts the other at once, and its guardian says what to do."""
  two, survivor = tmp_path / "two", 1 - lost
  args = [
    "--config.num_train_steps=100000", "--config.log_every_steps=2",
    "--config.checkpoint_every_epochs=0", "--config.checkpoint_every_minutes=0.02",
    f"--config.lost_process_after_sec={LOST_AFTER}",
  ]  # fmt: skip
  processes = _start_two(two, *args)
  deadline = time.monotonic() + 480  # minutes on a loaded 2-core machine
  try:
    while not _saved(two):  # a checkpoint by time: both train, past their compiles
      assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
      time.sleep(0.05)
  except BaseException:
    _reap(processes)
    raise
  processes[lost].send_signal(getattr(signal, how))
  lost_at = time.monotonic()
  try:
    processes[survivor].wait(timeout=LOST_AFTER + LOST_SLACK)
  finally:
    _reap(processes)
  took = time.monotonic() - lost_at
  end = r"\n(error: .*)\n  (\./launch\.sh .*)\n?$"  # the output's last lines
  while not (error := re.search(end, output := _log(two, survivor).read_text())):
    assert time.monotonic() < lost_at + 120, output[-3000:]  # a guardian speaks after its end
    time.sleep(0.1)
  if lost == 0:  # JAX's abort, then the guardian's line
    assert processes[survivor].returncode == -signal.SIGABRT, output[-3000:]
    assert error[1].startswith("error: this process of a multi-process run ended abruptly")
  else:
    assert processes[survivor].returncode == peers.EXIT_LOST, output[-3000:]
    assert error[1].startswith("error: a process of this multi-process run was lost (")
    # A SIGKILL is seen by whichever comes first: a collective's broken connection or the watch.
    silent = "process 1 has given no sign of life"
    assert silent in error[1] or how == "SIGKILL" and "Connection reset" in error[1], error[1]
  assert took < LOST_AFTER + LOST_SLACK
  assert error[2].startswith(f"./launch.sh {SMOKE} --workdir={two}")
  assert error[2].endswith(f"--num_processes=2 --process_id={survivor}")
  if (how, lost) != ("SIGKILL", 1):
    return
  newest = max(_saved(two))  # a write the loss cut short is not among them
  end = [f"--config.num_train_steps={newest + 2}"]
  outputs = _finish_two(_start_two(two, *args, *end), two)
  assert f"resumed from the checkpoint at step {newest}" in outputs[0]
  assert "error:" not in outputs[0] + outputs[1]  # the guardians of a run that ends stay quiet


def test_processes_given_different_configs_stop_before_anything_is_written(tmp_path):
  workdir = tmp_path / "run"
  outputs = _finish_two(_start_two(workdir, second=["--config.batch_size=32"]), workdir, 2)
  for output in outputs:
    assert "error: the processes of this run were given different configs" in output, output
  assert not workdir.exists()


def test_processes_reading_different_data_stop_before_anything_is_written(tmp_path, monkeypatch):
  """data_dir may differ between hosts (a copy on each); what it holds may not."""
  monkeypatch.setenv("RESEARCH_DATA_CACHE", str(tmp_path / "cache"))
  ours, theirs = tmp_path / "ours", tmp_path / "theirs"
  shutil.copytree(SLICE, ours)
  shutil.copytree(SLICE, theirs)
  next(theirs.glob("train/cat/*.jpg")).unlink()  # one image fewer on the second host
  folder = ["--config.dataset=folder", f"--config.data_dir={ours}"]
  workdir = tmp_path / "run"
  processes = _start_two(workdir, *folder, second=[f"--config.data_dir={theirs}"])
  for output in _finish_two(processes, workdir, 2):
    assert "error: the processes of this run read different data" in output, output
  assert not workdir.exists()
