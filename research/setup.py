"""A run built from its config, each part once, before its first step: the config checked,
the model, the data (resident or streamed), the optimizer, the initial state and the train step
for ONE device. Nothing is written here; research/train.py compiles the step and runs the loop.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from research import data, init_from, losses, models, optim, steps, validate
from research import inputs as inputs_lib
from research import sweep as sweep_lib
from research.augment import Pipeline
from research.errors import UserError
from research.fields import for_module, of_part, reading
from research.inputs import Inputs
from research.steps import AXIS, TrainState, create_train_state


@dataclasses.dataclass
class Training:
  """Everything a run needs before its first step; `setup` builds each part once."""

  inputs: Inputs
  # the runs trained in one program (research/sweep.py): each point's seed (config.seed,
  # config.seed + 1, ...; repeated across a sweep's values), and what its records name each
  # point by (sweep.columns; {} for one run)
  seeds: tuple
  columns: dict
  # unreplicated, on the host: checkpoints and logging use this copy; with several points,
  # every leaf has a leading point axis
  state: TrainState
  from_data: "FromData | None"  # state -> state with the parameters the model takes from data
  # steps.train_step for ONE device, all but (state, batch, horizon, seed, hyper) bound
  # (several points: sweep.each_point, without a seed); without a horizon its schedules end
  # at num_steps, without a seed its keys are the config's seed's: constants of the program.
  # Traced, a model that names an axis the step lacks is a user error (steps.axis_checked).
  train_step: Callable
  # [(step count, train_step)]: from that step on, the step that no longer differentiates the
  # parameter groups whose learning rate stays 0 from there (optim.frozen_from): the same
  # parameters, less work; compiled with the first, before the clock
  later_steps: tuple
  augment: Pipeline  # the config's augmentation (research/augment.py)
  schedules: dict  # {record field: step -> the learning rate the optimizer applies}
  num_steps: int
  per_device_batch: int
  run: steps.Run  # the step's pieces, bound once (one point's: the step of several wraps it)
  eval_every: int  # steps between periodic evals (0: at the end only)
  checkpoint_every: int  # steps between checkpoints (0: by time and at the end only)
  warm_up: bool  # the compiled step and eval run once, results discarded, before the clock
  started_from: dict | None  # what the state took from `init_from` (None: from scratch or resumed)
  steps_per_call: int = 1  # steps one call of the compiled program runs (a lax.scan)
  # {field path: value}: the float fields the compiled step takes as an argument
  # (sweep.hyper_values): a run with other values loads it from the compilation cache
  hyper: dict = dataclasses.field(default_factory=dict)
  model_name: str = ""  # config.model.name: in what the run says of its model
  loss_fields: tuple = ()  # the fields the training loss reads (a sweep's plot says so)
  notes: tuple = ()  # what the run says of its config before it trains (configuration.unused)
  batch_size: int = 0  # global
  per_device_statistics: bool = False  # batch_norm_statistics="per_device": said in its header

  @property
  def micro_batch(self) -> int:
    """Examples per forward/backward pass on each device."""
    return self.run.micro_batch


def setup(config: ml_collections.ConfigDict, fine_tune: bool = False) -> Training:
  """Checks `config`, opens its data and builds the initial state and the step; writes nothing.
  `fine_tune`: the state starts from `config.init_from`'s checkpoint (checked before any data
  is loaded). Each part and module is handed its fields (research/fields.py), not the config."""
  checked = validate.train_config(config, jax.device_count())  # before any data is loaded
  hyper = sweep_lib.hyper(config)  # the values each point takes, arguments of the step
  if sweep_lib.sweeps_fields(config):  # a sweep's program: every transformation it needs
    config = sweep_lib.structure(config)
    checked = checked._replace(groups=optim.group_fields(for_module(config, optim)))
  model = models.create(config.model, batch_norm_axis(config.batch_norm_statistics))
  reads = for_module(config, init_from)  # the stored examples' size, init_from's fields
  stored = data.stored_shape(reads)  # None: the arrays'
  if stored:  # before any image is decoded
    _check_outputs(config.model, model, checked.augment, stored)
  source = init_from.read(reads, checked.augment, model) if fine_tune else None
  runs = sweep_lib.runs_of(config)
  inputs = inputs_lib.for_run(for_module(config, inputs_lib), checked, runs)
  if not stored:  # a registered dataset's arrays, loaded
    _check_outputs(config.model, model, checked.augment, inputs.example_shape)
  per_epoch = inputs.steps_per_epoch
  num_steps = (
    config.num_train_steps if config.num_train_steps > 0 else config.num_epochs * per_epoch
  )
  tx = optim.create_optimizer(for_module(config, optim), per_epoch, num_steps, checked.groups)
  seeds = runs.seeds
  state, started_from = _first_state(
    seeds, config.ema_decay > 0, model, inputs, checked.augment, tx, source
  )
  train_step, run = build_step(config, checked, inputs, state)
  switches = steps.STEPS.options[config.step].get("optimizer_only")  # steps.register
  frozen = optim.frozen_from(config.grad_clip_norm, checked.groups, num_steps) if switches else {}
  later_steps = tuple(  # once a group's learning rate stays 0, a step without its gradient
    (at, build_step(config, checked, inputs, state, names)[0]) for at, names in frozen.items()
  )
  eval_every, checkpoint_every = _periods(reading(config, PERIODS, __name__), inputs, num_steps)
  return Training(
    inputs=inputs,
    seeds=seeds,
    columns=sweep_lib.columns(config),
    state=state,
    from_data=_from_data(config.model, inputs, checked.eval_preprocess.first_view, seeds),
    train_step=train_step,
    later_steps=later_steps,
    augment=checked.augment,
    schedules=sweep_lib.logged_schedules(config, per_epoch, num_steps, checked.groups),
    num_steps=num_steps,
    per_device_batch=checked.per_device_batch,
    run=run,
    eval_every=eval_every,
    checkpoint_every=checkpoint_every,
    warm_up=config.warm_up,
    started_from=started_from,
    steps_per_call=config.steps_per_call,
    hyper=hyper,
    model_name=config.model.name,
    loss_fields=losses.reads(config.loss),
    notes=checked.notes,
    batch_size=config.batch_size,
    per_device_statistics=config.batch_norm_statistics == "per_device",
  )


# What `_periods` reads of the config: when the run logs, evaluates, checkpoints and profiles.
PERIODS = (
  "steps_per_call", "log_every_steps", "eval_every_steps", "eval_every_epochs",
  "checkpoint_every_steps", "checkpoint_every_epochs", "profile_steps",
)  # fmt: skip


def _periods(fields, inputs: Inputs, num_steps: int) -> tuple[int, int]:
  """(steps between evals, steps between checkpoints) of a run (`fields`: PERIODS); a user
  error unless its `steps_per_call` steps make whole calls of it: resident data (a call's steps
  share their batch: the data and the epoch's order), an epoch, the run, and every step
  something happens after (a log line, an eval, a checkpoint, a profile's ends)."""
  per_epoch, k = inputs.steps_per_epoch, fields.steps_per_call
  eval_every = every_steps(fields.eval_every_steps, fields.eval_every_epochs, per_epoch)
  save_every = every_steps(fields.checkpoint_every_steps, fields.checkpoint_every_epochs, per_epoch)
  if k == 1:
    return eval_every, save_every
  if inputs.first_images is None:  # streamed: each step its own decoded batch
    raise UserError(
      f"steps_per_call={k} needs data resident on the devices; {inputs.name} streams (use "
      "data_placement='resident', or steps_per_call=1)"
    )
  window = tuple(fields.profile_steps)
  counts = {
    "an epoch's steps": per_epoch,
    "the run's steps": num_steps,
    "log_every_steps": fields.log_every_steps,
    "the steps between evals": eval_every,
    "the steps between checkpoints": save_every,
    **({"profile_steps' first step - 1": window[0] - 1, "its last": window[1]} if window else {}),
  }
  if wrong := [f"{name} ({n})" for name, n in counts.items() if n % k]:
    raise UserError(
      f"steps_per_call={k} does not divide {', '.join(wrong)}: each call runs {k} whole steps; "
      "choose a steps_per_call that divides them (or change them)"
    )
  return eval_every, save_every


def _first_state(seeds: tuple, ema: bool, model, inputs: Inputs, augment, tx, source) -> tuple:
  """(the run's initial state on the host, what it took from `init_from`'s `source` or None):
  with several points (`seeds`: each point's), each point's state (its seed's) stacked along a
  leading axis, each taking init_from's weights as its single run would; `ema`: the state
  keeps an average of the weights (ema_decay > 0)."""
  init_key = steps.run_keys(seeds[0])[0]
  model_input = _model_input(augment, inputs.example_shape)
  several = seeds if len(seeds) > 1 else None
  # tx.init labels the parameters: a parameter group that matches none is an error here
  state = create_train_state(init_key, ema, model, model_input.shape[1:], tx, several)
  states = sweep_lib.unstack(state, len(seeds)) if several else [state]
  started = [init_from.apply(s, source) for s in states]
  state = sweep_lib.stack([s for s, _ in started]) if several else started[0][0]
  return state, started[0][1]


def build_step(
  config, checked, inputs: Inputs, state, also_frozen=()
) -> tuple[Callable, steps.Run]:
  """(the run's train step for ONE device, its pieces): the registered step config.step names,
  given the run's pieces (steps.Run, bound once: the step and the loss each with their
  fields), all but (state, batch, horizon, seed, hyper) bound (several points:
  sweep.each_point, without a seed); traced, a model that names an axis the step lacks is a
  user error (steps.axis_checked). `also_frozen`: parameter groups it does not differentiate
  besides those frozen for the whole run (optim.frozen_from)."""
  points = sweep_lib.points_of(config)
  one = sweep_lib.unstack(state, len(points))[0] if len(points) > 1 else state  # the shapes
  micro_batch = steps.micro_batch_size(
    config.micro_batch_size,
    checked.per_device_batch,
    batch_norm=bool(one.batch_stats),
    backend=jax.default_backend(),
  )
  run = steps.Run(
    step=steps.STEPS.get(config.step),
    gather=inputs.gather,
    augment=checked.augment,
    loss_fn=losses.LOSSES.get(config.loss),
    num_classes=config.model.num_classes,
    fields=of_part(steps.STEPS, config.step, config),
    loss_fields=of_part(losses.LOSSES, config.loss, config),
    micro_batch=micro_batch,
    loss_scale=config.batch_size if config.loss_reduction == "sum" else 1.0,
    frozen=optim.frozen_mask(config.param_groups, one.params, checked.groups, also_frozen),
    batch_norm_axis=batch_norm_axis(config.batch_norm_statistics),
  )
  train_step = functools.partial(steps.train_step, run=run)
  if len(points) > 1:
    vectorized = config.seeds_mode == "vmap"
    train_step = sweep_lib.each_point(train_step, points, inputs.point_axes, vectorized=vectorized)
  return steps.axis_checked(train_step, config.model.name), run


def batch_norm_axis(statistics: str) -> str | None:
  """What BatchNorm averages over in training (config.batch_norm_statistics): the step's axis
  ("global"), or None ("per_device": each device's own examples, ghost BatchNorm)."""
  return AXIS if statistics == "global" else None


def _model_input(augment, example_shape):
  """The shape and dtype of a batch of one as the model sees it: a stored uint8 example of
  `example_shape` through `augment`."""
  example = jax.ShapeDtypeStruct((1, *example_shape), np.uint8)
  return jax.eval_shape(augment, jax.random.key(0), example)


def _check_outputs(model_config, model, augment, example_shape) -> None:
  """A user error unless the model gives one logit per class for the run's images."""
  images = _model_input(augment, example_shape)
  models.check_outputs(model, images, model_config.num_classes, model_config.name)


def every_steps(steps: int, epochs: float, steps_per_epoch: int) -> int:
  """Steps between periodic evals or checkpoints: `steps` where > 0 (it overrides epochs, as
  num_train_steps does num_epochs), else `epochs` epochs (at least 1 step), else 0 (off)."""
  if steps > 0:
    return steps
  return max(1, round(epochs * steps_per_epoch)) if epochs > 0 else 0


def _from_data(model_config, inputs: Inputs, preprocess, seeds: tuple) -> "FromData | None":
  """What computes the parameters the model takes from data, or None where it takes none."""
  functions = models.init_from_data(model_config)
  if functions is None:
    return None
  if inputs.first_images is None:
    raise UserError(
      f"model {model_config.name!r} computes parameters from training images, which needs "
      f"data resident on the devices; {inputs.name} streams (use data_placement='resident')"
    )
  view = models.view(model_config)  # what the model's module is handed
  return FromData(view, inputs.first_images, preprocess, *functions, seeds)


@dataclasses.dataclass
class FromData:
  """state -> state with the parameters the model computes from `model.init_examples`
  training images (a random sample, fixed by the seed), as the eval shows them to the model:
  the preprocessing and the model's `data_statistics` on the device, its `init_from_data` on
  the host (research/models/__init__.py). Once, before the first step; a resumed run has the
  parameters in its checkpoint. `compile()` takes the sample and compiles the device part, so
  that the call itself is the computation alone. `seeds`: one sample and one init per seed,
  for a state with a leading seed axis (config.seeds > 1)."""

  model_config: object  # the model's fields (models.view)
  first_images: Callable[[int], np.ndarray]
  preprocess: Pipeline
  statistics: Callable
  init: Callable
  seeds: tuple
  _images: list | None = None  # each seed's sample
  _compiled: Callable | None = None

  def compile(self) -> None:
    if self._compiled is None:
      self._images = [self.first_images(self.model_config.init_examples, s) for s in self.seeds]
      statistics = lambda images: self.statistics(
        self.model_config, self.preprocess(jax.random.key(0), images)
      )
      self._compiled = jax.jit(statistics).lower(self._images[0]).compile()

  def __call__(self, state):
    self.compile()
    one = lambda state, images: state.replace(
      params=self.init(self.model_config, state.params, jax.device_get(self._compiled(images)))
    )
    if len(self.seeds) == 1:
      return one(state, self._images[0])
    states = sweep_lib.unstack(state, len(self.seeds))
    return sweep_lib.stack([one(s, x) for s, x in zip(states, self._images, strict=True)])
