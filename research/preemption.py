"""SIGTERM (what clusters send before preempting a job) and Ctrl-C as a stop all processes agree on.

While a run trains, SIGTERM and the first Ctrl-C (SIGINT) only set a flag: the run finishes
its step, writes a checkpoint, prints the command that resumes it and exits; after the last
step, whose checkpoint is written before the final eval, the eval finishes. A second Ctrl-C
aborts at once, whatever the main thread is doing (a step, a compile or a save in flight);
the checkpoint before stays intact (orbax writes a new one under a temporary name and renames
it only when it is complete).

Python runs its signal handlers in the main thread, between bytecodes, so a main thread busy
in XLA would hear a Ctrl-C only when that call returns. Here the C-level handler writes each
signal's number to a pipe (`signal.set_wakeup_fd`) and a watcher thread reads it: a signal is
acted on when it arrives, and two Ctrl-C in a row count as two.

A terminal's Ctrl-C and a scheduler's SIGTERM reach the whole process group, the decode
workers too. The main thread blocks both signals while the watcher runs, so the processes
its threads start begin with them blocked, and ignore them from their first line of Python on
(research/host_workers.py): they end when the run closes its streams, not mid-batch.

With several processes, a signal may reach only some of them. Each process's flag is
combined with everyone's at the same steps (every `every` steps, one tiny all-gather), so all
processes stop after the same step and save one checkpoint together; none steps on alone.
"""

import os
import signal
import sys
import threading

import jax
import numpy as np

from research import peers
from research.errors import EXIT_INTERRUPTED
from research.placement import gather_processes


class Preemption:
  """While active, SIGTERM and the first SIGINT set a local flag instead of stopping the process."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, every: int):
    self.every = every  # steps between agreements when there are several processes
    self.signal: int | None = None  # the first signal received, if any
    self.training = True  # False from the last step's checkpoint on (then the final eval)

  def __enter__(self):
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)  # the C-level handler must never block
    self._previous_wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    # A Python handler that does nothing: the watcher acts; without one SIGINT would raise
    # KeyboardInterrupt in the main thread. A signal the process started with ignored stays
    # ignored (a script's background job starts with SIGINT ignored, so that the terminal's
    # Ctrl-C leaves it running), as Python itself keeps it before this.
    self._previous = {s: signal.getsignal(s) for s in self.SIGNALS}
    self.ignored = tuple(s for s in self.SIGNALS if self._previous[s] == signal.SIG_IGN)
    for s in self.SIGNALS:
      if s not in self.ignored:
        signal.signal(s, lambda *_: None)
    self._watcher = threading.Thread(target=self._watch, name="preemption", daemon=True)
    self._watcher.start()
    # From here the signals reach the watcher's thread only: threads started from now on, and
    # the worker processes they start, begin with them blocked (host_workers.leave_signals_to).
    self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
    return self

  def _watch(self):
    while True:
      for signum in os.read(self._read, 64):
        if signum == 0:  # __exit__'s stop: 0 is no signal's number
          return
        if signum in self.SIGNALS:
          self._handle(signum)

  def _handle(self, signum):
    if signum == signal.SIGINT and self.signal == signal.SIGINT:
      print(
        "\nsecond Ctrl-C: aborting now; the checkpoints already written stay as they were",
        file=sys.stderr,
        flush=True,
      )
      peers.ended()  # a user's abort, not a lost process
      os._exit(EXIT_INTERRUPTED)  # at once: no step, save or cleanup is waited for
    name, again = (
      ("Ctrl-C", " (Ctrl-C again to abort now)") if signum == signal.SIGINT else ("SIGTERM", "")
    )
    doing = (
      "finishing this step, then writing a checkpoint"
      if self.training
      else "training is done and its checkpoint is being written; finishing the final eval"
    )
    print(f"\n{name}: {doing}{again}", file=sys.stderr, flush=True)
    self.signal = self.signal or signum

  def __exit__(self, *exc):
    signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
    for s, handler in self._previous.items():
      if handler is not None:  # None: set outside Python, which Python cannot set back
        signal.signal(s, handler)
    signal.set_wakeup_fd(self._previous_wakeup)
    os.write(self._write, b"\0")
    self._watcher.join()
    os.close(self._write)
    os.close(self._read)

  def stop_after(self, step: int) -> bool:
    """Whether to save and stop after `step`: the same answer in every process."""
    if jax.process_count() == 1:
      return self.signal is not None
    if step % self.every:
      return False
    received = gather_processes(np.int32(self.signal or 0))  # [processes]
    if not received.any():
      return False
    # Every process stops for the same reason: an interrupt if any process got Ctrl-C.
    self.signal = signal.SIGINT if (received == signal.SIGINT).any() else signal.SIGTERM
    return True

  @property
  def interrupted(self) -> bool:
    """Whether the stop is a Ctrl-C (a user at a terminal), not a SIGTERM."""
    return self.signal == signal.SIGINT


class Preempted(Exception):  # noqa: N818 - it is an event, not an error
  """Raised after the checkpoint at `step` was written in response to SIGTERM or Ctrl-C."""

  def __init__(self, step: int, interrupted: bool):
    what = "interrupted (Ctrl-C)" if interrupted else "preempted"
    super().__init__(f"{what} at step {step}")
    self.step = step
    self.exit_code = EXIT_INTERRUPTED if interrupted else 0  # SIGTERM: a clean, planned stop
