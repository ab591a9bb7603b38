"""Where a fine-tune starts: `config.init_from`, a run's workdir or one of its checkpoints.

The run's set-up `read`s the checkpoint before any data is loaded (a user error unless it
shares a parameter, by path and shape, with the model), and `apply` puts its parameters and
BatchNorm statistics into the fresh state wherever a path and shape match; the optimizer
state and step start fresh. A run of several points starts from one of them
(`init_from_seed`, `init_from_point`; a sweep's best by default).
"""

from pathlib import Path
from typing import NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from research import checkpoint, configuration, data, models
from research import sweep as sweep_lib
from research import workdir as workdir_lib
from research.errors import UserError

# What this module reads of a config (the set-up hands it a view of these, research/fields.py):
# where a fine-tune starts, and the stored examples' size its model is traced at.
READS = ("init_from", "init_from_step", "init_from_seed", "init_from_point", *data.STORED)


def locate(init_from: str, init_from_step: int) -> tuple[Path, int | None]:
  """(workdir, step or None for the newest) that `init_from` names (and `init_from_step`, 0:
  the newest); a user error unless it is a run's workdir with checkpoints, or one of its
  checkpoints."""
  workdir = Path(init_from).expanduser()
  step = init_from_step or None
  if workdir.parent.name == "checkpoints" and workdir.name.isdecimal():
    workdir, step = workdir.parent.parent, int(workdir.name)
  if not (workdir / "checkpoints").is_dir():
    raise UserError(
      f"init_from={init_from!r} is neither a run's workdir nor one of its checkpoints "
      "(WORKDIR/checkpoints/STEP); name the workdir of a finished run"
    )
  checkpoint.steps_in(workdir, step)  # a user error if it holds none, or not that step
  return workdir, step


class Source(NamedTuple):
  """The checkpoint a fine-tune starts from (`read`)."""

  name: str  # config.init_from, as given
  workdir: Path
  step: int
  state: dict  # the saved train state, host arrays
  point: str = ""  # of a run of several points, the one taken (its label)


def read(fields, augment, model) -> Source:
  """The checkpoint `fields.init_from` names (`fields`: READS), read before any data is
  loaded; a user error unless it shares a parameter (path and shape) with `model`, fed by
  `augment` (the run's)."""
  workdir, step = locate(fields.init_from, fields.init_from_step)
  step, saved = checkpoint.read(workdir, step)
  saved, point = _source_seed(fields, workdir, saved)
  saved = {
    **saved,
    "params": checkpoint.used_params(saved),
  }  # the EMA's weights, where the run kept one
  shape = data.stored_shape(fields)  # the model's input is made from stored examples of this shape
  if shape is None:  # a registered dataset's arrays, not loaded yet: the source's shape
    recorded = workdir_lib.last_recorded(workdir, "example_shape")
    shape = tuple(recorded) if recorded else (data.stored_size(fields), data.stored_size(fields), 3)
  example = jax.ShapeDtypeStruct((1, *shape), jnp.uint8)
  images = jax.eval_shape(augment, jax.random.key(0), example)
  init = lambda x: model.init(jax.random.key(0), x, **models.mode(model, False))
  shapes = jax.eval_shape(init, images)
  mine = traverse_util.flatten_dict(flax.core.unfreeze(shapes["params"]), sep="/")
  theirs = traverse_util.flatten_dict(saved["params"], sep="/")
  if not any(p in theirs and np.shape(theirs[p]) == leaf.shape for p, leaf in mine.items()):
    raise _fits_nothing(fields.init_from)
  return Source(fields.init_from, workdir, step, saved, point)


def _source_seed(fields, workdir: Path, saved: dict) -> tuple[dict, str]:
  """(the weights of `init_from`'s run, the label of the point they are; "" for one run):
  where it trained several points, of the one `fields.init_from_point` and `init_from_seed`
  name (`sweep.chosen_point`); by default a sweep's best, and a user error for a run of seeds."""
  runs = sweep_lib.runs_of(configuration.run_config(workdir))
  seeds = sweep_lib.run_seeds(runs)
  if not seeds:
    return saved, ""
  seed = fields.init_from_seed if fields.init_from_seed >= 0 else None
  point = fields.init_from_point or None
  if seed is None and point is None and not runs.swept:
    raise UserError(
      f"init_from={fields.init_from!r} trained seeds {seeds[0]}-{seeds[-1]}; choose the one to "
      "start from with --config.init_from_seed=N"
    )
  index = sweep_lib.chosen_point(workdir, runs, seed, point, f"init_from={fields.init_from!r}")
  return sweep_lib.one_point(saved, index), runs.labels[index]


def _fits_nothing(name: str) -> UserError:
  return UserError(
    f"init_from={name!r}: none of its parameters matches this model's by name and shape "
    "(another architecture?); start from a run of the same model"
  )


def apply(state, source: Source | None) -> tuple[object, dict | None]:
  """`state` with the params and BatchNorm statistics of `source` wherever a path and shape
  match (the optimizer state and step stay fresh), and a record of what was taken and what
  was initialised afresh; without a source, `state` as it is and None."""
  if source is None:
    return state, None
  saved = source.state
  taken, fresh = [], []
  merged = {}
  for collection in ("params", "batch_stats"):
    mine = traverse_util.flatten_dict(flax.core.unfreeze(getattr(state, collection)), sep="/")
    theirs = traverse_util.flatten_dict(saved.get(collection) or {}, sep="/")
    out = {}
    for path, value in mine.items():
      other = theirs.get(path)
      same = other is not None and np.shape(other) == np.shape(value)
      (taken if same else fresh).append(f"{collection}/{path}")
      out[path] = np.asarray(other, np.asarray(value).dtype) if same else value
    merged[collection] = traverse_util.unflatten_dict(out, sep="/")
  if not any(p.startswith("params/") for p in taken):  # shapes other than those traced
    raise _fits_nothing(source.name)
  record = {"source": str(source.workdir), "step": source.step, "taken": len(taken), "fresh": fresh}
  if source.point:
    record["point"] = source.point
  return state.replace(**merged), record


def describe(record: dict) -> str:
  """The line a fine-tune prints of what `apply` took (its record)."""
  fresh = record["fresh"]
  point = f", its point {record['point']}" if record.get("point") else ""
  line = (
    f"initialised from {record['source']} (step {record['step']}{point}): {record['taken']} "
    "arrays of params and BatchNorm statistics taken"
  )
  if fresh:
    names = ", ".join(fresh[:6]) + (f" and {len(fresh) - 6} more" if len(fresh) > 6 else "")
    line += f"; {len(fresh)} initialised afresh (another shape, or absent there): {names}"
  return line + "; optimizer state and step start fresh"
