"""Keeps freed host memory in the process, so XLA:CPU's step stops page-faulting.

XLA:CPU allocates a step's buffers with malloc and frees them when the step ends. glibc gives
large blocks, and its per-thread arenas, back to the kernel, so every step the kernel maps
and zeroes the same memory again. With one arena, no mmap and no trimming, the freed memory
is reused once the heap has grown to the step's peak (the first few steps). What it costs and
gains: docs/cpu_step.md and BENCHMARKS.md ("CPU forms").

The cost: the process keeps its peak host memory until it exits, and a heap that never
shrinks fragments under steps with very large buffers (research/main.py applies it unless
the config sets keep_freed_host_memory=False). GPU runs do not need it
(their step's buffers live on the GPU); it applies there too, for one code path.
"""

import ctypes
import ctypes.util

# mallopt(3) parameters, from glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8


def keep_freed_memory() -> bool:
  """Tells glibc's malloc to reuse freed memory; True if it took. Call before JAX starts.

  Threads pick their arena at their first allocation, so this must run before XLA's thread
  pool exists (before the first `jax.devices()`). Elsewhere than glibc (macOS) it does nothing.
  """
  try:
    mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
  except (OSError, AttributeError, TypeError):  # no C library found, or one without mallopt
    return False
  settings = {M_ARENA_MAX: 1, M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2**31 - 1}
  return all(mallopt(param, value) == 1 for param, value in settings.items())
