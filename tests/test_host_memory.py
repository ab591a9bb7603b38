"""research.host_memory: memory a process frees is reused, not handed back to the kernel."""

import subprocess
import sys

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
