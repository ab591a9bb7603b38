"""The Python packages a command needs, checked before it starts (standard library only), and
the environment of a child process on N devices.

`./launch.sh` normally runs in its own `.venv`, where everything is installed. With
`RESEARCH_PYTHON=/path/to/python` it runs on an interpreter someone else installed (a GPU
node's site JAX, no internet), so a missing package must be named with the command that
installs it, not found as a traceback halfway through a run. Only what the run uses is
required: a run on device-resident data needs neither grain nor tensorflow-datasets.
"""

import importlib
import importlib.metadata
import os
import re
import sys
from pathlib import Path

from research.errors import EXIT_USER_ERROR, UserError

ROOT = Path(__file__).parent.parent

# {module to import: distribution pip installs}
CORE = {
  "numpy": "numpy",
  "jax": "jax",
  "flax": "flax",
  "optax": "optax",
  "ml_collections": "ml-collections",
  "orbax.checkpoint": "orbax-checkpoint",
  "tqdm": "tqdm",
  "PIL": "pillow",
  "tensorboardX": "tensorboardX",
}
STREAMED = {"grain": "grain", "absl": "absl-py"}  # host decode workers
TFDS = {"tensorflow_datasets": "tensorflow-datasets", "array_record": "array-record"}
PLOTS = {"matplotlib": "matplotlib", "scipy": "scipy"}  # reports and experiments
TESTS = {"pytest": "pytest", "xdist": "pytest-xdist", "ruff": "ruff"}


def _normalized(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict:
  """{distribution: version} from requirements/cpu.lock: the versions the suite passed with."""
  lock = ROOT / "requirements" / "cpu.lock"
  if not lock.is_file():
    return {}
  pairs = (line.split("==") for line in lock.read_text().split() if "==" in line)
  return {_normalized(name): version for name, version in pairs}


def _minimums() -> dict:
  """{distribution: lowest version} from pyproject.toml's `name>=version` dependencies."""
  text = (ROOT / "pyproject.toml").read_text() if (ROOT / "pyproject.toml").is_file() else ""
  return {_normalized(n): v for n, v in re.findall(r'"([\w.-]+)(?:\[\w+\])?>=([\d.]+)"', text)}


def _version_tuple(version: str) -> tuple:
  return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def missing(modules: dict) -> list[str]:
  """The distributions of `modules` that do not import, or are older than pyproject allows."""
  minimums, absent = _minimums(), []
  for module, distribution in modules.items():
    try:
      importlib.import_module(module)
    except ImportError:
      absent.append(distribution)
      continue
    lowest = minimums.get(_normalized(distribution))
    try:
      installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:  # importable, not from a distribution
      continue
    if lowest and _version_tuple(installed) < _version_tuple(lowest):
      absent.append(distribution)
  return absent


def check(modules: dict) -> None:
  """A user error naming each package of `modules` this interpreter lacks, and how to install it."""
  if not (absent := missing(modules)):
    return
  pins = _pins()
  wanted = " ".join(
    f"'{d}=={pins[_normalized(d)]}'" if _normalized(d) in pins else d for d in absent
  )
  raise UserError(
    f"this Python ({sys.executable}) lacks {', '.join(absent)}; install with: "
    f"{sys.executable} -m pip install {wanted} (no internet here: make a wheelhouse where there "
    "is, `./launch.sh wheelhouse --python-version X.Y NAME ...`, copy it over and add "
    "--no-index --find-links=wheelhouse)"
  )


def for_devices(n_devices: int, backend: str) -> dict:
  """This process's environment for a child run on `n_devices` of `backend` ("gpu" or "cpu")."""
  env = dict(os.environ)
  if backend == "gpu":
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n_devices))
  else:
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={n_devices}"])
  return env


if __name__ == "__main__":  # launch.sh's check before the suite runs
  try:
    check({**CORE, **TESTS, **PLOTS})  # the suite tests the tools too
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
