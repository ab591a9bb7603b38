"""launch.sh on machines it does not set up itself: an installed Python (RESEARCH_PYTHON), a
venv prepared on a login node for a GPU node, and the imports each kind of run needs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

ROOT = Path(__file__).parent.parent
SMOKE = "configs/cifar_vgg.py:smoke"


def _hide(tmp_path, *modules) -> str:
  """A PYTHONPATH entry under which importing each of `modules` fails as if not installed."""
  shims = tmp_path / "hidden"
  for module in modules:
    (shims / module).mkdir(parents=True)
    (shims / module / "__init__.py").write_text(
      f'raise ModuleNotFoundError("No module named {module!r}", name={module!r})\n'
    )
  return str(shims)


def _launch(args, tmp_path, hidden=(), **env):
  environ = {**os.environ, "RESEARCH_PYTHON": sys.executable, **env}
  if hidden:
    environ["PYTHONPATH"] = _hide(tmp_path, *hidden)
  return subprocess.run(
    [str(ROOT / "launch.sh"), *args], capture_output=True, text=True, env=environ, timeout=300
  )


def test_a_missing_package_is_one_error_line_with_the_command_that_installs_it(tmp_path):
  result = _launch([SMOKE, f"--workdir={tmp_path / 'run'}"], tmp_path, hidden=["ml_collections"])
  assert result.returncode == 2
  assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
  assert f"{sys.executable} -m pip install 'ml-collections==" in result.stderr
  assert not (tmp_path / "run").exists()


def test_a_resident_run_needs_neither_grain_nor_tensorflow_datasets_and_a_streamed_one_says_so(
  tmp_path,
):
  hidden = ["grain", "tensorflow_datasets", "array_record"]
  run = [SMOKE, f"--workdir={tmp_path / 'run'}", "--config.num_train_steps=2"]
  result = _launch(run, tmp_path, hidden=hidden)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "eval at step 2" in result.stdout

  streamed = [
    SMOKE,
    f"--workdir={tmp_path / 'streamed'}",
    "--config.dataset=folder",
    f"--config.data_dir={ROOT / 'tests' / 'data' / 'cifar10_slice'}",
    "--config.data_placement=streamed",
    "--config.augment=inception_crop(32)",
    "--config.eval_preprocess=central_crop(32)",
  ]
  result = _launch(streamed, tmp_path / "again", hidden=hidden)
  assert result.returncode == 2 and "lacks grain; install with" in result.stderr, result.stderr


FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in Python VERSION: answers launch.sh's version probe (-c) and records its other calls;
# "-m venv DIR" makes DIR/bin/python a copy of this script.
if [[ $1 == -c ]]; then echo VERSION; exit 0; fi
echo "$*" >>"$FAKE_LOG"
if [[ $1 == -m && $2 == venv ]]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
"""


def _fake_python(path: Path, version: str = "3.13") -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(FAKE_PYTHON.replace("VERSION", version))
  path.chmod(0o755)
  return path


def _set_up(tmp_path, **env) -> subprocess.CompletedProcess:
  """`./launch.sh setup --cpu` on a PATH with no Python 3.12+ of its own (only the system's
  3.11), and a pyenv root of stand-ins (PYENV_ROOT, with versions/X.Y.Z/bin/python)."""
  environ = {
    **{k: v for k, v in os.environ.items() if k not in ("PYTHON", "RESEARCH_PYTHON")},
    "PATH": "/usr/bin:/bin",
    "PYENV_ROOT": str(tmp_path / "pyenv"),
    "RESEARCH_VENV": str(tmp_path / "venv"),
    "FAKE_LOG": str(tmp_path / "calls.log"),
    **env,
  }
  return subprocess.run(
    [str(ROOT / "launch.sh"), "setup", "--cpu"], capture_output=True, text=True, env=environ
  )


def test_the_venv_is_made_from_the_newest_python_3_12_or_later_found_under_pyenv(tmp_path):
  for version in ("3.11.7", "3.12.1", "3.13.0"):
    _fake_python(tmp_path / "pyenv" / "versions" / version / "bin" / "python", version[:4])
  result = _set_up(tmp_path)
  assert result.returncode == 0, result.stderr
  calls = (tmp_path / "calls.log").read_text().splitlines()
  assert calls[0] == f"-m venv {tmp_path / 'venv'}", calls
  # The venv's python is a copy of the one that made it.
  assert (tmp_path / "venv" / "bin" / "python").read_text().count("echo 3.13") == 1


def test_no_python_3_12_or_later_is_one_error_line_and_nothing_is_made(tmp_path):
  _fake_python(tmp_path / "pyenv" / "versions" / "3.11.7" / "bin" / "python", "3.11")
  result = _set_up(tmp_path)
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
  assert result.stderr.startswith("error: found no Python 3.13 or 3.12 (python3.13 on the PATH")
  assert not (tmp_path / "venv").exists()


def test_python_older_than_3_12_named_by_PYTHON_is_one_error_line(tmp_path):  # noqa: N802
  old = _fake_python(tmp_path / "bin" / "python3.11", "3.11")
  result = _set_up(tmp_path, PYTHON=str(old))
  assert result.returncode == 2, result.stderr
  assert result.stderr == (
    f"error: PYTHON={old} is Python 3.11; the locked JAX needs Python >= 3.12: name one with "
    "PYTHON=/path/to/python3.13, or leave PYTHON unset to take the newest found\n"
  )
  assert not (tmp_path / "venv").exists()


def test_a_venv_of_a_python_older_than_3_12_is_made_anew(tmp_path):
  _fake_python(tmp_path / "venv" / "bin" / "python", "3.11")  # an older launch.sh's .venv
  (tmp_path / "venv" / "left-over").write_text("")
  _fake_python(tmp_path / "pyenv" / "versions" / "3.12.1" / "bin" / "python", "3.12")
  result = _set_up(tmp_path)
  assert result.returncode == 0, result.stderr
  assert not (tmp_path / "venv" / "left-over").exists()
  assert "echo 3.12" in (tmp_path / "venv" / "bin" / "python").read_text()


@pytest.fixture
def machine(tmp_path):
  """Runs launch.sh with a stand-in Python that records its calls, with or without a GPU."""
  fake = tmp_path / "bin"
  fake.mkdir()
  _fake_python(fake / "python")
  (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\n")
  for program in fake.iterdir():
    program.chmod(0o755)
  gpu_path = tmp_path / "gpu-bin"
  gpu_path.mkdir()
  (gpu_path / "nvidia-smi").symlink_to(fake / "nvidia-smi")
  log = tmp_path / "calls.log"

  def launch(*args, gpu: bool) -> list[str]:
    log.write_text("")
    path = f"{gpu_path}:{os.environ['PATH']}" if gpu else os.environ["PATH"]
    env = {
      **{k: v for k, v in os.environ.items() if k != "RESEARCH_PYTHON"},
      "PATH": path,
      "PYTHON": str(fake / "python"),
      "RESEARCH_VENV": str(tmp_path / "venv"),
      "FAKE_LOG": str(log),
    }
    result = subprocess.run(
      [str(ROOT / "launch.sh"), *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines()

  return launch


def test_a_gpu_venv_made_on_a_login_node_runs_on_the_gpu_node_without_pip(machine):
  calls = machine("setup", "--gpu", gpu=False)  # the login node: internet, no GPU
  assert any("install -c requirements/cuda12.lock -e .[tools,test,cuda12]" in c for c in calls), (
    calls
  )
  for gpu in (True, False):  # the GPU node (no internet), and the login node again
    calls = machine(SMOKE, gpu=gpu)
    assert calls == [f"-m research.main --config={SMOKE}"], calls


def test_a_cpu_venv_on_a_gpu_node_is_upgraded_to_the_gpu_set(machine):
  assert any("cpu.lock" in c for c in machine(SMOKE, gpu=False))
  calls = machine(SMOKE, gpu=True)
  assert any("install -c requirements/cuda12.lock -e .[tools,test,cuda12]" in c for c in calls), (
    calls
  )
  assert calls[-1] == f"-m research.main --config={SMOKE}"


def test_the_scaling_report_runs_as_a_tool_and_the_other_commands_as_before(machine):
  """The training library never imports the tools: launch.sh starts each."""
  calls = machine(SMOKE, "--config.scaling_report=True", gpu=False)
  assert calls[-1] == f"-m tools.scaling --config={SMOKE} --config.scaling_report=True"
  assert machine("report", "--render", gpu=False)[-1] == "-m tools.report --render"
  assert machine("bench", "--small", gpu=False)[-1] == "-m tools.benchmark --small"
  assert machine("eval", "runs/a", gpu=False)[-1] == "-m research.trained eval runs/a"
  assert machine("predict", "runs/a", "x.jpg", gpu=False)[-1] == (
    "-m research.trained predict runs/a x.jpg"
  )
  calls = machine(SMOKE, "--config.scaling_report=False", gpu=False)
  assert calls[-1] == f"-m research.main --config={SMOKE} --config.scaling_report=False"


def _skip_without_pypi() -> None:
  """Skips the test where the package registry does not answer, saying so and why in the
  run's summary (pyproject.toml's addopts: -rs); probed as the test runs, not at collection."""
  import urllib.request

  try:
    urllib.request.urlopen("https://pypi.org/simple/ml-collections/", timeout=10)
  except OSError as e:
    pytest.skip(f"needs the package registry: https://pypi.org did not answer ({e})")


def test_a_wheelhouse_for_another_python_installs_without_an_index(tmp_path):
  _skip_without_pypi()
  wheels = tmp_path / "wheelhouse"
  made = subprocess.run(
    [str(ROOT / "launch.sh"), "wheelhouse", "--python-version", "3.12", "--dest", str(wheels)]
    + ["ml-collections"],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "RESEARCH_PYTHON": sys.executable},
  )
  assert made.returncode == 0, made.stderr[-2000:]
  locked = next(
    p for p in (ROOT / "requirements" / "cpu.lock").read_text().split() if "ml_coll" in p
  )
  (wheel,) = wheels.glob(f"ml_collections-{locked.split('==')[1]}-*.whl")  # the locked version
  site = tmp_path / "site"
  subprocess.run(
    [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    + ["--find-links", str(wheels), "--target", str(site), "ml-collections"],
    check=True,
    timeout=120,
  )
  assert (site / "ml_collections" / "__init__.py").is_file() and wheel.stat().st_size > 0


@pytest.mark.parametrize("args, code", [(["--help"], 0), (["-h"], 0), ([], 2)])
def test_help_is_the_usage_and_no_arguments_is_the_usage_with_an_error_code(args, code, tmp_path):
  result = _launch(args, tmp_path)
  assert result.returncode == code
  assert result.stderr == (
    "" if code == 0 else "error: give a config to train or a command (the usage is below)\n"
  )
  assert (
    result.stdout.startswith("./launch.sh CONFIG[:variant]") and "./launch.sh test" in result.stdout
  )


def test_paths_are_read_from_where_the_command_was_started(tmp_path):
  """From a directory outside the checkout, every path given relative to it is read from
  there: the config file, --workdir, data_dir, predict's inputs and --output, init_from; the
  run records its paths absolute, so they hold from anywhere."""
  shutil.copytree(ROOT / "tests/data/cifar10_slice", tmp_path / "data")
  config = os.path.relpath(ROOT / "configs/cifar_keras_cnn.py", tmp_path) + ":smoke"
  env = {**os.environ, "RESEARCH_PYTHON": sys.executable}
  launch = lambda *args: subprocess.run(
    [str(ROOT / "launch.sh"), *args], cwd=tmp_path, capture_output=True, text=True, env=env
  )
  data = ["--config.dataset=folder", "--config.data_dir=data", "--config.num_train_steps=2"]
  # test_folder.py's batches on this slice: the steps it compiles, loaded here
  data += ["--config.batch_size=32", "--config.eval_batch_size=32"]
  trained = launch(config, "--workdir=run", *data, "--config.eval_every_steps=0")
  assert trained.returncode == 0, trained.stderr
  recorded = json.loads((tmp_path / "run" / "config.json").read_text())
  assert recorded["data_dir"] == str(tmp_path / "data")
  predicted = launch("predict", "run", "data/test/cat", "--output=out.csv")
  assert predicted.returncode == 0, predicted.stderr
  assert len((tmp_path / "out.csv").read_text().splitlines()) == 1 + 8  # a header, 8 images
  tuned = launch(config, "--workdir=tuned", *data, "--config.init_from=run")
  assert tuned.returncode == 0, tuned.stderr
  recorded = json.loads((tmp_path / "tuned" / "config.json").read_text())
  assert recorded["init_from"] == str(tmp_path / "run")
  script = "from research import trained\nprint(trained.load('run').predict(['photo.jpg']).shape)\n"
  (tmp_path / "script.py").write_text(script)
  shutil.copy(tmp_path / "data/test/cat/0001.jpg", tmp_path / "photo.jpg")
  loaded = launch("python", "script.py")  # the project's Python: research importable
  assert loaded.returncode == 0 and loaded.stdout.strip() == "(1, 10)", loaded.stderr


def test_runs_keep_compiled_steps_in_the_home_cache_unless_told_otherwise(tmp_path):
  """launch.sh's default for JAX's persistent compilation cache: under the home directory,
  the variable's own value where it is set, none where the home cannot hold it."""
  show = ["python", "-c", "import os; print(os.environ.get('JAX_COMPILATION_CACHE_DIR'))"]
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  run = lambda **extra: subprocess.run(
    [str(ROOT / "launch.sh"), *show],
    capture_output=True,
    text=True,
    env={**env, "RESEARCH_PYTHON": sys.executable, **extra},
    timeout=60,
  ).stdout.strip()
  assert run(HOME=str(tmp_path)) == str(tmp_path / ".cache" / "research" / "jax-compilation")
  assert (tmp_path / ".cache" / "research" / "jax-compilation").is_dir()
  assert run(HOME=str(tmp_path), JAX_COMPILATION_CACHE_DIR="/elsewhere") == "/elsewhere"
  (tmp_path / "file").write_text("")
  assert run(HOME=str(tmp_path / "file")) == "None"  # not a directory: compile as without
