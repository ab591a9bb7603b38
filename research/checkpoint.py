"""Checkpoints of the UNREPLICATED train state with orbax, saved asynchronously.

Data order and augmentation are functions of (seed, step), so the step stored in the state
is the whole data position: a resumed run continues exactly where the saved one was.
"""

from pathlib import Path

import ml_collections
import orbax.checkpoint as ocp
from flax import serialization


class Checkpoints:
  """Saves every `checkpoint_every_steps` into WORKDIR/checkpoints, keeping the newest `keep`."""

  def __init__(self, workdir: Path, config: ml_collections.ConfigDict, keep: int):
    self.every = config.checkpoint_every_steps
    self.manager = ocp.CheckpointManager(
      Path(workdir).absolute() / "checkpoints",
      options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=True
      ),
    )

  def due(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def restore_latest(self, state):
    """Returns `state` filled from the newest checkpoint, or `state` itself if there is none."""
    step = self.manager.latest_step()
    if step is None:
      return state
    target = serialization.to_state_dict(state)
    restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
    return serialization.from_state_dict(state, restored)

  def save(self, step: int, state) -> None:
    """Starts writing `state` (host numpy arrays) in the background; returns at once."""
    if step not in self.manager.all_steps():
      self.manager.save(step, args=ocp.args.StandardSave(serialization.to_state_dict(state)))

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
