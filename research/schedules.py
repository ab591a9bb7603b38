"""Learning-rate schedules, found by name: `config.schedule` (or a parameter group's) names one.

A schedule is `make(peak, steps, steps_per_epoch, fields) -> schedule(step) -> lr`, registered
with `@research.schedules.register("name")`, here or in a fork's module of `config.modules`.
`steps` is the length it spans: the run's step count (however the run's length is set:
num_train_steps or num_epochs), less the warm-up (`warmup_epochs`, a linear ramp from 0 the
library puts before it) and, for a parameter group, cut to its `train_fraction`; `fields` are
the config's fields (a group's, where a group sets its own). Registered with `traced=True`, a
schedule takes `steps` as a traced int32 (jnp arithmetic, no Python `if` on it): the run's
length is then an argument of the compiled step, and a launch of another length loads it
from the compilation cache. Without it (optax's schedule constructors check their lengths in
Python), `steps` is an int and the compiled step holds it as a constant. The optimizer applies
the schedule it is given, and the train records log that same schedule's value: each
group's as `learning_rate/GROUP`.
"""

import jax.numpy as jnp
import optax

from research.registry import Registry

SCHEDULES = Registry("schedule", "schedule", "research.schedules")
register = SCHEDULES.register


@register("cosine", traced=True)
def cosine(peak, steps, steps_per_epoch, fields):
  """From the peak to 0 at the last step along half a cosine (optax.cosine_decay_schedule's,
  for a traced length)."""
  del steps_per_epoch, fields
  return lambda step: peak * 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(step, steps) / steps))


@register("linear", traced=True)
def linear(peak, steps, steps_per_epoch, fields):
  """From the peak to 0 at the last step (optax.linear_schedule's)."""
  del steps_per_epoch, fields
  return lambda step: peak * (1 - jnp.clip(step, 0, steps) / steps)


@register("constant", traced=True)
def constant(peak, steps, steps_per_epoch, fields):
  del steps, steps_per_epoch, fields
  return optax.constant_schedule(peak)


@register("inverse_time", traced=True)
def inverse_time(peak, steps, steps_per_epoch, fields):
  """peak / (1 + lr_decay · step): Keras' legacy `decay`."""
  del steps, steps_per_epoch
  return lambda step: peak / (1.0 + fields.lr_decay * step)


@register("exponential", traced=True)
def exponential(peak, steps, steps_per_epoch, fields):
  """Multiplied by lr_decay_rate every lr_decay_epochs (staircase)."""
  del steps
  return optax.exponential_decay(
    peak,
    transition_steps=max(1, int(fields.lr_decay_epochs * steps_per_epoch)),
    decay_rate=fields.lr_decay_rate,
    staircase=True,
  )
