"""The processes of a multi-process run watch each other: one that vanishes (SIGKILL, the OOM
killer, a host gone) stops the others soon, with an `error:` line and the command that resumes.

Each process writes a counter to jax.distributed's key-value store every second and reads the
others'. A process whose counter has not moved for `after` seconds, or a coordinator (process
0, which holds the store) that has not answered for as long, is lost: every process that sees
it prints the error and exits at once with EXIT_LOST, whatever its main thread waits for (a
collective with the lost process never returns). A collective that fails because a peer's
connection broke (gloo: "Connection reset by peer") is the same loss, seen sooner.

JAX's coordination service has heartbeats of its own, but when they stop it aborts the process
in C++ without a word of what to do; its timeout is set longer (`backstop_sec`), as a backstop.
A process that ends its run says so first, so that the others do not count it lost.

One loss JAX acts on before Python can: when process 0, which runs the coordination service,
is gone, the others are aborted in C++ at once. So each process of a multi-process run has a
guardian (`guard`), a small Python process that waits for it to end: if it ends without
having said so (`ended`), aborted or killed, the guardian prints the same `error:` line.
"""

import contextlib
import os
import re
import sys
import threading
import time

EXIT_LOST = 3  # a process of the run was lost; this one stopped
LOST_AFTER_SEC = 30  # for configs without lost_process_after_sec (research/fields.py has it)
_said = None  # the pipe to this process's guardian, while it has one

# The guardian: reads until its process's end closes the pipe; says the error unless "ended".
GUARDIAN = """
import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
  signal.signal(s, signal.SIG_IGN)  # it outlives its process by a moment, to speak
said, fd = b"", int(sys.argv[1])
while chunk := os.read(fd, 64):
  said += chunk
if said != b"ended":
  print(sys.argv[2], file=sys.stderr, flush=True)
"""
INTERVAL = 1.0  # seconds between a process's writes of its counter
# A failed collective that means a peer's connection broke (gloo, NCCL), not a slow peer or a
# bug of the program.
BROKEN_PEER = re.compile(
  r"connection reset|connection closed|socket closed|broken pipe|remote process exited", re.I
)


RESUME = "Its last checkpoint stays: start every process again to resume, this one with:"


def _error(why: str, me: int, resume: str) -> str:
  return (
    f"error: a process of this multi-process run was lost ({why}); process {me} stops too. "
    f"{RESUME}\n  ./launch.sh {resume}"
  )


def guard(resume: str) -> None:
  """Starts this process's guardian (before jax.distributed, whose abort it reports)."""
  global _said
  import subprocess

  read, _said = os.pipe()
  error = (
    "error: this process of a multi-process run ended abruptly: killed, or aborted by "
    "jax.distributed because another process was lost (the lines above say which). "
    f"{RESUME}\n  ./launch.sh {resume}"
  )
  subprocess.Popen(
    [sys.executable, "-c", GUARDIAN, str(read), error],
    pass_fds=(read,),
    stdin=subprocess.DEVNULL,
    start_new_session=True,  # a terminal's Ctrl-C or a job's signal is not for it
  )
  os.close(read)


def ended() -> None:
  """Tells the guardian, if any, that this process ends as it means to: it says nothing."""
  global _said
  if _said is not None:
    os.write(_said, b"ended")
    os.close(_said)
    _said = None


def backstop_sec(after: int) -> int:
  """JAX's own heartbeat timeout: long enough that `watch` speaks first."""
  return 2 * after + 10


@contextlib.contextmanager
def watch(after: int, resume: str):
  """Watches the other processes while the block runs (a no-op for one process); `resume`:
  the arguments of ./launch.sh that resume this process."""
  import jax

  if jax.process_count() == 1:
    yield
    return
  watcher = _Watcher(after, resume)
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    if not BROKEN_PEER.search(str(e)):
      raise
    watcher.lost(str(e).strip().splitlines()[0][:300])
  finally:
    watcher.stop()


class _Watcher:
  """Judges only from what its own requests saw, so that a process that is itself slow (a
  loaded machine) does not take its peers for lost: a peer is lost when its counter stood
  still across answers of the store that span `after` seconds; the store (process 0) is lost
  when a request has waited, or requests have failed, for `after` seconds."""

  def __init__(self, after: int, resume: str):
    import jax
    from jax._src import distributed  # the client that jax.distributed.initialize made

    self.client, self.after, self.resume = distributed.global_state.client, after, resume
    self.me, self.n = jax.process_index(), jax.process_count()
    self.moved = {}  # peer: (its counter, the answer that first showed it)
    self.answered = None  # when the last answer came
    self.unanswered = None  # since when requests have waited or failed, if they have
    self.done = set()  # processes that ended their run
    self.stopping = threading.Event()
    self.report = threading.Lock()
    for target in (self._beat, self._check):
      threading.Thread(target=target, name=f"peers-{target.__name__}", daemon=True).start()

  def _beat(self):
    """Writes this process's counter and reads everyone's (blocks while the store is gone)."""
    count = 0
    while not self.stopping.wait(INTERVAL):
      count += 1
      self.unanswered = self.unanswered or time.monotonic()
      try:
        self.client.key_value_set(f"research/alive/{self.me}", str(count), allow_overwrite=True)
        seen = dict(self.client.key_value_dir_get("research/"))
      except Exception:  # noqa: BLE001 - the store unreachable: `unanswered` keeps its time
        continue
      now = self.answered = time.monotonic()
      self.unanswered = None
      for p in range(self.n):
        value = seen.get(f"research/alive/{p}")
        if p != self.me and self.moved.get(p, (None,))[0] != value:
          self.moved[p] = (value, now)
        if f"research/done/{p}" in seen:
          self.done.add(p)

  def _check(self):
    """Never blocks on the store, so that a store that stopped answering is noticed too."""
    while not self.stopping.wait(INTERVAL / 2):
      if self.unanswered and time.monotonic() - self.unanswered > self.after:
        self.lost(f"process 0, which coordinates the run, has not answered for {self.after} s")
      for p, (_, since) in list(self.moved.items()):
        if p not in self.done and self.answered - since > self.after:
          self.lost(f"process {p} has given no sign of life for {self.after} s")

  def lost(self, why: str):
    with self.report:  # one message, from whichever thread sees it first
      print(_error(why, self.me, self.resume), file=sys.stderr, flush=True)
      ended()
      os._exit(EXIT_LOST)  # at once: a collective with the lost process would never return

  def stop(self):
    """This process's run ended: the others stop watching it, and its threads end."""
    with contextlib.suppress(Exception):
      self.client.key_value_set(f"research/done/{self.me}", "1", allow_overwrite=True)
    self.stopping.set()
