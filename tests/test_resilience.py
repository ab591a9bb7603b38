"""Runs that survive: exact resume after SIGKILL, SIGTERM checkpoints, fewer devices, bad
checkpoints, NaN stops, TensorBoard output."""

import json
import random
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from research import checkpoint, configuration, environment
from research.errors import UserError
from research.train import train_and_evaluate

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

SMOKE = "configs/cifar_vgg.py:smoke"
# Short, with a log record every step, a checkpoint every 2 steps and an EMA of the weights,
# which the eval uses (so every resume here checks that the EMA resumed exactly too).
SETTINGS = {
  "num_train_steps": 14,
  "log_every_steps": 1,
  "checkpoint_every_steps": 2,
  "ema_decay": 0.9,
}
ARGS = [f"--config.{field}={value}" for field, value in SETTINGS.items()]


def _smoke_config(**overrides):
  config = configuration.load(SMOKE)
  config.update(overrides)
  return config


def _train_here(workdir):
  """A run of SETTINGS in this process (8 devices, the suite's flags, as `_start` gives a
  child): for runs that need no signal of their own."""
  return train_and_evaluate(_smoke_config(**SETTINGS), str(workdir))


def _start(workdir, devices=8, extra=(), program=("-m", "research.main")):
  env = environment.for_devices(devices, "cpu")  # the suite's XLA flags, this device count
  return subprocess.Popen(
    [sys.executable, *program, "--config", SMOKE, f"--workdir={workdir}", *ARGS, *extra],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    env=env,
  )


# A run of ARGS that sends itself a signal (argv[1]) at a point of its own (argv[2]): "preview"
# (after the banner, before the compile), "checkpoint-N" (once step N's checkpoint is started,
# with a second for the signal to be taken: the run stops after step N + 1, or for N the last
# step, during the final eval) or a step number (once that step is logged). Sent from the test
# on reading the run's output instead, the signal could land later than meant while the suite
# keeps the test's process busy.
STOPS_ITSELF = """
import os, sys, time
from research import checkpoint, main, progress, train
stop, at = int(sys.argv.pop(1)), sys.argv.pop(1)
if at == "preview":
  preview = train.augmented_preview
  def signalled_preview(*args):
    os.kill(os.getpid(), stop)
    return preview(*args)
  train.augmented_preview = signalled_preview
elif at.startswith("checkpoint-"):
  save = checkpoint.Checkpoints.save
  def signalled_save(self, step, state):
    save(self, step, state)
    if step == int(at.removeprefix("checkpoint-")):
      os.kill(os.getpid(), stop)
      time.sleep(1)
  checkpoint.Checkpoints.save = signalled_save
else:
  write = progress.Progress.write
  def signalled_write(self, step, *args):
    write(self, step, *args)
    if step == int(at):
      os.kill(os.getpid(), stop)
  progress.Progress.write = signalled_write
sys.exit(main.main())
"""


def _start_stopping_itself(workdir, stop, at, extra=()):
  return _start(workdir, extra=extra, program=("-c", STOPS_ITSELF, str(int(stop)), str(at)))


def _finish(process, timeout=300, returncode=0):
  try:
    output, _ = process.communicate(timeout=timeout)
  finally:
    process.kill()
  assert process.returncode == returncode, output
  return output


def _records(workdir):
  lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


def _final(workdir):
  records = _records(workdir)
  last_train = [r for r in records if "loss" in r][-1]
  return last_train["step"], last_train["param_norm"], records[-1]["eval_loss"]


def _wait_until(done, process, what, timeout=300):
  """Blocks until `done()` (bounded; fails if the run ends first without it)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    ended = process.poll() is not None
    if done():
      return
    assert not ended, f"the run ended before {what}"
    time.sleep(0.05)
  raise TimeoutError(f"no {what} in {timeout} s")


def _wait_for_step(workdir, step, process):
  """Until metrics.jsonl records `step`."""
  path = Path(workdir) / "metrics.jsonl"
  logged = lambda: path.exists() and any(r.get("step", 0) >= step for r in _records(workdir))
  _wait_until(logged, process, f"step {step}")


def _wait_for_a_checkpoint(workdir, process):
  """Until a checkpoint is complete: orbax renames its temporary folder to the step."""
  complete = lambda: any(p.name.isdigit() for p in (Path(workdir) / "checkpoints").glob("*"))
  _wait_until(complete, process, "a complete checkpoint")


@pytest.fixture(scope="module")
def uninterrupted_workdir(tmp_path_factory):
  """The workdir of one run of ARGS on 8 devices, never interrupted (read-only: copy it)."""
  workdir = tmp_path_factory.mktemp("uninterrupted")
  _train_here(workdir)
  return workdir


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_workdir):
  return _final(uninterrupted_workdir)


def test_resume_after_sigkill_is_exact(uninterrupted, uninterrupted_workdir, tmp_path, capsys):
  # The run kills itself once step `kill_at` is logged: by then the checkpoint of step 2 is
  # complete (each save waits for the write before it), and steps are left to take.
  kill_at = random.Random().randint(5, 12)
  process = _start_stopping_itself(tmp_path, signal.SIGKILL, kill_at)
  _finish(process, returncode=-signal.SIGKILL)  # it died of the kill, not finished first
  capsys.readouterr()
  _train_here(tmp_path)
  output = capsys.readouterr().out
  resumed = int(re.search(r"resumed from the checkpoint at step (\d+)", output)[1])
  assert resumed < SETTINGS["num_train_steps"], output  # it had steps left to take
  final = _final(tmp_path)
  assert final == uninterrupted, f"killed at step {kill_at}"  # bit-for-bit, the EMA's eval too
  assert _records(tmp_path)[-1]["eval_weights"] == "ema"
  # metrics.jsonl reads as the one run: the steps logged again after the resume are the only
  # records of theirs (the first launch's moved aside), each as the uninterrupted run's
  names = ("step", "loss", "accuracy", "param_norm", "grad_norm", "eval_loss")
  numbers = lambda workdir: [tuple(r.get(n) for n in names) for r in _records(workdir)]
  assert numbers(tmp_path) == numbers(uninterrupted_workdir), f"killed at step {kill_at}"
  superseded = (tmp_path / "metrics_superseded.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in superseded] == list(range(resumed + 1, kill_at + 1))


@pytest.mark.parametrize(
  "stop, what, returncode",
  [(signal.SIGTERM, "preempted", 0), (signal.SIGINT, "interrupted (Ctrl-C)", 130)],
)
def test_sigterm_or_ctrl_c_writes_a_checkpoint_and_the_rerun_ends_as_uninterrupted(
  uninterrupted, tmp_path, stop, what, returncode
):
  # Logged every 4 steps, stopped after step 7: its steps since the record at 4 are logged too.
  every_4 = ("--config.log_every_steps=4",)
  stopping = _start_stopping_itself(tmp_path, stop, "checkpoint-6", every_4)
  output = _finish(stopping, returncode=returncode)
  assert f"{what} at step 7;" in output
  assert (tmp_path / "checkpoints" / "7").is_dir()
  assert [r["step"] for r in _records(tmp_path) if "loss" in r][-2:] == [4, 7]
  assert f"./launch.sh {SMOKE} --workdir={tmp_path}" in output
  # The rerun gets the same signal once its last step's checkpoint is started: the final eval
  # goes on and the run ends as one never stopped.
  output = _finish(_start_stopping_itself(tmp_path, stop, "checkpoint-14"))
  assert "resumed from the checkpoint at step 7" in output
  assert "the launch before this one ran on" not in output  # the same devices: no note
  assert "training is done and its checkpoint is being written; finishing the final eval" in output
  assert _final(tmp_path) == uninterrupted
  assert (tmp_path / "checkpoints" / "14").is_dir()


def test_ctrl_c_before_training_exits_130_and_saves_nothing(tmp_path):
  """Ctrl-C between the banner line and the first step (during the augmented batch's preview,
  after the compile). The exit skips the interpreter's teardown, which could crash under JAX's
  busy threads (SIGSEGV)."""
  output = _finish(_start_stopping_itself(tmp_path, signal.SIGINT, "preview"), returncode=130)
  assert " parameters | " in output  # the banner: training was being set up
  assert "\ninterrupted\n" in output and "\nstep 1," not in output, output
  assert not any((tmp_path / "checkpoints").glob("*"))


def test_a_second_ctrl_c_aborts_at_once(tmp_path):
  """The second SIGINT ends the process on the spot, whatever it is doing; what was on disk
  stays, as after SIGKILL (test_resume_after_sigkill_is_exact). The main thread here blocks
  SIGINT, as one inside a long XLA call cannot take it either: the signal lands on another
  thread, and the process still ends long before the main thread's sleep would."""
  script = (
    "import os, signal, time\n"
    "from research.preemption import Preemption\n"
    "with Preemption(every=1) as p:\n"
    "  os.kill(os.getpid(), signal.SIGINT)\n"
    "  deadline = time.monotonic() + 30\n"  # until the watcher thread has recorded it
    "  while p.signal is None and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "  print('stop after step 1:', p.stop_after(1), p.interrupted, flush=True)\n"
    "  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
    "  os.kill(os.getpid(), signal.SIGINT)\n"
    "  time.sleep(600)\n"
    "  print('still running')\n"
  )
  # Waiting out the sleep would raise TimeoutExpired.
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=Path.cwd()
  )
  assert result.returncode == 130, result.stderr
  assert result.stdout == "stop after step 1: True True\n"
  assert "Ctrl-C again to abort now" in result.stderr and "second Ctrl-C: aborting" in result.stderr


def test_a_run_started_with_sigint_ignored_keeps_ignoring_it_and_stops_on_sigterm():
  """A script's background job (bash without job control) starts with SIGINT ignored, so that
  the terminal's Ctrl-C leaves it running: the run keeps it ignored; SIGTERM still stops it."""
  script = (
    "import os, signal, time\n"
    "from research.preemption import Preemption\n"
    "with Preemption(every=1) as p:\n"
    "  os.kill(os.getpid(), signal.SIGINT)\n"
    "  os.kill(os.getpid(), signal.SIGTERM)\n"
    "  deadline = time.monotonic() + 30\n"  # until the watcher thread has recorded it
    "  while p.signal is None and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "  print(signal.Signals(p.signal).name, [signal.Signals(s).name for s in p.ignored])\n"
    "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)\n"
  )
  in_background = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} & wait"
  result = subprocess.run(
    ["bash", "-c", in_background], capture_output=True, text=True, timeout=120, cwd=Path.cwd()
  )
  assert result.returncode == 0, result.stderr
  assert result.stdout == "SIGTERM ['SIGINT']\nTrue\n"
  assert "Ctrl-C" not in result.stderr and "SIGTERM: finishing this step" in result.stderr


def test_resuming_with_fewer_steps_than_the_checkpoint_is_an_error(uninterrupted_workdir, tmp_path):
  shutil.copytree(uninterrupted_workdir, tmp_path, dirs_exist_ok=True)
  records = (tmp_path / "metrics.jsonl").read_text()
  config = _smoke_config(**{**SETTINGS, "num_train_steps": 10})
  with pytest.raises(UserError, match="checkpoint of step 14, past this run's 10 steps; resume"):
    train_and_evaluate(config, str(tmp_path))
  assert (tmp_path / "metrics.jsonl").read_text() == records  # no eval labelled step 10


def test_unreadable_latest_checkpoint_falls_back_to_the_previous(
  uninterrupted_workdir, tmp_path, capfd
):
  shutil.copytree(uninterrupted_workdir, tmp_path, dirs_exist_ok=True)  # checkpoints 10, 12, 14
  config = _smoke_config(**SETTINGS)
  for f in (tmp_path / "checkpoints" / "14").rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")
  messages = []
  ckpts = checkpoint.Checkpoints(tmp_path, config, echo=messages.append)
  template = _template_state(config)
  restored = ckpts.restore_latest(template)
  ckpts.close()
  assert int(restored.step) == 12
  assert "checkpoint at step 14 is unreadable" in messages[0]
  assert (tmp_path / "checkpoints_unreadable" / "14").is_dir()  # moved aside, not deleted
  time.sleep(1)  # tensorstore's late callbacks, if any, print within it
  printed = capfd.readouterr()
  assert "Traceback" not in printed.out + printed.err  # the warning line alone


def _corrupt(checkpoint_dir):
  for f in checkpoint_dir.rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")


def test_no_readable_checkpoint_left_is_one_error_line_never_a_fresh_start(
  uninterrupted_workdir, tmp_path
):
  """The only checkpoint unreadable: moved aside, then one error line saying where and how to
  start over; a rerun says the same, and the records stay as they were."""
  shutil.copytree(uninterrupted_workdir, tmp_path, dirs_exist_ok=True)  # checkpoints 10, 12, 14
  for step in (10, 12):
    shutil.rmtree(tmp_path / "checkpoints" / str(step))
  _corrupt(tmp_path / "checkpoints" / "14")
  records = (tmp_path / "metrics.jsonl").read_text()
  config = _smoke_config(**{**SETTINGS, "num_train_steps": 16})
  left = rf"no readable checkpoint is left in {tmp_path}/checkpoints: the unreadable ones are in "
  for _ in range(2):  # the launch that moves it aside, and the rerun
    with pytest.raises(UserError, match=left + rf".*to start over, delete {tmp_path} "):
      train_and_evaluate(config, str(tmp_path))
  assert (tmp_path / "checkpoints_unreadable" / "14").is_dir()
  assert (tmp_path / "metrics.jsonl").read_text() == records


def test_eval_passes_over_an_unreadable_newest_checkpoint_and_a_named_one_is_an_error(
  uninterrupted_workdir, tmp_path, capsys
):
  from research import trained

  shutil.copytree(uninterrupted_workdir, tmp_path, dirs_exist_ok=True)  # checkpoints 10, 12, 14
  _corrupt(tmp_path / "checkpoints" / "14")
  assert trained.evaluate(tmp_path)["step"] == 12
  out = capsys.readouterr()
  assert "warning: the checkpoint at step 14 in " in out.out and "reading the one before" in out.out
  assert "Traceback" not in out.out + out.err
  with pytest.raises(UserError, match=r"step 14 .* is unreadable \(readable: steps 10, 12\)"):
    trained.evaluate(tmp_path, step=14)
  assert (tmp_path / "checkpoints" / "14").is_dir()  # a reader moves nothing


def test_eval_of_a_workdir_it_cannot_write_in_prints_its_line_and_one_warning(
  uninterrupted_workdir, tmp_path, capsys
):
  from research import trained

  shutil.copytree(uninterrupted_workdir, tmp_path, dirs_exist_ok=True)
  (tmp_path / trained.EVALS).mkdir()  # an append there fails as on a read-only filesystem
  assert trained.main(["eval", str(tmp_path)]) == 0
  out = capsys.readouterr()
  assert "eval" in out.out and "Traceback" not in out.err
  assert f"warning: the record was not appended to {tmp_path / trained.EVALS}" in out.err


# A run of ARGS (argv as research.main's) that waits after logging step 2 until WORKDIR/go
# exists: the test starts a second launch while it holds the workdir.
PAUSES = """
import pathlib, sys, time
from research import main, progress
workdir = pathlib.Path(next(a for a in sys.argv if a.startswith("--workdir=")).partition("=")[2])
write = progress.Progress.write
def paused_write(self, step, *args):
  write(self, step, *args)
  while step == 2 and not (workdir / "go").exists():
    time.sleep(0.05)
progress.Progress.write = paused_write
sys.exit(main.main())
"""


def test_a_second_launch_into_a_workdir_in_use_is_one_error_line_and_the_first_runs_clean(
  tmp_path,
):
  from research import main

  first = _start(tmp_path, program=("-c", PAUSES))
  try:
    _wait_for_step(tmp_path, 2, first)
    holder = rf"\(host {re.escape(socket.gethostname())}, pid {first.pid}, since 20\d\d-"
    with pytest.raises(UserError, match=rf"{tmp_path} is in use by another launch .*{holder}"):
      main.run(["--config", SMOKE, f"--workdir={tmp_path}", *ARGS])
  finally:
    (tmp_path / "go").touch()
  _finish(first)
  assert [r["step"] for r in _records(tmp_path) if "loss" in r] == list(range(1, 15))
  assert len((tmp_path / "launches.jsonl").read_text().splitlines()) == 1


def test_a_checkpoint_that_does_not_fit_the_config_is_an_error_and_nothing_moves(
  uninterrupted_workdir, tmp_path
):
  shutil.copytree(uninterrupted_workdir, tmp_path, dirs_exist_ok=True)  # the last at step 14
  files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
  changes = {
    "optimizer state": lambda c: c.update(grad_clip_norm=1.0),
    "parameter shapes": lambda c: c.model.update(width=0.25),
    "the EMA of the weights": lambda c: c.update(ema_decay=0.0),
  }
  for what, change in changes.items():
    config = _smoke_config(num_train_steps=16, ema_decay=SETTINGS["ema_decay"])
    change(config)
    with pytest.raises(UserError, match="does not fit this config: .*new --workdir") as e:
      train_and_evaluate(config, str(tmp_path))
    assert "\n" not in str(e.value), what
  assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files
  assert not (tmp_path / "checkpoints_unreadable").exists()


def _template_state(config):
  from research import models, optim
  from research.steps import AXIS, create_train_state

  model = models.create(config.model, AXIS)
  tx = optim.create_optimizer(config, 16, 8)
  return create_train_state(jax.random.key(0), config.ema_decay > 0, model, (32, 32, 3), tx)


def test_divergence_stops_with_a_clear_error_and_keeps_good_checkpoints(tmp_path, nan_after_step):
  """The parameters turn NaN in step 3: step 4's checkpoint is not written, step 2's is kept
  and named."""
  nan_after_step(3)
  config = _smoke_config(log_every_steps=4, checkpoint_every_steps=2)
  with pytest.raises(
    UserError,
    match=r"NaN/inf by step 4 \(loss nan\); the last good checkpoint, of step 2, is kept in ",
  ):
    train_and_evaluate(config, str(tmp_path))
  ckpts = checkpoint.Checkpoints(tmp_path, config)
  assert ckpts.manager.all_steps() == [2]
  state = ckpts.restore_latest(_template_state(config))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))
  ckpts.close()


def test_a_stop_signal_never_saves_parameters_that_are_not_finite(tmp_path, monkeypatch):
  """The checkpoint a SIGTERM or Ctrl-C writes is checked as the periodic ones are: here the
  parameters the stop would save are NaN (as after a last update that overflowed)."""
  from research import preemption, steps, train

  monkeypatch.setattr(preemption.Preemption, "stop_after", lambda self, step: True)
  fetch = train.first_replica

  def nan(tree):  # the train state's parameters; the loop's metrics fetched as they are
    if not isinstance(tree, steps.TrainState):
      return tree
    return tree.replace(params=jax.tree.map(lambda p: p * np.nan, tree.params))

  monkeypatch.setattr(train, "first_replica", lambda tree: nan(fetch(tree)))
  with pytest.raises(UserError, match=r"NaN/inf by step 1; no checkpoint had been written"):
    train_and_evaluate(_smoke_config(), str(tmp_path))
  assert not any((tmp_path / "checkpoints").glob("*"))


def _events(workdir, run: str = ""):
  """Parses tensorboardX event files (TFRecord framing) back into Event protos: the run's, or
  those of its TensorBoard run `run` (a sweep's point: WORKDIR/tensorboard/LABEL)."""
  for path in (Path(workdir) / "tensorboard" / run).glob("events.out.tfevents.*"):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset : offset + 8])
      yield event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
      offset += 12 + length + 4


def test_tensorboard_has_scalars_and_the_augmented_batch_image(uninterrupted_workdir):
  tags = {v.tag: v for e in _events(uninterrupted_workdir) for v in e.summary.value}
  for tag in (
    "train/loss",
    "train/learning_rate",
    "train/examples_per_sec",
    "train/input_wait_fraction",
    "eval/accuracy",
  ):
    assert tag in tags, sorted(tags)
  image = tags["augmented_batch"].image
  assert image.width > 32 and image.height > 32 and image.encoded_image_string[:4] == b"\x89PNG"
  assert (uninterrupted_workdir / "augmented_batch.png").stat().st_size > 1000


def test_the_newest_checkpoint_kept_is_named_or_none_is(tmp_path):
  ckpts = checkpoint.Checkpoints(tmp_path, _smoke_config())
  assert ckpts.kept() == "no checkpoint had been written"
  for step in (2, 4):
    ckpts.save(step, {"w": np.full(4, step, np.float32)})
  ckpts.manager.wait_until_finished()
  assert ckpts.kept() == f"the last good checkpoint, of step 4, is kept in {tmp_path}/checkpoints"
  ckpts.close()


def test_checkpoints_come_by_time_too_and_the_clock_restarts_at_each(tmp_path, monkeypatch):
  now = [1000.0]
  monkeypatch.setattr(checkpoint.time, "monotonic", lambda: now[0])
  config = configuration.load(SMOKE)
  config.update(checkpoint_every_epochs=0.0, checkpoint_every_minutes=2.0)
  ckpts = checkpoint.Checkpoints(tmp_path, config)
  try:
    now[0] += 119
    assert not ckpts.due(5)
    now[0] += 1  # two minutes since the launch
    assert ckpts.due(6)
    ckpts.save(6, {"w": np.zeros(3, np.float32)})
    now[0] += 100
    assert not ckpts.due(7)  # 100 s since that checkpoint
    config.update(checkpoint_every_minutes=0.0)  # off: steps alone decide
    assert not checkpoint.Checkpoints(tmp_path / "off", config).due(7)
  finally:
    ckpts.close()
