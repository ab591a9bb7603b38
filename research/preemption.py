"""SIGTERM (what clusters send before preempting a job) and Ctrl-C as a stop all processes agree on.

While a run trains, SIGTERM and the first Ctrl-C (SIGINT) only set a flag: the run finishes
its step, writes a checkpoint, prints the command that resumes it and exits. A second Ctrl-C
aborts at once; the checkpoint before stays intact (orbax writes a new one under a temporary
name and renames it only when it is complete).

With several processes, a signal may reach only some of them. Each process's flag is
combined with everyone's at the same steps (every `every` steps, one tiny all-gather), so all
processes stop after the same step and save one checkpoint together; none steps on alone.
"""

import os
import signal
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from research.errors import EXIT_INTERRUPTED


class Preemption:
  """While active, SIGTERM and the first SIGINT set a local flag instead of stopping the process."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, every: int):
    self.every = every  # steps between agreements when there are several processes
    self.signal: int | None = None  # the first signal received, if any
    self._previous = {}

  def __enter__(self):
    self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
    return self

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.signal == signal.SIGINT:
      print(
        "\nsecond Ctrl-C: aborting now; the checkpoints already written stay as they were",
        file=sys.stderr,
        flush=True,
      )
      os._exit(EXIT_INTERRUPTED)  # at once: no step, save or cleanup is waited for
    if signum == signal.SIGINT:
      print(
        "\nCtrl-C: finishing this step, then writing a checkpoint (Ctrl-C again to abort now)",
        file=sys.stderr,
        flush=True,
      )
    self.signal = self.signal or signum

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)

  def stop_after(self, step: int) -> bool:
    """Whether to save and stop after `step`: the same answer in every process."""
    if jax.process_count() == 1:
      return self.signal is not None
    if step % self.every:
      return False
    received = multihost_utils.process_allgather(np.int32(self.signal or 0))  # [processes]
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
