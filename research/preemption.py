"""SIGTERM (what clusters send before preempting a job) as a flag the training loop polls."""

import signal


class Preemption:
  """While active, SIGTERM sets `requested` instead of killing the process."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    signal.signal(signal.SIGTERM, self._previous)


class Preempted(Exception):  # noqa: N818 - it is an event, not an error
  """Raised after the checkpoint at `step` was written in response to SIGTERM."""

  def __init__(self, step: int):
    super().__init__(f"preempted at step {step}")
    self.step = step
