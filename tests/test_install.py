"""The environment is the pinned one: launch.sh installs exactly requirements/cpu.lock."""

import importlib.metadata
import re
from pathlib import Path

LOCK = Path(__file__).parent.parent / "requirements" / "cpu.lock"


def _name(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def test_every_locked_package_is_installed_at_its_locked_version():
  pins = dict(line.split("==") for line in LOCK.read_text().split())
  installed = {_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
  assert len(pins) > 50  # the whole environment, not only the direct dependencies
  wrong = {n: (v, installed.get(_name(n))) for n, v in pins.items() if installed.get(_name(n)) != v}
  assert not wrong, f"(locked, installed): {wrong}; rerun ./launch.sh test to reinstall"
