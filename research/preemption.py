"""SIGTERM (what clusters send before preempting a job) as a flag all processes agree on.

With several processes, a SIGTERM may reach only some of them. Each process's flag is
combined with everyone's at the same steps (every `every` steps, one tiny all-gather), so all
processes stop after the same step and save one checkpoint together; none steps on alone.
"""

import signal

import jax
import numpy as np
from jax.experimental import multihost_utils


class Preemption:
  """While active, SIGTERM sets a local flag instead of killing the process."""

  def __init__(self, every: int):
    self.every = every  # steps between agreements when there are several processes
    self._local = False
    self._previous = None

  def __enter__(self):
    self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self._local = True

  def __exit__(self, *exc):
    signal.signal(signal.SIGTERM, self._previous)

  def stop_after(self, step: int) -> bool:
    """Whether to save and stop after `step`: the same answer in every process."""
    if jax.process_count() == 1:
      return self._local
    if step % self.every:
      return False
    flags = multihost_utils.process_allgather(np.int32(self._local))  # [processes]
    return bool(np.any(flags))


class Preempted(Exception):  # noqa: N818 - it is an event, not an error
  """Raised after the checkpoint at `step` was written in response to SIGTERM."""

  def __init__(self, step: int):
    super().__init__(f"preempted at step {step}")
    self.step = step
