"""Host worker processes end with the run that started them, however it ends."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

# Starts a pool, gives its worker a long task, then dies by SIGKILL (no cleanup of any kind):
# once the worker runs, or at once, while it is still starting (it then finds its parent gone).
KILLED = """
import os, signal, sys, time
from research import host_workers
pool = host_workers.pool(1)
if sys.argv[1] == "running":
  print(pool.submit(os.getpid).result(), flush=True)
pool.submit(time.sleep, 600)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed(script: str, *args: str) -> str:
  """The output of `script`, which kills itself. The pipes close only when the workers, which
  inherited them, have exited too: without that this waits out the timeout (as a reader of a
  killed run's output would, forever)."""
  result = subprocess.run(
    [sys.executable, "-c", script, *args],
    capture_output=True,
    text=True,
    timeout=60,
    cwd=Path(__file__).parent.parent,
  )
  assert result.returncode == -signal.SIGKILL, result.stderr
  return result.stdout


@pytest.mark.parametrize("when", ["running", "while-it-starts"])
def test_a_worker_exits_when_its_run_is_killed_and_releases_the_run_s_output(when):
  output = _killed(KILLED, when)
  if when != "running":
    return
  worker = int(output)
  stat = Path(f"/proc/{worker}/stat")
  # Gone, or a zombie its new parent has not reaped yet.
  assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"


# The streamed input's decode workers (grain), killed the same way once they deliver.
GRAIN_KILLED = """
import os, signal
import grain
from research.data import streaming
batches = streaming.batch_stream(grain.MapDataset.range(10**6), batch=2, start=0, workers=2)
next(batches)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_streamed_input_s_workers_exit_when_the_run_is_killed():
  _killed(GRAIN_KILLED)
