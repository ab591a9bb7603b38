"""Several runs of one config in one program: the points of a sweep (`config.sweep`, values of
float fields) times its seeds (`config.seeds`), each trained as its single run would be.

The one-run step (research/steps.py) reads as if points did not exist; here its state gains a
leading point axis, and each point's step runs with its seed's keys and its fields' values,
which the compiled step takes as arguments (`hyper_values`): another sweep of the same
fields loads the program from the compilation cache (docs/sweeps.md).
"""

import itertools
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from research import optim
from research import workdir as workdir_lib
from research.errors import UserError
from research.fields import for_module, with_values

EXAMPLE = "--config.sweep='learning_rate=0.01,0.03,0.1;weight_decay=0,5e-4'"
# Fields whose 0 switches a part off rather than multiplying by 0: a point at 0 would differ
# from its single run, so a sweep takes no 0 for them (a group's learning rate 0 means the
# config's).
OFF_AT_ZERO = {
  "grad_clip_norm": "0 turns clipping off",
  "ema_decay": "0 turns the average off",
  "learning_rate": "0 means the config's",
}


# Float fields that size or time the run rather than set a step's arithmetic: constants of the
# program. Every other float field, the config's and each parameter group's (a fork's too),
# is an argument of the compiled step where it is not 0 (`hyper_values`), so that a run with
# another learning rate, weight decay, momentum, label smoothing or loss scalar loads the
# step from the compilation cache; a 0 stays a constant (it may drop a transformation).
STATIC_FLOATS = {
  "warmup_epochs", "lr_decay_epochs", "lr_decay_rate", "train_fraction", "eval_every_epochs",
  "checkpoint_every_epochs", "checkpoint_every_minutes", "log_every_seconds",
  "replicate_max_gb", "resident_max_gb", "synthetic_noise",
}  # fmt: skip


def hyper_values(config: ml_collections.ConfigDict) -> dict:
  """{field path: value} of the float fields the compiled step takes as arguments: the
  config's and its parameter groups' (`param_groups.NAME.FIELD`), non-zero, not STATIC_FLOATS;
  the learning rates only where every schedule is registered traced=True (optax's schedule
  constructors check their numbers in Python)."""
  fields = for_module(config, optim)
  length_traced = optim.length_traced(fields, optim.group_fields(fields))
  static = STATIC_FLOATS | (set() if length_traced else {"learning_rate"})
  taken = lambda name, v: isinstance(v, float) and v != 0 and name not in static
  values = {name: v for name, v in config.items() if taken(name, v)}
  for name, group in config.param_groups.items():
    values |= {f"param_groups.{name}.{k}": v for k, v in group.items() if taken(k, v)}
  return values


class Point(NamedTuple):
  """One run of a sweep: its seed and the values of the swept fields."""

  seed: int
  values: dict  # {field path: value}; {} where the run sweeps seeds alone


def parse(text: str) -> dict:
  """{field path: (values, ...)} of `config.sweep`: `FIELD=V1,V2,...`, fields apart by `;` (a
  grid of them all); "" sweeps nothing."""
  swept = {}
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, equals, values = (s.strip() for s in part.partition("="))
    try:
      numbers = tuple(float(v) for v in values.split(","))
    except ValueError:
      numbers = ()
    if not (equals and name and numbers):
      raise UserError(f"sweep={text!r}: {part!r} is not FIELD=V1,V2,... (numbers); e.g. {EXAMPLE}")
    if name in swept or len(set(numbers)) < len(numbers):
      raise UserError(f"sweep={text!r} names {name!r} or one of its values twice; name each once")
    swept[name] = numbers
  return swept


def check(config: ml_collections.ConfigDict) -> dict:
  """The swept fields (`parse`), each a float field the compiled step takes as an argument; a
  user error naming the field and why it cannot be swept."""
  swept = parse(config.get("sweep", ""))
  eligible = hyper_values(with_values(config, {p: 1.0 for p in _floats(config)}))
  for path, values in swept.items():
    why = _unsweepable(config, path, eligible)
    name = path.rsplit(".", 1)[-1]
    if not why and name in OFF_AT_ZERO and 0 in values and (name != "learning_rate" or "." in path):
      why = f"{OFF_AT_ZERO[name]}, which is another program: sweep values other than 0"
    if why:
      raise UserError(f"sweep: {path} cannot be swept: {why}")
  names = labels(config)
  if len(set(names)) < len(names):  # labels name the points: in records, --point, TensorBoard
    raise UserError(
      f"sweep={config.sweep!r} has values that print alike ({', '.join(names)}); give values "
      "that differ in their first 6 significant digits"
    )
  return swept


def _floats(config) -> list[str]:
  """The paths of the config's float fields and its parameter groups'."""
  paths = [k for k, v in config.items() if isinstance(v, float)]
  for group, fields in config.param_groups.items():
    paths += [f"param_groups.{group}.{k}" for k, v in fields.items() if isinstance(v, float)]
  return paths


def _unsweepable(config, path: str, eligible: dict) -> str:
  """Why the field at `path` cannot be swept ("" where it can)."""
  if path in ("seed", "seeds"):
    return "seeds are the sweep's other axis: use --config.seeds=N (seeds seed, seed + 1, ...)"
  *parents, name = path.split(".")
  if parents and (parents[0] != "param_groups" or len(parents) != 2):
    return (
      "only the config's own float fields and its parameter groups' (param_groups.GROUP.FIELD) "
      "are arguments of the step; the model's fields shape its program: launch a run per value"
    )
  node = config.param_groups.get(parents[1]) if parents else config
  if node is None:
    return f"the config has no parameter group {parents[1]!r}"
  if name not in node:
    inherited = parents and name in config
    return (
      f"the group does not set {name}, it takes the config's: set it in the group, or sweep "
      f"{name} itself"
      if inherited
      else "the config has no such field (a parameter group's: param_groups.GROUP.FIELD)"
    )
  if isinstance(node[name], str):
    return "it is a string field, and strings cannot be swept: launch a run per value"
  if not isinstance(node[name], float):
    kind = type(node[name]).__name__
    article = "an" if kind[0] in "aeiou" else "a"
    return f"it is {article} {kind} field; only float fields are arguments of the compiled step"
  if name in STATIC_FLOATS:
    return "it sizes or times the run, a constant of the program: launch a run per value"
  if path not in eligible:  # the learning rates, where a schedule takes its numbers in Python
    return "a schedule of this run is built in Python from it (schedules registered traced=False)"
  return ""


def points_of(config) -> tuple:
  """The runs `config` trains in one program: every combination of the swept values (the first
  field's slowest), each with the seeds seed, seed + 1, ... (`config.seeds` of them)."""
  swept = parse(config.get("sweep", ""))
  seeds = range(config.seed, config.seed + config.get("seeds", 1))
  grid = [dict(zip(swept, combo, strict=True)) for combo in itertools.product(*swept.values())]
  return tuple(Point(seed, values) for values in grid for seed in seeds)


class Runs(NamedTuple):
  """The runs a config trains in one program, as its records name them (`runs_of`)."""

  points: tuple  # points_of
  labels: tuple  # each point's label
  swept: bool  # a sweep of fields (not seeds alone)

  @property
  def seeds(self) -> tuple:
    """Each point's seed, in the points' order (a seed repeats across a sweep's values)."""
    return tuple(point.seed for point in self.points)


def runs_of(config) -> Runs:
  """`config`'s runs: its points, their labels and whether it sweeps fields."""
  return Runs(points_of(config), labels(config), sweeps_fields(config))


def sweeps_fields(config) -> bool:
  """Whether the run sweeps more than seeds (`config.sweep` names a field)."""
  return bool(parse(config.get("sweep", "")))


def label(point: Point, several_seeds: bool) -> str:
  """`learning_rate=0.03`, with `,seed=S` where the run has several seeds; `seed=S` alone for
  a run that sweeps seeds only."""
  parts = [f"{path}={value:g}" for path, value in point.values.items()]
  if several_seeds or not parts:
    parts.append(f"seed={point.seed}")
  return ",".join(parts)


def labels(config) -> tuple:
  """Each point's `label`, in order."""
  several = config.get("seeds", 1) > 1
  return tuple(label(point, several) for point in points_of(config))


def columns(config) -> dict:
  """What a record names its points by: {} for one run; {"seed": [...]} for a run of seeds;
  for a sweep {"point": labels, "seed": [...], "swept": {FIELD: [each point's value], ...}}."""
  points = points_of(config)
  if len(points) == 1:
    return {}
  seeds = {"seed": [point.seed for point in points]}
  swept = parse(config.get("sweep", ""))
  if not swept:
    return seeds
  values = {path: [point.values[path] for point in points] for path in swept}
  return {"point": list(labels(config)), **seeds, "swept": values}


def structure(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with each swept field at its first non-zero value: the program's layout (the
  transformations a 0 would leave out are built, and a point at 0 runs them with 0)."""
  swept = parse(config.get("sweep", ""))
  return with_values(config, {p: next((v for v in vs if v), 0.0) for p, vs in swept.items()})


def point_config(config: ml_collections.ConfigDict, point: Point) -> ml_collections.ConfigDict:
  """The config of `point`'s single run."""
  single = with_values(config, point.values)
  single.update(seed=point.seed, seeds=1, sweep="")
  return single


def hyper(config: ml_collections.ConfigDict) -> dict:
  """The float fields the compiled step takes as arguments (`hyper_values` of `structure`),
  a swept one as float32 [points] (its value at each point) where there are several."""
  points = points_of(config)
  values = {path: np.float32(v) for path, v in hyper_values(structure(config)).items()}
  for path in parse(config.get("sweep", "")):
    if path in values:
      each = np.asarray([point.values[path] for point in points], np.float32)
      values[path] = each if len(points) > 1 else each[0]
  return values


def logged_schedules(config, per_epoch: int, num_steps: int, groups: dict) -> dict:
  """{record field: step -> the learning rate the optimizer applies} (optim.logged_schedules);
  in a sweep, each point's [points], as its single run logs it."""
  if not sweeps_fields(config):
    return optim.logged_schedules(for_module(config, optim), per_epoch, num_steps, groups)
  each = []
  for point in points_of(config):
    single = for_module(point_config(config, point), optim)
    each.append(optim.logged_schedules(single, per_epoch, num_steps, optim.group_fields(single)))
  return {name: lambda step, n=name: jnp.stack([s[n](step) for s in each]) for name in each[0]}


def point_part(batch, batch_axes, index: int, axis: int = 0):
  """Point `index`'s part of `batch`: the parts whose `batch_axes` (as `each_point` takes them)
  is 0 indexed at `axis` (0 inside the pmap, 1 for a pmapped batch [devices, points, ...]);
  the parts with None (the data, shared by the points) as they are."""
  at = (slice(None),) * axis + (index,)
  part = lambda point_axis, x: jax.tree.map(lambda a: a[at], x) if point_axis == 0 else x
  return jax.tree.map(part, batch_axes, batch, is_leaf=lambda a: a is None)


def each_point(train_step, points, batch_axes, *, vectorized: bool = False):
  """`train_step` for `len(points)` runs at once: the state has a leading point axis, and so has
  each part of the batch whose `batch_axes` (a vmap in_axes prefix of the batch) is 0 (the data
  order); the parts with None (the data itself) are shared. Each point's step draws from its
  seed's keys, the step's and its examples' own, and takes its own values of the swept fields
  (`hyper`'s arrays [points]), as its single run would.

  `vectorized`: the points' steps are one batched computation (`jax.vmap`; collectives batch
  over the points, each averaged apart); else (`seeds_mode="unroll"`, the default) each point's
  step is traced apart in the program, as the step's micro-batches are: the single step's
  kernels, which XLA may run side by side; the compile grows with the points. docs/sweeps.md
  measures both, on a CPU and a GPU."""
  seeds = np.asarray([point.seed for point in points], np.int32)

  def step(state, batch, horizon=None, hyper=None):
    hyper = hyper or {}
    hyper_axes = {path: 0 if jnp.ndim(v) else None for path, v in hyper.items()}

    def one(state, batch, seed, hyper):
      return train_step(state, batch, horizon, seed, hyper)

    if vectorized:
      return jax.vmap(one, in_axes=(0, batch_axes, 0, hyper_axes))(state, batch, seeds, hyper)
    states = unstack(state, len(points))
    outs = [
      one(states[i], point_part(batch, batch_axes, i), seed, point_part(hyper, hyper_axes, i))
      for i, seed in enumerate(seeds)
    ]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

  return step


def stack(trees):
  """Trees of the same structure as one with a leading axis (point i at index i), on the host."""
  return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def unstack(tree, count: int) -> list:
  """`stack`'s inverse: the `count` trees along the leading axis."""
  return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(count)]


def run_seeds(runs) -> tuple:
  """The seeds `runs` (sweep.runs_of) trained in one program, a point each; () for one run."""
  return runs.seeds if len(runs.points) > 1 else ()


def one_point(tree, index: int):
  """Point `index`'s part of a tree a run of several points saved (seeds, a sweep's: every leaf
  with a leading point axis), `index` as `chosen_point` gives it."""
  return jax.tree.map(lambda x: x[index], tree)


def chosen_point(workdir: Path, runs, seed=None, point=None, what: str = "") -> int | None:
  """The index of the point a run of `runs` (sweep.runs_of) is used at: the one `point` (its
  label as the run printed it, `learning_rate=0.03,seed=1`; a part of it that one point
  matches; or its index) and `seed` name; where neither does, a sweep's best (its last eval's
  `best_point`), and for a run of seeds None (all: their ensemble). None for one run. A user
  error naming `what` for a point or seed the run did not train, or a choice that fits
  several."""
  points, labels = runs.points, runs.labels
  several = len(points) > 1
  if point is not None and point.isdigit():
    if int(point) >= len(points):
      raise UserError(f"{what} point={point}: the run trained points 0-{len(points) - 1}")
    return int(point) if several else None
  if seed is None and point is None:
    return _best_point(workdir, labels) if several and runs.swept else None
  chosen = range(len(points))
  if seed is not None:
    chosen = [i for i in chosen if points[i].seed == seed]
    if not chosen:
      seeds = sorted({p.seed for p in points})
      raise UserError(
        f"{what} seed={seed}: the run trained seed{'s' if len(seeds) > 1 else ''} "
        f"{', '.join(map(str, seeds))}; choose one of those"
      )
  if point is not None:
    chosen = [i for i in chosen if _matches(point, labels[i])]
  if len(chosen) != 1:
    named = ", ".join(f"{k}={v}" for k, v in (("point", point), ("seed", seed)) if v is not None)
    found = "matches none" if not chosen else f"matches {len(chosen)}"
    listed = labels if not chosen else [labels[i] for i in chosen]
    raise UserError(
      f"{what} {named} {found} of the run's points ({', '.join(listed)}); name one (--point)"
    )
  return chosen[0] if several else None


def _matches(wanted: str, label: str) -> bool:
  """Whether every FIELD=VALUE of `wanted` is one of `label`'s (values compared as numbers)."""
  pairs = lambda text: dict(part.partition("=")[::2] for part in text.split(","))
  theirs = pairs(label)
  try:
    return all(k in theirs and float(theirs[k]) == float(v) for k, v in pairs(wanted).items())
  except ValueError:
    return False


def _best_point(workdir: Path, labels: tuple) -> int:
  """The index of a sweep's best point: its last eval record's `best_point`."""
  records = workdir_lib.records(workdir / "metrics.jsonl")
  best = [r["best_point"] for r in records if "eval_accuracy" in r and "best_point" in r]
  if not best or best[-1] not in labels:
    raise UserError(
      f"{workdir} swept {len(labels)} points and records no eval yet to choose the best by; "
      f"name one with --point (one of {', '.join(labels)})"
    )
  return labels.index(best[-1])
