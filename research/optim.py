"""Learning-rate schedules and optimizers from config fields (optax), with parameter groups.

`config.param_groups` names groups of parameters, each a dict: `match`, a regular expression
searched in each parameter's path (`group1/conv1/kernel`; the first group that matches takes
the parameter), then the group's own `optimizer`, `learning_rate`, `weight_decay`, `momentum`,
`nesterov` or any other field of the config (unset: the config's), and `train_fraction` (its
schedule runs over that share of training and its learning rate is 0 after). `optimizer` is
a registered one (OPTIMIZERS, below), "frozen" (never updated), or "muon": momentum whose
update is orthogonalised by Newton-Schulz iterations (`ns_steps` of `ns_coeffs`) per kernel,
a kernel [kh, kw, in, out] taken as a matrix [kh·kw·in, out] (`ns_stacked=True`: all kernels
at once); `normalize_weights=True` rescales each kernel to norm sqrt(out) before its update
(airbench's Muon), every update or as `normalize_every=(first, growth)` spaces them (hiverge's).
The optimizer is built once a run; its update takes the run's length (`horizon=`, traced).
Once a group's `train_fraction` is over, the step no longer differentiates it (`frozen_from`;
not with grad_clip_norm, nor for a step that reads the gradient itself).
Parameters no group matches use
the config's own optimizer, with weight decay on kernels only. A group's weight decay applies
to all its parameters.

This module reads the fields `reads()` names (the run's set-up hands it a view of them,
research/fields.py): its functions take that view, `fields`, never the whole config.
"""

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from research import schedules
from research.errors import UserError
from research.fields import DTYPES, GROUP_DEFAULTS, in_ranges, of_part, one_of
from research.registry import Registry

DEFAULT = "default"  # the label of parameters no group matches
# register(name, decays_weights=True: it applies `weight_decay` itself; groups_only=True: for
# param_groups alone; frozen=True: it never updates, so the step does not differentiate;
# steps=True: it is also given `steps=`, the run's step count, an int or traced) on
# `make(learning_rate, fields) -> optax.GradientTransformation`, where `learning_rate` is the
# schedule and `fields` the group's config fields (the config's own for parameters no group
# takes): a fork's optimizer reads its fields there, set in its config.
OPTIMIZERS = Registry("optimizer", "optimizer", "research.optim")
register = OPTIMIZERS.register


# What this module reads of the config (besides the fields registered optimizers and schedules
# declare): the optimizers' and schedules' fields, the batch the learning rate scales with,
# clipping, the parameter groups and the model's dtype (Muon's "model" dtype).
READS = (
  "optimizer", "learning_rate", "lr_batch_size", "batch_size", "schedule", "warmup_epochs",
  "lr_decay", "lr_decay_rate", "lr_decay_epochs", "momentum", "nesterov", "rms_decay", "rms_eps",
  "rms_eps_in_sqrt", "weight_decay", "grad_clip_norm", "param_groups", "model.dtype",
)  # fmt: skip


def reads() -> tuple:
  """READS and every field a registered optimizer or schedule declares (a group inherits the
  config's value of one)."""
  declared = [f for r in (OPTIMIZERS, schedules.SCHEDULES) for d in r.declared.values() for f in d]
  return (*READS, *dict.fromkeys(declared))


def nonzero(value) -> bool:
  """Whether a field's value is not 0: a traced one never is (hyper_values keeps zeros
  constant), so a transformation it needs is built."""
  return not isinstance(value, (int, float)) or value != 0


def learning_rate_schedule(fields, steps_per_epoch: int, num_steps, group=None) -> optax.Schedule:
  """The schedule `group.schedule` names (research/schedules.py) over `num_steps` (an int, or
  a traced int32 scalar where the schedule takes one), after `group.warmup_epochs` of linear
  warm-up from 0: peaking at `group.learning_rate` (0: the config's, scaled to the global
  batch by lr_batch_size). `group`: a parameter group's fields (group_fields), else None for
  the config's own (`fields`, this module's view)."""
  scaled = fields.learning_rate  # linear scaling rule: per lr_batch_size examples
  if fields.lr_batch_size:
    scaled *= fields.batch_size / fields.lr_batch_size
  own = fields if group is None else group
  peak = own.learning_rate if group is not None and nonzero(own.learning_rate) else scaled
  warmup = int(own.warmup_epochs * steps_per_epoch)
  decay_steps = jnp.maximum(1, num_steps - warmup) if traced(own) else max(1, num_steps - warmup)
  make, view = (
    schedules.SCHEDULES.get(own.schedule),
    of_part(schedules.SCHEDULES, own.schedule, own),
  )
  try:
    decay = make(peak, decay_steps, steps_per_epoch, view)
  except ValueError as e:  # optax's constructors check their numbers: the run's, not a bug
    raise UserError(
      f"schedule={own.schedule!r} refuses this run's numbers ({e}); the run has {num_steps} "
      "steps: train longer, or give the schedule numbers that fit"
    ) from None
  if not warmup:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def traced(fields) -> bool:
  """Whether the schedule `fields.schedule` takes the run's length traced (schedules.register's
  `traced=True`)."""
  return bool(schedules.SCHEDULES.options[fields.schedule].get("traced"))


def length_traced(fields, groups: dict) -> bool:
  """Whether every schedule the optimizer uses takes the run's length traced: only then is the
  length an argument of the compiled step (else the step holds it as a constant)."""
  return traced(fields) and all(traced(group) for group in groups.values())


def logged_schedules(fields, steps_per_epoch: int, num_steps: int, groups: dict) -> dict:
  """{record field: step -> learning rate}: what the optimizer applies, by the same functions:
  `learning_rate` (the config's own, for parameters no group takes) and each group's
  `learning_rate/GROUP`."""
  logged = {"learning_rate": learning_rate_schedule(fields, steps_per_epoch, num_steps)}
  for name, group in groups.items():
    schedule = group_schedule(fields, group, steps_per_epoch, num_steps)
    if OPTIMIZERS.options[group.optimizer].get("frozen"):  # never updated: no rate applies
      schedule = optax.constant_schedule(0.0)
    logged[f"learning_rate/{name}"] = schedule
  return logged


def group_steps(fraction: float, num_steps):
  """A group's `train_fraction` of `num_steps` in steps, at least 1: the float32 product rounded
  half to even, the same whether `num_steps` is an int (an int back) or traced."""
  if isinstance(num_steps, int):
    return max(1, int(np.round(np.float32(fraction) * np.float32(num_steps))))
  product = jnp.float32(fraction) * num_steps.astype(jnp.float32)
  return jnp.maximum(1, jnp.round(product).astype(jnp.int32))


def group_schedule(fields, group, steps_per_epoch: int, num_steps):
  """A parameter group's schedule: over its `train_fraction` of the run's steps, 0 after."""
  steps = group_steps(group.train_fraction, num_steps)
  if traced(group) and isinstance(steps, int):  # its arithmetic in jnp: the traced one's
    steps = jnp.int32(steps)
  schedule = learning_rate_schedule(fields, steps_per_epoch, steps, group)
  return _until(schedule, steps) if group.train_fraction < 1 else schedule


def _kernels_only(params):
  """Weight decay mask: conv and dense kernels, not biases or BatchNorm scales/offsets."""
  return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "kernel", params)


@register("sgd")
def sgd(learning_rate, fields) -> optax.GradientTransformation:
  return optax.sgd(learning_rate, momentum=fields.momentum, nesterov=fields.nesterov)


@register("adam")
def adam(learning_rate, fields) -> optax.GradientTransformation:
  del fields
  return optax.adam(learning_rate)


@register("rmsprop")
def rmsprop(learning_rate, fields) -> optax.GradientTransformation:
  return optax.rmsprop(
    learning_rate,
    decay=fields.rms_decay,
    eps=fields.rms_eps,
    eps_in_sqrt=fields.rms_eps_in_sqrt,
    momentum=fields.momentum if nonzero(fields.momentum) else None,
  )


def _kernel_matrix(update) -> MuonDimensionNumbers:
  """A kernel [..., in, out] as the matrix [prod(...) · in, out] Muon orthogonalises."""
  return MuonDimensionNumbers(reduction_axis=tuple(range(update.ndim - 1)), output_axis=-1)


def _cast_updates(dtype) -> optax.GradientTransformation:
  """The updates in `dtype`."""
  return optax.GradientTransformation(
    lambda params: optax.EmptyState(),
    lambda updates, state, params=None: (optax.tree.cast(updates, dtype), state),
  )


class Renormalized(NamedTuple):
  count: jax.Array  # int32: updates so far
  last: jax.Array  # int32: the update that last renormalised


def renormalize_weights(every=(), steps=None) -> optax.GradientTransformation:
  """Adds to the update what first rescales each parameter to norm sqrt(its last dimension):
  p + update becomes p · sqrt(out) / |p| + update. `every` (first, growth): only at update
  `count` (1, 2, ...) where count - the last renormalising update >= first + int(growth ·
  count / steps), `steps` the run's (hiverge's Muon: (2, 15)); (): at every update."""

  def rescaled(update, p, due=True):
    return update + jnp.where(due, p * (jnp.sqrt(p.shape[-1]) / jnp.linalg.norm(p) - 1), 0)

  if not every:
    return optax.GradientTransformation(
      lambda params: optax.EmptyState(),
      lambda updates, state, params: (jax.tree.map(rescaled, updates, params), state),
    )
  first, growth = every

  def update_fn(updates, state, params):
    count = state.count + 1
    period = first + jnp.floor(growth * count / steps).astype(jnp.int32)
    due = count - state.last >= period
    updates = jax.tree.map(lambda u, p: rescaled(u, p, due), updates, params)
    return updates, Renormalized(count, jnp.where(due, count, state.last))

  zero = lambda params: Renormalized(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
  return optax.GradientTransformation(zero, update_fn)


def newton_schulz_stacked(ns_coeffs, ns_steps: int) -> optax.GradientTransformation:
  """Newton-Schulz's `ns_steps` iterations (X ← aX + (bA + cA²)X, A = XXᵀ) on every kernel at
  once, as hiverge's Muon runs them: each kernel [..., out] as the matrix [prod(...), out]
  (transposed to have no more rows than columns), zero-padded to the largest and stacked into
  one [kernels, rows, columns] array; the zeros stay zero, so each comes out as its own
  iterations give it (to float rounding). Its input is normalised already (scale_by_muon with
  no iterations)."""
  a, b, c = ns_coeffs

  def update_fn(updates, state, params=None):
    leaves, tree = jax.tree.flatten(updates)
    matrices = [x.reshape(-1, x.shape[-1]) for x in leaves]
    flipped = [m.shape[0] > m.shape[1] for m in matrices]
    matrices = [m.T if f else m for m, f in zip(matrices, flipped, strict=True)]
    rows, cols = max(m.shape[0] for m in matrices), max(m.shape[1] for m in matrices)
    pad = lambda m: jnp.pad(m, ((0, rows - m.shape[0]), (0, cols - m.shape[1])))
    x = jnp.stack([pad(m) for m in matrices])  # [kernels, rows, cols]
    for _ in range(ns_steps):
      a_ = x @ x.transpose(0, 2, 1)
      x = a * x + (b * a_ + c * a_ @ a_) @ x
    out = [x[i, : m.shape[0], : m.shape[1]] for i, m in enumerate(matrices)]
    out = [
      (o.T if f else o).reshape(leaf.shape) for o, f, leaf in zip(out, flipped, leaves, strict=True)
    ]
    return jax.tree.unflatten(tree, out), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def _check_muon(fields) -> None:
  """A user error for a group's Newton-Schulz steps that are not a whole number >= 1, its
  coefficients not three numbers, a dtype not one of `DTYPES`, or a renormalisation period
  that is not () or (first, growth) of a group that renormalises."""
  in_ranges(fields, (("ns_steps", ">= 1", lambda x: isinstance(x, int) and x >= 1),))
  one_of(fields.name_of("muon_dtype"), fields.muon_dtype, ("model", *DTYPES))
  numbers = lambda xs, n: len(xs) == n and all(isinstance(x, (int, float)) for x in xs)
  coeffs, every = tuple(fields.ns_coeffs), tuple(fields.normalize_every)
  if not numbers(coeffs, 3):
    raise UserError(f"{fields.name_of('ns_coeffs')}={coeffs}: give three numbers (a, b, c)")
  if every and not (numbers(every, 2) and fields.normalize_weights):
    raise UserError(
      f"{fields.name_of('normalize_every')}={every}: give (first, growth), two numbers, for a "
      "group with normalize_weights=True, or () to renormalise at every update"
    )


@register(
  "muon",
  fields={
    "ns_steps": 5,  # Newton-Schulz iterations
    "ns_coeffs": (3.4445, -4.7750, 2.0315),  # optax's (Newton-Schulz's quintic)
    "ns_stacked": False,  # True: the iterations on all kernels at once (newton_schulz_stacked)
    "normalize_weights": False,  # each kernel rescaled to norm sqrt(out) before its update
    "normalize_every": (),  # (): at every update (renormalize_weights); (first, growth)
    "muon_dtype": "float32",  # "bfloat16", or "model": the model's compute dtype
  },
  check=_check_muon,
  decays_weights=True,
  groups_only=True,
  steps=True,
)
def muon(learning_rate, fields, steps=None) -> optax.GradientTransformation:
  """Momentum orthogonalised by Newton-Schulz (`ns_steps` of `ns_coeffs`) per kernel, or on
  all kernels stacked where `ns_stacked` (newton_schulz_stacked), weight
  decay decoupled (as optax.contrib.muon), kernels renormalised where `normalize_weights`
  (airbench's Muon), every update or as `normalize_every` says (renormalize_weights; `steps`:
  the run's). `muon_dtype` "bfloat16": the gradients, the momentum and Newton-Schulz in
  bfloat16, as airbench and hiverge keep theirs in 16 bits (the momentum state then is
  bfloat16 too); "model" (group_fields): the model's compute dtype."""
  low = jnp.dtype(fields.muon_dtype)
  chain = [] if low == jnp.float32 else [_cast_updates(low)]  # float32: the state as before
  chain.append(
    scale_by_muon(
      ns_coeffs=tuple(fields.ns_coeffs),
      ns_steps=0 if fields.ns_stacked else fields.ns_steps,  # stacked: normalised alone
      beta=fields.momentum,
      nesterov=fields.nesterov,
      mu_dtype=None if low == jnp.float32 else low,
      weight_dimension_numbers=lambda updates: jax.tree.map(_kernel_matrix, updates),
    )
  )
  if fields.ns_stacked:  # the iterations on all kernels at once
    chain.append(newton_schulz_stacked(tuple(fields.ns_coeffs), fields.ns_steps))
  if nonzero(fields.weight_decay):
    chain.append(optax.add_decayed_weights(fields.weight_decay))
  chain.append(optax.scale_by_learning_rate(learning_rate))
  if fields.normalize_weights:
    chain.append(renormalize_weights(tuple(fields.normalize_every), steps))
  return optax.chain(*chain)


@register("frozen", decays_weights=True, groups_only=True, frozen=True)
def frozen(learning_rate, fields) -> optax.GradientTransformation:
  """Never updated (and never differentiated: `frozen_mask`)."""
  del learning_rate, fields
  return optax.set_to_zero()


def _transforms(group, schedule, steps, mask=None) -> list[optax.GradientTransformation]:
  """The optimizer `group.optimizer` names (given its view of `group`'s fields, and the run's
  `steps` where registered with steps=True), after `group.weight_decay` (L2, added to the
  gradient; on `mask`'s parameters) unless it decays weights itself. `group`: a parameter
  group's fields, or this module's view for the config's own optimizer."""
  make, options = OPTIMIZERS.get(group.optimizer), OPTIMIZERS.options[group.optimizer]
  view = of_part(OPTIMIZERS, group.optimizer, group)
  transforms = [make(schedule, view, steps=steps) if options.get("steps") else make(schedule, view)]
  if nonzero(group.weight_decay) and not options.get("decays_weights"):
    transforms.insert(0, optax.add_decayed_weights(group.weight_decay, mask=mask))
  return transforms


def group_fields(fields) -> dict:
  """{group name: its fields}: what the group sets, the config's values filling what it leaves
  unset, and the fields its optimizer and schedule declare at their defaults where the config
  has none; `learning_rate` 0 (the config's, scaled to the batch) and `train_fraction` 1 where
  it sets none. (Which fields a group may set: configuration.check_owned.)"""
  scalars = {k: v for k, v in fields.items() if not isinstance(v, ml_collections.ConfigDict)}
  scalars.pop("model", None)
  groups = {}
  for name, group in fields.param_groups.items():
    if "match" not in group:
      raise UserError(f"param_groups.{name} needs a `match` pattern: a regex of parameter paths")
    settings = group.to_dict()
    optimizer = settings.get("optimizer", scalars["optimizer"])
    schedule = settings.get("schedule", scalars["schedule"])
    declared = {
      **schedules.SCHEDULES.declared.get(schedule, {}),
      **OPTIMIZERS.declared.get(optimizer, {}),
    }
    merged = {**declared, **scalars, **GROUP_DEFAULTS, "learning_rate": 0.0, **settings}
    if merged.get("muon_dtype") == "model":  # Muon in the model's compute dtype
      merged["muon_dtype"] = fields.model.dtype
    groups[name] = ml_collections.ConfigDict(merged)
  return groups


def labels(param_groups, params) -> dict:
  """The group of each parameter (DEFAULT where none matches `param_groups`' patterns); a user
  error for a group that matches no parameter."""
  patterns = {name: re.compile(g.match) for name, g in param_groups.items()}
  matched = set()

  def label(path, _):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    for group, pattern in patterns.items():
      if pattern.search(name):
        matched.add(group)
        return group
    return DEFAULT

  result = jax.tree_util.tree_map_with_path(label, params)
  if unmatched := [g for g in patterns if g not in matched]:
    paths = ["/".join(str(getattr(k, "key", k)) for k in p) for p, _ in _leaves(params)]
    raise UserError(
      f"param_groups.{unmatched[0]}.match={param_groups[unmatched[0]].match!r} matches "
      f"no parameter (or only ones an earlier group took); parameters: {', '.join(paths[:8])}"
      + (", …" if len(paths) > 8 else "")
    )
  return result


def frozen_mask(param_groups, params, groups: dict, also=()):
  """True for each parameter a group (`groups`: group_fields) freezes for the whole run (an
  optimizer registered with frozen=True), or that a group named in `also` holds, which the
  step then does not differentiate; None where no group does."""
  frozen = {n for n, g in groups.items() if OPTIMIZERS.options[g.optimizer].get("frozen")}
  frozen |= set(also)
  if not frozen:
    return None
  return jax.tree.map(lambda label: label in frozen, labels(param_groups, params))


def frozen_from(grad_clip_norm: float, groups: dict, num_steps: int) -> dict:
  """{step count: the groups whose learning rate is 0 from there to the run's end}: those that
  train a `train_fraction` < 1 of the run's `num_steps` (their schedule is 0 after it,
  `group_schedule`). From that step the group's update no longer depends on its gradient (the
  optimizer scales its update by the learning rate, as every shipped one does), so the step
  need not compute it (`frozen_mask`'s `also`): the same parameters. Without grad_clip_norm
  only (the clipped norm would count the gradient), and for steps registered
  optimizer_only=True (research/steps.py); the logged grad_norm leaves the group out from
  there."""
  if grad_clip_norm:
    return {}
  ends = {}
  for name, group in groups.items():
    end = group_steps(group.train_fraction, num_steps)  # the schedule's own count
    frozen = OPTIMIZERS.options[group.optimizer].get("frozen")
    if group.train_fraction < 1 and end < num_steps and not frozen:
      ends.setdefault(end, []).append(name)
  return {end: tuple(names) for end, names in sorted(ends.items())}


def _leaves(params):
  return jax.tree_util.tree_flatten_with_path(params)[0]


def create_optimizer(
  fields, steps_per_epoch: int, num_steps: int, groups=None
) -> optax.GradientTransformationExtraArgs:
  """The config's optimizer (`fields`: this module's view, `reads()`), built once a run, its
  schedules over `num_steps`. Its update takes the run's length as `horizon=` (the compiled
  step's int32 argument, traced): where every schedule takes it traced (`length_traced`) they
  end there, so that runs of any length share one compiled step; and `hyper=`
  (sweep.hyper_values, traced), the values its fields take. It then makes its transformations
  for them in the trace, as optax.inject_hyperparams does for its traced hyper-parameters.
  `groups`: group_fields."""
  groups = group_fields(fields) if groups is None else groups
  traced = length_traced(fields, groups)
  made = _transformation(fields, steps_per_epoch, num_steps, groups)

  def update(updates, state, params=None, *, horizon=None, hyper=None, **extra_args):
    if (not traced or horizon is None) and not hyper:
      return made.update(updates, state, params, **extra_args)
    length = horizon if traced and horizon is not None else num_steps
    view = fields.with_values(hyper) if hyper else fields
    tx = _transformation(view, steps_per_epoch, length, group_fields(view) if hyper else groups)
    return tx.update(updates, state, params, **extra_args)  # the same state's layout

  return optax.GradientTransformationExtraArgs(made.init, update)


def _transformation(fields, steps_per_epoch: int, num_steps, groups: dict):
  """The optimizer's chain, its schedules over `num_steps` (an int, or traced)."""
  schedule = learning_rate_schedule(fields, steps_per_epoch, num_steps)
  chain = []
  if nonzero(fields.grad_clip_norm):
    chain.append(optax.clip_by_global_norm(fields.grad_clip_norm))
  default = _transforms(fields, schedule, num_steps, mask=_kernels_only)
  if not fields.param_groups:
    return optax.chain(*chain, *default)
  transforms = {DEFAULT: optax.chain(*default)}
  for name, group in groups.items():  # each group's schedule, 0 once its share is over
    schedule = group_schedule(fields, group, steps_per_epoch, num_steps)
    made = _transforms(group, schedule, num_steps)
    # Chained as before the registry, so the optimizer state keeps its layout and earlier
    # runs' checkpoints restore: muon and frozen alone, the others in a chain.
    decays_itself = OPTIMIZERS.options[group.optimizer].get("decays_weights")
    transforms[name] = made[0] if decays_itself else optax.chain(*made)
  tx = optax.multi_transform(transforms, lambda params: labels(fields.param_groups, params))
  return optax.chain(*chain, tx)


def _until(schedule, steps: int):
  return lambda step: jnp.where(step < steps, schedule(step), 0.0)
