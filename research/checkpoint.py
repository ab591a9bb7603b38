"""Checkpoints of the UNREPLICATED train state with orbax, written in the background.

What a resume restores exactly: the parameters, BatchNorm statistics, optimizer state and
step, none of which depends on the device count. Data order and every random draw are
functions of (seed, step, position in the global batch), so a resume continues the run on
any device count: bit for bit on the same count, to float summation order on another; only
sharded resident data draws batches per device (docs/long_runs.md).
"""

import errno
import os
import re
import shutil
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import serialization, traverse_util

from research.errors import UserError
from research.placement import gather_processes, wait_for_all


def _layout(tree) -> dict:
  """{"params/Dense_0/kernel": shape} for a state dict or orbax's metadata tree."""
  flat = traverse_util.flatten_dict(tree, sep="/")
  return {k: tuple(getattr(v, "shape", ())) for k, v in flat.items() if v is not None}


def _mismatch(saved: dict, wanted: dict) -> str:
  """What differs between a checkpoint's layout and the config's, in a few words ("" if none)."""
  problems = [f"{k} is not in the checkpoint" for k in wanted if k not in saved]
  problems += [f"{k} is in the checkpoint but not in this config" for k in saved if k not in wanted]
  problems += [
    f"{k} has shape {saved[k]} in the checkpoint, {wanted[k]} in this config"
    for k in wanted
    if k in saved and saved[k] != wanted[k]
  ]
  more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
  names = {
    "params": "the parameters",
    "batch_stats": "the BatchNorm statistics",
    "opt_state": "the optimizer state (optimizer, grad_clip_norm or weight_decay changed?)",
    "ema_params": "the EMA of the weights (ema_decay turned on or off?)",
  }
  parts = sorted({p.split("/")[0] for p in problems})  # each problem starts with its path
  where = " and ".join(names.get(part, part) for part in parts)
  return f"{where}: " + "; ".join(problems[:2]) + more if problems else ""


# How tensorstore, which writes orbax's files, reports a full disk inside a ValueError.
_DISK_FULL = re.compile(rf"os_error_code='({errno.ENOSPC}|{errno.EDQUOT})'")


def _disk_full(directory: Path, detail: str, code: int = errno.ENOSPC) -> OSError:
  """The OSError of a full disk (or quota), which research.workdir turns into the run's one
  error line."""
  return OSError(code, f"{os.strerror(code)}: {detail}", str(directory))


# What Checkpoints reads of the config (the run hands it a view of these, research/fields.py).
READS = (
  "checkpoint_every_steps",
  "checkpoint_every_minutes",
  "log_every_steps",
  "keep_checkpoints",
)


def _handler():
  return ocp.StandardCheckpointHandler()  # lets item_metadata read a layout


UNREADABLE = "checkpoints_unreadable"  # where a resume moves the checkpoints it cannot read


class Checkpoints:
  """Saves every `every` steps (default: `checkpoint_every_steps`), and once
  `checkpoint_every_minutes` passed since the last save (or the launch), into
  WORKDIR/checkpoints, keeping the newest `keep_checkpoints` (`fields`: READS)."""

  def __init__(self, workdir: Path, fields, echo=print, every=None):
    self.every = fields.checkpoint_every_steps if every is None else every
    self.every_sec = fields.get("checkpoint_every_minutes", 0) * 60
    self.agree_every = fields.get("log_every_steps", 1)  # several processes decide at log steps
    self.last_saved = time.monotonic()
    self.directory = Path(workdir).absolute() / "checkpoints"
    self.echo = echo
    self.manager = ocp.CheckpointManager(
      self.directory,
      item_handlers=ocp.StandardCheckpointHandler(),  # lets item_metadata read a layout
      # The directory is made by the first save: a run that stops before it (a bad config, a
      # step that does not compile) leaves none behind.
      options=ocp.CheckpointManagerOptions(
        max_to_keep=fields.keep_checkpoints, create=False, enable_async_checkpointing=True
      ),
    )

  def due(self, step: int) -> bool:
    """Whether to save after `step`: the same answer in every process (call once a step).
    By time, several processes agree at log steps (one tiny all-gather), as on a stop."""
    if self.every > 0 and step % self.every == 0:
      return True
    if not self.every_sec:
      return False
    late = time.monotonic() - self.last_saved >= self.every_sec
    if jax.process_count() == 1:
      return late
    if step % self.agree_every:
      return False
    return bool(gather_processes(np.int32(late)).any())

  def restore_latest(self, state):
    """`state` filled from the newest readable checkpoint, or `state` itself if there is none.

    A checkpoint that does not fit `state` (another model or optimizer) is a UserError and
    nothing is touched. One that cannot be read at all (a crash mid-write, a damaged disk) is
    moved to checkpoints_unreadable/ by process 0, never deleted, and the one before it is used;
    none left (and some moved, now or before) is a UserError: a run never restarts silently.
    """
    target = serialization.to_state_dict(state)
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:  # by a manager of its own, closed at once: a damaged one leaves no reads running
        with ocp.CheckpointManager(self.directory, item_handlers=_handler()) as reader:
          saved = _layout(reader.item_metadata(step).tree)
      except Exception as e:  # orbax raises many types for damaged files  # noqa: BLE001
        self._set_aside(step, e)
        continue
      if problem := _mismatch(saved, _layout(target)):
        raise UserError(
          f"the checkpoint at step {step} in {self.directory} does not fit this config: "
          f"{problem}; start fresh with a new --workdir (nothing was changed in this one)"
        )
      try:
        with ocp.CheckpointManager(self.directory, item_handlers=_handler()) as reader:
          restored = reader.restore(step, args=ocp.args.StandardRestore(target))
      except Exception as e:  # noqa: BLE001
        self._set_aside(step, e)
        continue
      return serialization.from_state_dict(state, restored)
    aside = self.directory.parent / UNREADABLE
    if aside.is_dir():  # a run that had checkpoints: never a silent start from step 0
      raise UserError(
        f"no readable checkpoint is left in {self.directory}: the unreadable ones are in "
        f"{aside}; to start over, delete {self.directory.parent} (or give another --workdir)"
      )
    return state

  def _set_aside(self, step: int, error: Exception) -> None:
    aside = self.directory.parent / UNREADABLE / str(step)
    older = any(s < step for s in self.manager.all_steps())
    self.echo(
      f"warning: the checkpoint at step {step} is unreadable ({type(error).__name__}: "
      f"{str(error)[:200]}); moved it to {aside}" + ("; trying the one before it" if older else "")
    )
    wait_for_all(f"checkpoint-{step}-unreadable")  # every process has looked before one moves it
    if jax.process_index() == 0:
      aside.parent.mkdir(exist_ok=True)
      shutil.move(str(self.directory / str(step)), aside)
    wait_for_all(f"checkpoint-{step}-moved")
    self.manager.reload()

  def kept(self) -> str:
    """The newest checkpoint, in words, for an error that stops the run."""
    last = self.manager.latest_step()
    if last is None:
      return "no checkpoint had been written"
    return f"the last good checkpoint, of step {last}, is kept in {self.directory}"

  def save(self, step: int, state) -> None:
    """Starts writing `state` (host arrays) in the background and returns. A disk without room
    for it, or a write before it that found its disk full, is an OSError on every process
    before anything is written: orbax's background writes would fail part-way."""
    if step in self.manager.all_steps():
      return
    try:
      self._wait()  # the write before this one is on disk: the free space is what is left
      failed = None
    except OSError as e:  # maybe on this process only: orbax writes some arrays on process 0
      failed = e
    needed = sum(x.nbytes for x in jax.tree.leaves(state))  # about its size on disk
    self.directory.mkdir(parents=True, exist_ok=True)  # by every process: none waits for another
    free = shutil.disk_usage(self.directory).free
    seen = np.array([failed is not None, -free], np.float32)  # what allgather carries
    if jax.process_count() > 1:  # all processes stop together, or none does
      seen = gather_processes(seen).max(axis=0)
    failed_anywhere, free = bool(seen[0]), -seen[1]  # the least free space of any process
    if failed_anywhere:
      raise failed or _disk_full(self.directory, "a checkpoint write failed on another process")
    if free < needed:
      raise _disk_full(
        self.directory,
        f"the checkpoint at step {step} takes about {needed / 1e6:.1f} MB, "
        f"{self.directory} has {free / 1e6:.1f} MB free",
      )
    self.manager.save(step, args=ocp.args.StandardSave(serialization.to_state_dict(state)))
    self.last_saved = time.monotonic()

  def _wait(self) -> None:
    """Waits for the write in flight; one that found its disk full is an OSError."""
    try:
      self.manager.wait_until_finished()
    except ValueError as e:
      if not (full := _DISK_FULL.search(str(e))):
        raise
      raise _disk_full(self.directory, "writing a checkpoint", int(full[1])) from e

  def close(self) -> None:
    """Waits for writes in flight to finish."""
    try:
      self._wait()
    finally:
      self.manager.close()


def steps_in(workdir: Path, step: int | None = None) -> int:
  """`step`, or the newest, of the checkpoints in `workdir`; a user error if there is none."""
  directory = Path(workdir).absolute() / "checkpoints"
  steps = sorted(int(p.name) for p in directory.glob("[0-9]*") if p.name.isdecimal())
  if not steps:
    raise UserError(f"{workdir} holds no checkpoint; train into it first (./launch.sh CONFIG)")
  if step is None:
    return steps[-1]
  if step not in steps:
    raise UserError(f"{workdir} holds no checkpoint of step {step}; it holds steps {steps}")
  return step


def read(workdir: Path, step: int | None = None, echo=print) -> tuple[int, dict]:
  """(step, the saved train state as nested dicts of host arrays) of `step`'s checkpoint in
  `workdir`, or of its newest readable one: an unreadable one is passed over with one warning
  line (`echo`), and nothing is moved (a reader changes nothing). A user error where there is
  none, or where `step`'s cannot be read (naming the readable steps)."""
  newest = steps_in(workdir, step)
  directory = Path(workdir).absolute() / "checkpoints"
  with ocp.CheckpointManager(directory, item_handlers=ocp.StandardCheckpointHandler()) as manager:
    candidates = (
      [newest] if step else sorted((s for s in manager.all_steps() if s <= newest), reverse=True)
    )
    unreadable = []
    for at in candidates:
      try:
        return at, jax.device_get(manager.restore(at, args=ocp.args.StandardRestore()))
      except Exception as e:  # orbax raises many types for damaged files  # noqa: BLE001
        unreadable.append(at)
        if not step:
          echo(f"warning: {_unreadable(directory, at, e)}; reading the one before it")
    readable = [s for s in manager.all_steps() if s not in unreadable and _readable(manager, s)]
  if not step:
    raise UserError(f"no checkpoint in {directory} is readable; train into a new --workdir")
  raise UserError(
    f"the checkpoint at step {step} in {directory} is unreadable ({_steps_said(readable)})"
    + ("; give one of those with --step, or none for the newest readable" if readable else "")
  )


def _unreadable(directory: Path, step: int, error: Exception) -> str:
  return (
    f"the checkpoint at step {step} in {directory} is unreadable ({type(error).__name__}: "
    f"{str(error)[:200]})"
  )


def _readable(manager, step: int) -> bool:
  """Whether `step`'s checkpoint's layout reads (its arrays are read when it is used)."""
  try:
    manager.item_metadata(step)
    return True
  except Exception:  # noqa: BLE001
    return False


def _steps_said(steps: list[int]) -> str:
  return f"readable: steps {', '.join(map(str, sorted(steps)))}" if steps else "none is readable"


def used_params(state: dict):
  """The weights a saved train state is used with: the EMA of its parameters where the run kept
  one (`ema_decay`), else its parameters."""
  ema = state.get("ema_params")
  return state["params"] if ema is None else ema
