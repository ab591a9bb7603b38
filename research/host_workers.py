"""Host worker processes (folder decoding, the streamed input, host-side benchmarks) that
never outlive the run.

A worker whose parent is killed (SIGTERM before training starts, SIGKILL, a crash) would live
on: a pool worker holds both ends of its task queue, so it never reads end-of-file, and every
worker keeps the run's stdout and stderr open, so whoever reads them (a pipe, the report, a
test) waits forever. Each worker here watches its parent and exits once it is gone.
"""

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import threading
import time

PARENT_POLL_SEC = 0.5  # how long a worker outlives its parent at most


@contextlib.contextmanager
def pool(workers: int):
  """`workers` spawned processes (never fork a process that runs JAX: its threads). Leaving
  the block on an error or Ctrl-C drops the work still queued instead of waiting for it."""
  executor = concurrent.futures.ProcessPoolExecutor(
    workers,
    mp_context=multiprocessing.get_context("spawn"),
    initializer=exit_with_parent,
    initargs=(os.getpid(),),  # from here: the parent may be gone before a worker starts
  )
  try:
    yield executor
  finally:
    executor.shutdown(cancel_futures=True)


def exit_with_parent(parent: int, *_worker) -> None:
  """Starts a thread that ends this process once `parent` is not its parent any more (gone:
  the process was re-parented). The pool's initializer; grain passes its workers' index and
  count too, unused here."""

  def watch():
    while os.getppid() == parent:
      time.sleep(PARENT_POLL_SEC)
    os._exit(1)  # at once: the task in flight is not wanted any more

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def leave_signals_to(parent: int, *_worker) -> None:
  """grain's `worker_init_fn` for the streamed input's workers (bound to the parent with
  functools.partial): they ignore SIGINT and SIGTERM and end with their parent.

  A terminal's Ctrl-C and a scheduler's SIGTERM reach the whole process group. While a run
  trains, the parent takes them (research/preemption.py): it finishes its step, saves a
  checkpoint and closes its streams, which ends their workers. A worker killed by the signal
  instead would make the parent's next batch a crash ("worker process was terminated"). A
  worker started while the run trains begins with both signals blocked (pending until they
  are ignored here), so not even one still starting up is killed."""
  stops = (signal.SIGINT, signal.SIGTERM)
  for stop in stops:
    signal.signal(stop, signal.SIG_IGN)  # discards one pending
  signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
  exit_with_parent(parent)
