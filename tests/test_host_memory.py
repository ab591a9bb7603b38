"""research.host_memory: memory a process frees is reused, not handed back to the kernel."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

# Writes a 64 MB array twice; prints the page faults of the second time.
PROBE = """
import resource, sys
import numpy as np
from research import host_memory
if sys.argv[1] == "keep":
  assert host_memory.keep_freed_memory()
def allocate_and_free():
  np.ones(64 << 18, np.float32)
allocate_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
allocate_and_free()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
  out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  return int(out.stdout)


def test_freed_memory_is_reused_without_page_faults():
  default = _page_faults("default")
  assert default > 0  # glibc's default: the kernel maps and zeroes the block again
  assert _page_faults("keep") * 10 < default


def test_a_run_keeps_freed_memory_unless_its_config_says_not(tmp_path, monkeypatch):
  from research import host_memory, main
  from research.errors import UserError

  calls = []
  monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append(1))
  (tmp_path / "file").write_text("")  # a workdir that is a file: an error before training
  for spec, expected in (
    ("cifar_keras_cnn.py", 1),
    ("cifar_keras_cnn.py:smoke", 0),
    ("cifar_vgg.py", 0),
  ):
    calls.clear()
    with pytest.raises(UserError, match="is a file"):
      main.run(["--config", f"configs/{spec}", f"--workdir={tmp_path / 'file'}"])
    assert len(calls) == expected, spec
