"""Where a GPU profile's time goes: its kernels summed by kind of op, and the GPU's idle share.

  python -m tools.profile_summary WORKDIR/profile     # the newest trace under it

A run writes WORKDIR/profile with `--config.profile_steps='(START,STOP)'` (research/progress.py's
Profiler, whose closing line says whether the window held steady steps only). This reads the
Chrome trace (`*.trace.json.gz`) jax.profiler wrote, takes every kernel on the device's streams
(the events of the processes named /device:GPU:N, less the steps' own markers), sorts each into a
kind by its name (KINDS, first match), and prints per kind the milliseconds and the share of the
kernels' time; then the window, the kernels' time (overlaps counted once) and the share of the
window in which no kernel ran: the GPU idle. `--json` prints the same as one JSON object.
"""

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

from research.errors import EXIT_USER_ERROR, UserError

# (kind, pattern searched in a kernel's name, lower case), the first that matches
KINDS = (
  ("max-pool gradient (select-and-scatter)", r"select_and_scatter"),
  ("max-pool forward (reduce-window)", r"reduce_window"),
  ("convolutions", r"conv|cudnn|implicit|fprop|dgrad|wgrad"),  # cuDNN's and CUTLASS's
  ("matrix products", r"gemm|dot|cublas|matmul"),
  ("reductions", r"reduce|reduction"),
  ("memsets and copies", r"memset|memcpy|copy"),
  ("elementwise and other fusions", r"fusion|loop|elementwise|transpose|concatenate"),
)
OTHER = "other kernels"


def newest_trace(path: Path) -> Path:
  """`path` if a trace file, else the newest *.trace.json.gz under it."""
  if path.is_file():
    return path
  traces = sorted(path.glob("**/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
  if not traces:
    raise UserError(f"no *.trace.json.gz under {path}; profile a run with --config.profile_steps")
  return traces[-1]


def kernels(trace: dict) -> list[tuple[float, float, str]]:
  """(start µs, end µs, name) of every kernel on a GPU's streams."""
  events = trace.get("traceEvents", [])
  devices = {
    e["pid"]
    for e in events
    if e.get("ph") == "M" and e.get("name") == "process_name"
    and re.match(r"/device:GPU:\d+", str(e.get("args", {}).get("name", "")))
  }  # fmt: skip
  return [
    (e["ts"], e["ts"] + e["dur"], e["name"])
    for e in events
    if e.get("ph") == "X" and e.get("pid") in devices and e.get("dur", 0) > 0
  ]


def kind(name: str) -> str:
  lowered = name.lower()
  return next((k for k, pattern in KINDS if re.search(pattern, lowered)), OTHER)


def summary(trace: dict) -> dict:
  """{"kinds": {kind: ms}, "kernels_ms", "window_ms", "idle_share"} of a trace's GPU kernels;
  the window spans the first kernel's start to the last one's end."""
  spans = sorted(kernels(trace))
  if not spans:
    raise UserError(
      "the trace has no GPU kernels (a process named /device:GPU:N); a CPU run's trace has "
      "no device timeline to summarise"
    )
  by_kind: dict[str, float] = {}
  for start, end, name in spans:
    which = kind(name)
    by_kind[which] = by_kind.get(which, 0.0) + (end - start) / 1e3
  busy, reach = 0.0, spans[0][0]  # the union of the kernels' intervals, streams overlapping
  for start, end, _ in spans:
    busy += max(0.0, end - max(start, reach))
    reach = max(reach, end)
  window = spans[-1][1] - spans[0][0]
  kinds = dict(sorted(by_kind.items(), key=lambda item: -item[1]))
  return {
    "kinds": kinds,
    "kernels_ms": sum(kinds.values()),
    "busy_ms": busy / 1e3,
    "window_ms": window / 1e3,
    "idle_share": 1 - busy / window if window else 0.0,
  }


def table(result: dict) -> str:
  total = result["kernels_ms"]
  lines = ["| kernels | ms | share |", "| --- | --- | --- |"]
  lines += [f"| {k} | {ms:.1f} | {ms / total:.0%} |" for k, ms in result["kinds"].items()]
  lines.append(
    f"\nkernels {total:.1f} ms ({result['busy_ms']:.1f} ms with overlaps counted once) in a "
    f"window of {result['window_ms']:.1f} ms: the GPU idle {result['idle_share']:.1%} of it"
  )
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("profile", type=Path, help="WORKDIR/profile, or one *.trace.json.gz")
  parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
  args = parser.parse_args(argv)
  try:
    path, result = summarised(args.profile)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USER_ERROR
  print(json.dumps({"trace": str(path), **result}) if args.json else f"{path}\n\n{table(result)}")
  return 0


def summarised(profile: Path) -> tuple[Path, dict]:
  """(the trace read, its summary) for WORKDIR/profile or a trace file."""
  if not profile.exists():
    raise UserError(f"{profile} does not exist; give WORKDIR/profile or a trace file")
  path = newest_trace(profile)
  try:
    with gzip.open(path, "rt") as f:
      trace = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read {path} as a gzipped Chrome trace ({e})") from None
  return path, summary(trace)


if __name__ == "__main__":
  sys.exit(main())
