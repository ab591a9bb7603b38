"""Every check of a training config that needs neither its data nor a compile, in one place.

`train_config` runs before anything is loaded, compiled or written (setup.setup calls it, and
the scaling report, tools/scaling.py, before its first run), so a mistake costs one `error:` line.
Checks that need more live where that is known: shard sizes and class counts with the data,
the profile window against the resumed step (progress.Profiler), the checkpoint's layout.
"""

import re
from collections.abc import Callable
from typing import NamedTuple

import ml_collections

from research import augment as augment_lib
from research import (
  configuration,
  data,
  environment,
  losses,
  metrics,
  models,
  optim,
  schedules,
  steps,
  sweep,
)
from research import fields as fields_lib
from research.augment import Pipeline
from research.data import PLACEMENTS, check_num_classes
from research.errors import UserError
from research.fields import DTYPES, for_module, of_part

# (field, smallest allowed value): integer fields whose lower bound is not obvious from use.
INT_FIELDS = (
  ("batch_size", 1),
  ("eval_batch_size", 1),
  ("log_every_steps", 1),
  ("eval_every_steps", 0),
  ("checkpoint_every_steps", 0),
  ("lost_process_after_sec", 1),
  ("keep_checkpoints", 1),
  ("data_workers", 0),
  ("prefetch", 1),
  ("host_image_size", 1),
  ("micro_batch_size", 0),
  ("steps_per_call", 1),
  ("seed", 0),
  ("seeds", 1),
  ("init_from_step", 0),
  ("init_from_seed", -1),
)
# Numeric fields with a valid range: (field, the range in words, the test).
RANGES = (
  ("learning_rate", "> 0", lambda x: x > 0),
  ("lr_batch_size", ">= 0 (0: no scaling)", lambda x: x >= 0),
  ("warmup_epochs", ">= 0", lambda x: x >= 0),
  ("lr_decay", ">= 0", lambda x: x >= 0),
  ("lr_decay_rate", "in (0, 1]", lambda x: 0 < x <= 1),
  ("lr_decay_epochs", "> 0", lambda x: x > 0),
  ("momentum", "in [0, 1)", lambda x: 0 <= x < 1),
  ("rms_decay", "in [0, 1)", lambda x: 0 <= x < 1),
  ("rms_eps", "> 0", lambda x: x > 0),
  ("weight_decay", ">= 0", lambda x: x >= 0),
  ("grad_clip_norm", ">= 0 (0: off)", lambda x: x >= 0),
  ("label_smoothing", "in [0, 1)", lambda x: 0 <= x < 1),
  ("ema_decay", "in [0, 1) (0: off)", lambda x: 0 <= x < 1),
  ("aux_loss_weight", ">= 0", lambda x: x >= 0),
  ("resident_max_gb", "> 0", lambda x: x > 0),
  ("replicate_max_gb", ">= 0", lambda x: x >= 0),
  ("synthetic_train_size", ">= 1", lambda x: x >= 1),
  ("synthetic_test_size", ">= 1", lambda x: x >= 1),
  ("synthetic_image_size", ">= 1", lambda x: x >= 1),
  ("synthetic_noise", ">= 0", lambda x: x >= 0),
  ("log_every_seconds", "> 0", lambda x: x > 0),
  ("checkpoint_every_minutes", ">= 0 (0: off)", lambda x: x >= 0),
  ("eval_every_epochs", ">= 0 (0: off)", lambda x: x >= 0),
  ("checkpoint_every_epochs", ">= 0 (0: off)", lambda x: x >= 0),
)

# The same for the model kind's own fields; a model checks those it declares itself
# (`register(..., check=)`, research/registry.py).
MODEL_RANGES = (("num_classes", ">= 2", lambda x: x >= 2),)


def whole_number(config, field: str, minimum: int) -> None:
  value = config[field]
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise UserError(f"{field}={value!r} must be a whole number >= {minimum}")


def batch_sizes(config, n_devices: int) -> int:
  """The per-device batch; a user error unless both (positive: INT_FIELDS) batches divide
  over `n_devices`."""
  for field in ("batch_size", "eval_batch_size"):
    value = config[field]
    if value % n_devices:
      below, above = value // n_devices * n_devices, (value // n_devices + 1) * n_devices
      near = " or ".join(str(m) for m in (below, above) if m > 0)
      raise UserError(
        f"{field}={value} is not divisible by the {n_devices} devices; "
        f"use a multiple of {n_devices} (e.g. {near})"
      )
  return config.batch_size // n_devices


GROUP_RANGES = (
  ("learning_rate", ">= 0 (0: the config's)", lambda x: x >= 0),
  ("weight_decay", ">= 0", lambda x: x >= 0),
  ("momentum", "in [0, 1)", lambda x: 0 <= x < 1),
  ("train_fraction", "in (0, 1]", lambda x: 0 < x <= 1),
)


def _param_groups(config) -> dict:
  """Each parameter group's fields (research/optim.py); whether each matches a parameter is
  checked when the optimizer first sees the parameters (optim.labels, in setup.setup)."""
  groups = optim.group_fields(for_module(config, optim))
  for name, fields in groups.items():
    try:
      re.compile(fields.match)
    except (re.error, TypeError) as e:
      raise UserError(f"param_groups.{name}.match={fields.match!r} is not a regex: {e}") from None
    field = f"param_groups.{name}.optimizer"
    optim.OPTIMIZERS.get(fields.optimizer, config.modules, field)
    fields_lib.in_ranges(fields, GROUP_RANGES, prefix=f"param_groups.{name}.")
    schedules.SCHEDULES.get(fields.schedule, config.modules, f"param_groups.{name}.schedule")
  return groups


class Checked(NamedTuple):
  """What checking a training config builds: the per-device batch, the two pipelines
  (parsing them is how they are checked) and the parameter groups' fields, handed on so
  nothing is built twice."""

  per_device_batch: int
  augment: Pipeline  # research/augment.py: the config's augmentation
  eval_preprocess: Pipeline
  groups: dict  # optim.group_fields: {group name: its fields}
  metrics: tuple = ()  # research/metrics.py shapes: ((eval metric, its value's shape, it), ...)
  notes: tuple = ()  # what the run says of its config first (configuration.unused)


def train_config(config: ml_collections.ConfigDict, n_devices: int) -> Checked:
  """Checks every field of a training config (after importing its `modules`, whose parts'
  declared fields it adds: configuration.complete), each field's owner first."""
  configuration.import_modules(config)
  configuration.complete(config)
  configuration.check_owned(config)
  _data(config)
  _numbers(config)
  _parts(config)
  augment, eval_preprocess = _pipelines(config)
  groups = _param_groups(config)
  _own_checks(config, groups)
  _sweep(config)
  eval_metrics = metrics.shapes(config.eval_metrics, config.model.num_classes, config)
  per_device_batch = _per_device_batch(config, n_devices, augment)
  notes = tuple(configuration.unused(config))
  return Checked(per_device_batch, augment, eval_preprocess, groups, eval_metrics, notes)


def _data(config) -> None:
  """The dataset and its placement, and the model's classes where the dataset's are known."""
  data.check_name(config.dataset, config.modules)
  fields_lib.one_of("data_placement", config.data_placement, PLACEMENTS)
  if classes := data.known_classes(config.dataset):
    check_num_classes(config.dataset, classes, config.model.num_classes)
  if config.dataset == "synthetic" and config.data_dir:
    raise UserError(
      f"data_dir={config.data_dir!r} is set but dataset='synthetic' reads no files; to train "
      "on it, pass --config.dataset=folder (an image folder) or cifar10 (the archive)"
    )


def _numbers(config) -> None:
  """Every number's type and range, the run's length, the dtype and the profile window."""
  for field, minimum in INT_FIELDS:
    whole_number(config, field, minimum)
  fields_lib.in_ranges(config, RANGES)
  if config.num_train_steps == 0 or config.num_train_steps < -1:
    raise UserError(
      f"num_train_steps={config.num_train_steps} must be -1 (num_epochs decides) or >= 1"
    )
  if config.num_train_steps == -1 and config.num_epochs < 1:
    raise UserError(
      f"num_epochs={config.num_epochs} with num_train_steps={config.num_train_steps} trains "
      "nothing; set num_epochs >= 1 or num_train_steps > 0"
    )
  aliases = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "fp32": "float32",
    "fp64": "float64",
  }
  for field in ("dtype", *(["param_dtype"] if "param_dtype" in config.model else [])):
    dtype = config.model[field]
    if dtype not in DTYPES:
      hint = f"; say {aliases[dtype]!r}" if dtype in aliases else ""
      raise UserError(f"model.{field}={dtype!r} is not one of {', '.join(DTYPES)}{hint}")
  fields_lib.in_ranges(config.model, MODEL_RANGES, "model.")
  profile = tuple(config.profile_steps)
  if profile and not (
    len(profile) == 2 and all(isinstance(s, int) for s in profile) and 1 <= profile[0] < profile[1]
  ):
    raise UserError(
      f"profile_steps={profile} must be () or (start, stop) with 1 <= start < stop, e.g. (10, 15)"
    )
  fields_lib.one_of("loss_reduction", config.loss_reduction, ("mean", "sum"))
  fields_lib.one_of("seeds_mode", config.seeds_mode, ("unroll", "vmap"))
  fields_lib.one_of("batch_norm_statistics", config.batch_norm_statistics, ("global", "per_device"))


# The kinds of part the compiled step calls, each with a sweep's traced values.
TRACED = ("loss", "optimizer", "schedule", "train step")


def _swept_in_the_step(config) -> None:
  """A user error for a swept field that no part of the compiled step reads (a dataset's, an
  eval metric's, or a part's this run does not name): every point would train alike."""
  read = set(fields_lib.library())
  for registry, name in configuration.named(config):
    read |= set(registry.declared.get(name, {})) if registry.kind in TRACED else set()
  for path in sweep.parse(config.get("sweep", "")):
    if "." not in path and path not in read:  # a group's fields: its optimizer's, schedule's
      owner = configuration.owners().get(path, "no part")
      raise UserError(
        f"sweep: {path} cannot be swept: {owner} reads it, outside the compiled step, so every "
        "point would train alike; launch a run per value"
      )


def _sweep(config) -> None:
  """The swept fields (research/sweep.py), each point's numbers in their ranges, and the plot
  a sweep ends with."""
  if not sweep.check(config):
    return
  _swept_in_the_step(config)
  environment.check({"matplotlib": "matplotlib"})  # WORKDIR/sweep.png
  for point in sweep.points_of(config):
    single = sweep.point_config(config, point)
    try:
      fields_lib.in_ranges(single, RANGES)
      _own_checks(single, _param_groups(single))
    except UserError as e:
      raise UserError(
        f"sweep={config.sweep!r}, its point {sweep.label(point, False)}: {e}"
      ) from None


def _parts(config) -> None:
  """Every part the config names by name is registered (a fork's: in its `modules`)."""
  models.MODELS.get(config.model.name, config.modules)
  steps.STEPS.get(config.step, config.modules)
  if isinstance(config.eval_metrics, str):
    raise UserError(
      f"eval_metrics={config.eval_metrics!r} must be a tuple of names, e.g. ('top5',)"
    )
  for name in config.eval_metrics:
    metrics.EVAL_METRICS.get(name, config.modules)
  losses.LOSSES.get(config.loss, config.modules)
  schedules.SCHEDULES.get(config.schedule, config.modules)
  optim.OPTIMIZERS.get(config.optimizer, config.modules)
  if optim.OPTIMIZERS.options[config.optimizer].get("groups_only"):
    raise UserError(
      f"optimizer={config.optimizer!r} is for parameter groups (param_groups.NAME.optimizer); "
      "the config's own optimizer is one of "
      + ", ".join(
        n for n in optim.OPTIMIZERS.names() if not optim.OPTIMIZERS.options[n].get("groups_only")
      )
    )


def _own_checks(config, groups: dict) -> None:
  """Each part the config names checks the fields it declared, in the view it is given
  (`Registry.check`): the model its sub-config's, a parameter group's optimizer and schedule
  the group's, the others the config's."""
  for registry, name in configuration.named(config):
    source, prefix = (config.model, "model.") if registry.kind == "model" else (config, "")
    registry.check(name, of_part(registry, name, source, prefix))
  for group, fields in groups.items():
    parts = (optim.OPTIMIZERS, fields.optimizer), (schedules.SCHEDULES, fields.schedule)
    for registry, name in parts:
      registry.check(name, of_part(registry, name, fields, f"param_groups.{group}."))


def _pipelines(config) -> tuple[Callable, Callable]:
  """(augment, eval_preprocess), built: parsing them is how they are checked; and the two map
  pixel values alike."""
  augment = augment_lib.build(config.augment, config.seed)
  if augment.weights:
    raise UserError(f"augment={config.augment!r} ends in a views op; views are for eval_preprocess")
  eval_preprocess = augment_lib.build(config.eval_preprocess, config.seed)
  if eval_preprocess.mixes:
    raise UserError(
      f"eval_preprocess={config.eval_preprocess!r} mixes examples; mixup and cutmix are for "
      "augment (training) only"
    )
  if augment.values != eval_preprocess.values:
    raise UserError(
      f"augment={config.augment!r} maps pixel values by {augment.values} but eval_preprocess="
      f"{config.eval_preprocess!r} by {eval_preprocess.values}, so the eval would see values "
      "the model never trained on; end both with the same value ops "
      f"({', '.join(sorted(augment_lib.VALUE_OPS))})"
    )
  return augment, eval_preprocess


def _per_device_batch(config, n_devices: int, augment) -> int:
  """The per-device batch: both batches divide over the devices, a mixing augmentation gets
  an even one, and the micro-batch divides it."""
  per_device_batch = batch_sizes(config, n_devices)
  if augment.mixes and per_device_batch % 2:
    raise UserError(
      f"augment={config.augment!r} mixes each example with its neighbour (positions 2i and "
      f"2i + 1 of the global batch), which needs an even batch on each device, not "
      f"{per_device_batch} (batch_size={config.batch_size} over {n_devices} devices); choose a "
      "batch_size that gives each device an even number"
    )
  if per_device_batch % max(1, config.micro_batch_size):
    raise UserError(
      f"micro_batch_size={config.micro_batch_size} does not divide the {per_device_batch} "
      f"examples per device (batch_size={config.batch_size} over {n_devices} devices); "
      "use a divisor of it, or 0 for auto"
    )
  return per_device_batch
