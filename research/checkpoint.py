"""Checkpoints of the UNREPLICATED train state with orbax, written in the background.

Data order and augmentation are functions of (seed, step), so the step stored in the state
is the whole data position: a resumed run continues exactly where the saved one was, on any
number of devices.
"""

import shutil
from pathlib import Path

import ml_collections
import orbax.checkpoint as ocp
from flax import serialization


class Checkpoints:
  """Saves every `checkpoint_every_steps` into WORKDIR/checkpoints, keeping the newest `keep`."""

  def __init__(self, workdir: Path, config: ml_collections.ConfigDict, echo=print):
    self.every = config.checkpoint_every_steps
    self.directory = Path(workdir).absolute() / "checkpoints"
    self.echo = echo
    self.manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=config.keep_checkpoints, create=True, enable_async_checkpointing=True
      ),
    )

  def due(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def restore_latest(self, state):
    """`state` filled from the newest readable checkpoint, or `state` itself if there is none.

    An unreadable checkpoint (a crash mid-write, a damaged disk) is moved aside to
    checkpoints_unreadable/ — never deleted — and the one before it is used.
    """
    target = serialization.to_state_dict(state)
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
      except Exception as e:  # orbax raises many types for damaged files  # noqa: BLE001
        aside = self.directory.parent / "checkpoints_unreadable" / str(step)
        self.echo(
          f"warning: the checkpoint at step {step} is unreadable ({type(e).__name__}: "
          f"{str(e)[:200]}); moved it to {aside} and trying the one before it"
        )
        aside.parent.mkdir(exist_ok=True)
        shutil.move(str(self.directory / str(step)), aside)
        self.manager.reload()
        continue
      return serialization.from_state_dict(state, restored)
    return state

  def save(self, step: int, state) -> None:
    """Starts writing `state` (host arrays) in the background and returns."""
    if step not in self.manager.all_steps():
      self.manager.save(step, args=ocp.args.StandardSave(serialization.to_state_dict(state)))

  def close(self) -> None:
    """Waits for writes in flight to finish."""
    self.manager.wait_until_finished()
    self.manager.close()
