"""Host worker processes end with the run that started them, however it ends."""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.end_to_end  # trains runs or starts processes (docs/testing.md)

# Starts a pool, gives its worker a long task, then dies by SIGKILL (no cleanup of any kind):
# once the worker runs, or at once, while it is still starting (it then finds its parent gone).
KILLED = """
import os, signal, sys, time
from research import host_workers
with host_workers.pool(1) as pool:
  if sys.argv[1] == "running":
    print(pool.submit(os.getpid).result(), flush=True)
  pool.submit(time.sleep, 600)
  os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed(script: str, *args: str) -> str:
  """The output of `script`, which kills itself. The pipes close only when the workers, which
  inherited them, have exited too: without that this waits out the timeout (as a reader of a
  killed run's output would, forever). The script's process group is killed in the end, so
  a failure leaves no worker behind."""
  process = subprocess.Popen(
    [sys.executable, "-c", script, *args],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=Path(__file__).parent.parent,
    start_new_session=True,
  )
  try:
    output, errors = process.communicate(timeout=60)
  finally:
    with contextlib.suppress(ProcessLookupError):  # none left: the workers exited
      os.killpg(process.pid, signal.SIGKILL)
  assert process.returncode == -signal.SIGKILL, errors
  return output


def test_a_running_worker_exits_when_its_run_is_killed():
  worker = int(_killed(KILLED, "running"))
  stat = Path(f"/proc/{worker}/stat")
  # Gone, or a zombie its new parent has not reaped yet.
  assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"


def test_a_worker_still_starting_exits_when_its_run_is_killed():
  _killed(KILLED, "starting")  # the worker finds its parent gone when it starts


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


# A run's streams, read and closed as training and evaluation do, in a process that then exits.
GRAIN_READ = """
import numpy as np
import grain
from research.data import streaming

def run():
  images = grain.MapDataset.range(64).map(
    lambda i: {"image": np.full((32, 32, 3), i, np.uint8), "label": i % 10, "skipped": 0}
  )
  batches = streaming.batch_stream(images.repeat(None), batch=4, start=0, workers=2)
  seen = [next(batches)["image"] for _ in range(40)]
  batches.close()
  evaluated = list(streaming.eval_batches(images, 4, workers=2))
  print(len(seen), len(evaluated))

run()
"""


def _run(script: str, **popen) -> subprocess.CompletedProcess:
  """`script` run to its end in a Python of its own, from the repository's root."""
  return subprocess.run(
    [sys.executable, "-c", script],
    capture_output=True,
    text=True,
    cwd=Path(__file__).parent.parent,
    timeout=60,
    **popen,
  )


def test_a_run_that_read_streamed_batches_exits_with_their_shared_memory_freed():
  result = _run(GRAIN_READ)
  assert result.returncode == 0 and result.stdout == "40 16\n", result.stderr
  assert "leaked" not in result.stderr and "Traceback" not in result.stderr, result.stderr


# A Ctrl-C to the whole process group (as a terminal sends it) while the streamed input's
# workers start, and a SIGTERM (as a scheduler sends it) once they run, during training: the
# run takes them (research/preemption.py) and its stream goes on.
GRAIN_SIGNALLED = """
import os, signal, threading, time
import grain
from research.data import streaming
from research.preemption import Preemption

def run():
  with Preemption(every=1) as preemption:
    ctrl_c_at_start = threading.Timer(0.3, os.killpg, (0, signal.SIGINT))
    ctrl_c_at_start.start()
    batches = streaming.batch_stream(grain.MapDataset.range(10**6).repeat(None), 2, 0, workers=2)
    next(batches)
    ctrl_c_at_start.join()
    os.killpg(0, signal.SIGTERM)
    time.sleep(1)
    print([int(next(batches)[0]) for _ in range(3)], preemption.interrupted, flush=True)
    batches.close()

run()
"""


def test_the_streamed_input_s_workers_leave_ctrl_c_and_sigterm_to_the_run():
  # In a process group of its own: the signals reach only the script's processes.
  result = _run(GRAIN_SIGNALLED, start_new_session=True)
  assert result.returncode == 0 and result.stdout == "[2, 4, 6] True\n", result.stderr
  assert "Traceback" not in result.stderr, result.stderr
