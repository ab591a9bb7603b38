"""Bad input: one `error:` line, non-zero exit, nothing in the workdir overwritten."""

import errno
import os
import shutil
import subprocess
import sys

import pytest


def _run(args, tmp_path, wrapper=(), **env):
  """research.main with `args`, started through `wrapper` (a command that execs the rest)."""
  result = subprocess.run(
    [*wrapper, sys.executable, "-m", "research.main", *args],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, **env},
  )
  return result


@pytest.fixture
def run_here(monkeypatch, capsys):
  """research.main with `args` in this process, as `_run` gives its result. For bad input
  stopped before anything runs a child process proves nothing more: the command line's own
  exit code and output are checked by the tests that start one (`_run`)."""
  from research import host_memory, main

  # The worker's malloc and garbage collector stay as the suite has them.
  monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: False)
  monkeypatch.setattr(main, "_freeze_start_up_objects", lambda: None)

  def run(args, **env):
    for name, value in env.items():
      monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["research.main", *args])
    code = main.main()
    output = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, output.out, output.err)

  return run


def _single_error_line(result) -> str:
  lines = [line for line in result.stderr.splitlines() if "Warning" not in line and line.strip()]
  assert result.returncode != 0
  assert lines and lines[-1].startswith("error: "), result.stderr
  assert "Traceback" not in result.stderr
  return lines[-1]


SMOKE = "configs/cifar_vgg.py:smoke"


@pytest.fixture
def workdir(tmp_path):
  """An existing run directory whose files must survive a bad command."""
  path = tmp_path / "run"
  path.mkdir()
  (path / "metrics.jsonl").write_text('{"step": 1}\n')
  return path


def _untouched(workdir):
  return sorted(p.name for p in workdir.iterdir()) == ["metrics.jsonl"]


def test_unknown_config_field_suggests_near_names(run_here, workdir):
  args = ["--config", SMOKE, f"--workdir={workdir}", "--config.batchsize=64"]
  line = _single_error_line(run_here(args))
  assert "batchsize" in line and "batch_size" in line
  assert _untouched(workdir)


def test_batch_size_not_divisible_by_devices(run_here, workdir):
  args = ["--config", SMOKE, f"--workdir={workdir}", "--config.batch_size=100"]
  line = _single_error_line(run_here(args))
  assert "batch_size=100 is not divisible by the 8 devices" in line
  assert _untouched(workdir)


@pytest.mark.end_to_end
def test_config_file_not_found(tmp_path):
  line = _single_error_line(_run(["--config", "configs/nope.py"], tmp_path))
  assert "configs/nope.py not found" in line and "configs/cifar_vgg.py" in line
  assert "configs/common.py" not in line  # the configs' shared helpers, not a config


@pytest.mark.end_to_end
@pytest.mark.parametrize(
  "body, expected",
  [
    ("def get_config(arg=None):\n  return dict(\n", ":2: SyntaxError: '(' was never closed"),
    ("import nowhere_to_be_found\n", ":1: ModuleNotFoundError: No module named"),
    ("def get_config(arg=None):\n  return 1 / 0\n", ":2: ZeroDivisionError: division by zero"),
  ],
)
def test_a_config_file_that_does_not_run_is_one_line_naming_its_line(
  run_here, tmp_path, body, expected
):
  config = tmp_path / "broken.py"
  config.write_text(body)
  line = _single_error_line(run_here(["--config", str(config)]))
  assert line.startswith(f"error: {config}{expected}"), line


def test_bad_value_type(run_here):
  line = _single_error_line(run_here(["--config", SMOKE, "--config.batch_size=lots"]))
  assert "--config.batch_size: cannot parse 'lots' as an int" in line


def test_dataset_not_found_offline_without_fallback(run_here, tmp_path, workdir):
  args = [
    "--config",
    SMOKE,
    f"--workdir={workdir}",
    "--config.dataset=cifar10",
    "--config.data_fallback=False",
  ]
  env = dict(
    RESEARCH_DATA_CACHE=str(tmp_path / "cache"),
    RESEARCH_CIFAR10_URL="file:///nonexistent/cifar-10-python.tar.gz",
    HOME=str(tmp_path),
  )
  line = _single_error_line(run_here(args, **env))
  assert "CIFAR-10 not found offline" in line and "--config.data_dir" in line
  assert _untouched(workdir)


def test_corrupt_archive(run_here, tmp_path, workdir):
  garbage = tmp_path / "cifar-10-python.tar.gz"
  garbage.write_bytes(b"\x1f\x8b" + b"junk" * 1000)
  args = ["--config", SMOKE, f"--workdir={workdir}", "--config.dataset=cifar10"]
  line = _single_error_line(run_here([*args, f"--config.data_dir={garbage}"]))
  assert "corrupt or truncated" in line
  assert _untouched(workdir)


def test_different_experiment_in_existing_workdir_is_refused(run_here, workdir):
  (workdir / "config.json").write_text('{"batch_size": 8, "model": {"name": "vgg"}}')
  line = _single_error_line(run_here(["--config", SMOKE, f"--workdir={workdir}"]))
  assert "different config" in line and "--allow_config_change" in line
  (workdir / "config.json").write_text('{"experiment": "train", "model": {"name": "vgg"}}')
  conv2d = ["--config", "configs/conv2d_scaling.py:smoke", f"--workdir={workdir}"]
  line = _single_error_line(run_here([*conv2d, "--allow_config_change"]))
  assert line.endswith("holds a 'train' experiment, not 'conv2d_scaling'; use a new --workdir")
  assert sorted(p.name for p in workdir.iterdir()) == ["config.json", "metrics.jsonl"]
  assert "conv2d" not in (workdir / "config.json").read_text()


@pytest.mark.skipif(not os.access("/proc", os.W_OK), reason="/proc is not writable: not root")
def test_a_workdir_that_cannot_be_made_is_one_error_line(run_here):
  """/proc passes the permission check (for root) but refuses new directories."""
  line = _single_error_line(run_here(["--config", SMOKE, "--workdir=/proc/research-run"]))
  assert line.startswith("error: cannot create --workdir=/proc/research-run (")


# A filesystem of our own (tmpfs) mounted in a user and mount namespace of the command's own.
NAMESPACES = pytest.mark.skipif(
  shutil.which("unshare") is None
  or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0,
  reason="needs user and mount namespaces (unshare -rm) to mount a filesystem",
)


def _on_tmpfs(mount_point, options: str) -> list[str]:
  """A command that mounts a tmpfs (mount `options`) on `mount_point`, then execs the rest."""
  script = f'mount -t tmpfs -o {options} none "{mount_point}" && exec "$@"'
  return ["unshare", "-rm", "sh", "-c", script, "sh"]


def _run_on_tmpfs(mount_point, options: str, *args):
  return _run(["--config", SMOKE, *args], mount_point, _on_tmpfs(mount_point, options))


@pytest.mark.end_to_end
@NAMESPACES
def test_a_full_disk_ends_the_run_with_one_error_line(tmp_path):
  """200 kB fill up with the run's first files, before its first checkpoint."""
  result = _run_on_tmpfs(tmp_path, "size=200k", f"--workdir={tmp_path / 'run'}")
  assert "a disk this run writes to is full (No space left" in _single_error_line(result)


@pytest.mark.end_to_end
@NAMESPACES
@pytest.mark.parametrize("inside", ["", "new/run"])
def test_a_workdir_on_a_read_only_filesystem_is_an_error_before_the_data_is_loaded(
  tmp_path, inside
):
  readonly = tmp_path / "readonly"
  readonly.mkdir()
  workdir = readonly / inside
  result = _run_on_tmpfs(readonly, "ro", f"--workdir={workdir}")
  line = _single_error_line(result)
  assert f"--workdir={workdir.absolute()}".rstrip("/") in line and "is not writable" in line
  assert "decoding" not in result.stdout + result.stderr and "workdir:" not in result.stdout


# Writes a checkpoint of 2 MB into a 1 MB filesystem: through Checkpoints.save, then through
# orbax alone, as when something else takes the space while the background write is under way.
CHECKPOINT_ON_A_FULL_DISK = """
import sys
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from research import checkpoint

ckpts = checkpoint.Checkpoints(sys.argv[1], ml_collections.ConfigDict(
  {"checkpoint_every_steps": 1, "keep_checkpoints": 2}))
state = {"w": np.random.default_rng(0).normal(size=500_000).astype(np.float32)}
try:
  ckpts.save(1, state)
except OSError as e:
  print("checked:", e.errno, e.strerror, sorted(ckpts.directory.iterdir()))
ckpts.manager.save(2, args=ocp.args.StandardSave(state))
try:
  ckpts.close()
except OSError as e:
  print("written:", e.errno, e.strerror)
"""


@pytest.mark.end_to_end
@NAMESPACES
def test_a_checkpoint_that_does_not_fit_on_the_disk_is_a_disk_full_error(tmp_path):
  command = [sys.executable, "-c", CHECKPOINT_ON_A_FULL_DISK, str(tmp_path / "run")]
  result = subprocess.run(
    [*_on_tmpfs(tmp_path, "size=1m"), *command],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  checked, written = result.stdout.splitlines()
  assert checked == (
    f"checked: {errno.ENOSPC} No space left on device: the checkpoint at step 1 takes about "
    f"2.0 MB, {tmp_path}/run/checkpoints has 1.0 MB free []"
  )
  assert written == f"written: {errno.ENOSPC} No space left on device: writing a checkpoint"
