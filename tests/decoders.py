"""A streamed source that records which process decoded each of its items: grain's decode
workers are spawned processes, which import this module to unpickle it (conftest.py, with its
side effects, would not do), so what they decode is told apart from what the run's own process
decodes."""

import os


class Recorded:
  """`source`'s items, each read appending the reading process's id to the file `log` (one
  short line a write, in append mode: the workers' lines never interleave)."""

  def __init__(self, source, log):
    self.source, self.log = source, str(log)

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> dict:
    with open(self.log, "a") as f:
      f.write(f"{os.getpid()}\n")
    return self.source[index]
