"""The run directory: where a run writes, and the check that a resume continues the same run.

A run's first launch writes config.json and data.json: what it was trained on, never
rewritten. Every launch appends its config and data to launches.jsonl; a resume is checked
against the last launch that trained, and a launch that changed them
(`--allow_config_change`) stays on record as such.
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np

from research.errors import UserError
from research.placement import gather_processes

DATA_FILE = "data.json"  # the data a training run's first launch used
LAUNCHES = "launches.jsonl"  # one record per launch: {"config", "data", "steps", "time"}
METADATA = "metadata.jsonl"  # one record per launch: devices, versions, dataset, classes

# Fields that may change when a run in an existing workdir is resumed or extended.
RESUMABLE_FIELDS = {
  "num_train_steps",
  "num_epochs",
  "log_every_steps",
  "log_every_seconds",
  "eval_every_steps",
  "eval_every_epochs",
  "checkpoint_every_steps",
  "checkpoint_every_epochs",
  "checkpoint_every_minutes",
  "lost_process_after_sec",
  "keep_checkpoints",
  "profile_steps",
  "data_dir",
  "data_fallback",
  "init_from",  # read by a fresh run only; a resume never reads it
}


def check_writable(workdir: Path) -> None:
  """A user error unless `workdir` is a directory this process can write in, or can be made
  one; checked before any data is loaded, and nothing is written to check it."""
  workdir = Path(workdir).absolute()
  existing = workdir
  while not existing.exists():  # the directory the new workdir would be made in
    existing = existing.parent
  if not existing.is_dir():
    what = "is a file" if existing == workdir else f"is inside {existing}, which is a file"
    raise UserError(f"--workdir={workdir} {what}; give a directory (existing or new)")
  if not os.access(existing, os.W_OK | os.X_OK):  # EROFS on a read-only filesystem, too
    where = "" if existing == workdir else f" (it would be made in {existing})"
    raise UserError(
      f"--workdir={workdir} is not writable{where}: a read-only filesystem or missing "
      "permissions; give a directory you can write in"
    )


NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
LOCK = ".lock"  # the launch that trains into a workdir holds it (`hold`); it says who
_HELD = {}  # {workdir: its open lock file}: held for this process's life


def hold(workdir: Path, only_if_there: bool = False) -> None:
  """Makes this launch the workdir's one writer: process 0 takes an exclusive lock on
  WORKDIR/.lock (flock) for the rest of its life, so that a killed holder frees it at once; a
  user error naming the holder (host, pid, since when) where another launch has it, in every
  process of the run (one all-gather). `only_if_there`: only where the workdir exists already
  (a resume: before it reads its checkpoints); the first write takes it anyway. Every process
  calls it at the same points; `release` gives it up. On NFS, flock holds only where the
  server supports it (docs/long_runs.md)."""
  workdir = Path(workdir).absolute()
  if only_if_there:  # the same at each call in every process: all gather, or none does
    there = workdir.is_dir()
    if jax.process_count() > 1:  # one answer for the run
      there = bool(gather_processes(np.int32(there)).max())
    if not there:
      return
  refused = _take(workdir) if jax.process_index() == 0 else ""
  if jax.process_count() > 1 and gather_processes(np.int32(bool(refused))).max():
    refused = refused or f"{workdir} is in use by another launch (process 0 found its lock held)"
  if refused:
    raise UserError(f"{refused}; wait for it to end or stop it, or give another --workdir")


def release(workdir: Path) -> None:
  """Gives up the workdir's lock (`hold`), where this process holds it: the launch is done."""
  lock = _HELD.pop(Path(workdir).absolute(), None)
  if lock is not None:
    lock.close()  # closing the file frees its flock


def _take(workdir: Path) -> str:
  """Takes the lock ("") or says who holds it."""
  if workdir in _HELD:
    return ""
  workdir.mkdir(parents=True, exist_ok=True)  # an error here: the run's one line (main.py)
  lock = open(workdir / LOCK, "a+")  # noqa: SIM115  (held open for the launch's life)
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    lock.seek(0)
    holder = lock.read().strip() or "a launch that did not say who it is"
    lock.close()
    return f"{workdir} is in use by another launch that trains into it ({holder})"
  except OSError as e:  # ENOLCK: a filesystem without locks (NFS without its lock service)
    lock.close()
    return f"cannot lock {workdir / LOCK} ({e.strerror or e}; docs/long_runs.md)"
  lock.seek(0)
  lock.truncate()
  since = time.strftime("%Y-%m-%d %H:%M:%S")
  lock.write(f"host {socket.gethostname()}, pid {os.getpid()}, since {since}\n")
  lock.flush()
  _HELD[workdir] = lock
  return ""


@contextlib.contextmanager
def write_errors_are_user_errors(workdir: Path):
  """The OSErrors that mean the run cannot write its files become one-line user errors: the
  workdir cannot be created, a path in it is not writable, or a disk is full. Any other
  OSError (a file a bug looks for in vain) keeps its traceback."""
  workdir = Path(workdir).absolute()
  try:
    yield
  except OSError as e:
    path = Path(e.filename).absolute() if e.filename else None
    inside = path is not None and path.is_relative_to(workdir)
    if e.errno in (errno.ENOSPC, errno.EDQUOT) and (inside or path is None):
      # A failed write or close names no file: the workdir's disk, or the data cache's.
      raise UserError(
        f"a disk this run writes to is full ({e.strerror}); free space, or give a --workdir on "
        "another disk"
      ) from e
    if path == workdir and e.errno == errno.ENOENT:  # its parent is not a real directory
      raise UserError(
        f"cannot create --workdir={workdir} ({e.strerror}); give a directory on a filesystem "
        "you can write to"
      ) from e
    if inside and e.errno in NOT_WRITABLE:
      raise UserError(
        f"cannot write {path} ({e.strerror}); give a --workdir you can write in"
      ) from e
    raise


def records(path: Path) -> list[dict]:
  """The records of a JSON-lines file of a workdir, first to last ([] if there is none)."""
  found = []
  for line in path.read_text().splitlines() if path.exists() else []:
    try:
      found.append(json.loads(line))
    except json.JSONDecodeError:  # a line cut short by a kill
      continue
  return found


def last_recorded(workdir: Path, field: str, name: str = METADATA):
  """`field` of the last record of `workdir`'s JSON-lines file `name` that has it (truthy), or
  None: by default the last launch's (metadata.jsonl)."""
  return next((r[field] for r in reversed(records(Path(workdir) / name)) if r.get(field)), None)


def launches(workdir: Path) -> list[dict]:
  """The launches into `workdir` on record, first to last (a workdir of an older version: its
  config.json and data.json as one launch)."""
  found = records(Path(workdir) / LAUNCHES)
  if found or not (Path(workdir) / "config.json").exists():
    return found
  data = Path(workdir) / DATA_FILE
  return [
    {
      "config": json.loads((Path(workdir) / "config.json").read_text()),
      "data": json.loads(data.read_text()) if data.exists() else None,
    }
  ]


def _trained(launched: list[dict]) -> list[dict]:
  """The launches that trained steps (a rerun of a finished run, an eval, trains none)."""
  steps = lambda r: r.get("steps") or [0, 1]  # older records: assume it trained
  return [r for r in launched if steps(r)[0] < steps(r)[1]] or launched


def last_config(workdir: Path) -> dict | None:
  """The config of the last launch into `workdir` that trained (its checkpoints' config)."""
  records = _trained(launches(workdir))
  return records[-1]["config"] if records else None


def check_resumable(
  workdir: Path, config: ml_collections.ConfigDict, allow_change: bool, complete=None
) -> None:
  """Refuses to resume into a workdir that holds a different experiment. `complete(saved)`:
  the run's recorded config as today's code reads it (configuration.completed: the fields
  added since the run at their defaults)."""
  saved = last_config(workdir)
  if saved is None:
    return
  if complete is not None:
    saved = json.loads(complete(saved).to_json())
  current = json.loads(config.to_json())
  if saved.get("experiment", current["experiment"]) != current["experiment"]:  # even allowed
    raise UserError(
      f"{workdir} holds a {saved['experiment']!r} experiment, not {current['experiment']!r}; "
      "use a new --workdir"
    )
  changed = sorted(
    k
    for k in saved.keys() | current.keys()
    if k not in RESUMABLE_FIELDS and saved.get(k) != current.get(k)
  )
  if changed and not allow_change:
    raise UserError(
      f"{workdir} holds a run with a different config ({_differ(changed)}); "
      "use a new --workdir, or pass --allow_config_change to resume into it anyway"
    )


def _differ(fields: list[str]) -> str:
  return f"{', '.join(fields)} {'differs' if len(fields) == 1 else 'differ'}"


def _describe(data: dict) -> str:
  fallback = ", the synthetic fallback" if data["synthetic_fallback"] else ""
  return f"{data['dataset']}{fallback} (content {data['content']})"


def _history(launched: list[dict]) -> str:
  """Which launches that trained used which data: "folder (content 1a2b…) in launches 1, 3"."""
  trained = {id(r) for r in _trained(launched)}
  numbered = [(n, r) for n, r in enumerate(launched, 1) if r.get("data") and id(r) in trained]
  runs = []  # [data, [launch numbers]]
  for number, record in numbered:
    if runs and runs[-1][0] == record["data"]:
      runs[-1][1].append(number)
    else:
      runs.append([record["data"], [number]])
  said = [
    f"{_describe(d)} in launch{'es' if len(ns) > 1 else ''} {', '.join(map(str, ns))}"
    for d, ns in runs
  ]
  return ", then ".join(said)


def check_data(workdir: Path, data: dict, allow_change: bool) -> None:
  """Refuses to resume a run on other data than its last training launch used (dataset,
  fallback, content). `data` is {"dataset", "synthetic_fallback", "content"}; where the data
  lives may change."""
  launched = launches(workdir)
  if not any(r.get("data") for r in launched) or allow_change:
    return
  saved = [r for r in _trained(launched) if r.get("data")][-1]["data"]
  if changed := sorted(k for k in data if saved.get(k) != data[k]):
    raise UserError(
      f"{workdir} was trained on {_history(launched)}, but this run would use "
      f"{_describe(data)} ({_differ(changed)}); supply the same data, use a new --workdir, or "
      "pass --allow_config_change to go on with this data (to evaluate on other data: "
      "./launch.sh eval WORKDIR --config.data_dir=DIR)"
    )


def prepare(
  workdir: Path, config: ml_collections.ConfigDict, data: dict | None = None, steps=None
) -> None:
  """Creates the workdir, records the resolved config and the data a training run uses (the
  first launch's in config.json and data.json, every launch's in launches.jsonl, with the
  `steps` [first, last] it trains); call once the input is validated."""
  if jax.process_index() != 0:
    return
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  if not (workdir / "config.json").exists():
    (workdir / "config.json").write_text(config.to_json(indent=2) + "\n")
  if data is not None and not (workdir / DATA_FILE).exists():
    (workdir / DATA_FILE).write_text(json.dumps(data, indent=2) + "\n")
  record = {"time": time.time(), "config": json.loads(config.to_json()), "data": data}
  if steps is not None:
    record["steps"] = list(steps)
  with open(workdir / LAUNCHES, "a") as f:
    f.write(json.dumps(record) + "\n")
  print(f"workdir: {workdir}", flush=True)
