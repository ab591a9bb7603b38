"""Learning-rate schedules and optimizers from config fields (optax)."""

import jax
import ml_collections
import optax

from research.errors import UserError


def learning_rate_schedule(
  config: ml_collections.ConfigDict, steps_per_epoch: int, num_steps: int
) -> optax.Schedule:
  """Peak lr scaled to the global batch, with warmup and the config's decay."""
  peak = config.learning_rate
  if config.lr_batch_size:
    peak *= config.batch_size / config.lr_batch_size  # linear scaling rule
  warmup = int(config.warmup_epochs * steps_per_epoch)
  if config.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, max(1, num_steps - warmup))
  elif config.schedule == "constant":
    decay = optax.constant_schedule(peak)
  elif config.schedule == "inverse_time":
    decay = lambda step: peak / (1.0 + config.lr_decay * step)
  elif config.schedule == "exponential":
    decay = optax.exponential_decay(
      peak,
      transition_steps=max(1, int(config.lr_decay_epochs * steps_per_epoch)),
      decay_rate=config.lr_decay_rate,
      staircase=True,
    )
  else:
    raise UserError(
      f"schedule={config.schedule!r} is unknown; use cosine, constant, inverse_time, exponential"
    )
  if not warmup:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def _kernels_only(params):
  """Weight decay mask: conv and dense kernels, not biases or BatchNorm scales/offsets."""
  return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "kernel", params)


def create_optimizer(
  config: ml_collections.ConfigDict, schedule: optax.Schedule
) -> optax.GradientTransformation:
  if config.optimizer == "sgd":
    opt = optax.sgd(schedule, momentum=config.momentum, nesterov=config.nesterov)
  elif config.optimizer == "adam":
    opt = optax.adam(schedule)
  elif config.optimizer == "rmsprop":
    opt = optax.rmsprop(
      schedule,
      decay=config.rms_decay,
      eps=config.rms_eps,
      eps_in_sqrt=config.rms_eps_in_sqrt,
      momentum=config.momentum or None,
    )
  else:
    raise UserError(f"optimizer={config.optimizer!r} is unknown; use sgd, adam or rmsprop")
  chain = []
  if config.grad_clip_norm:
    chain.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.weight_decay:
    chain.append(optax.add_decayed_weights(config.weight_decay, mask=_kernels_only))
  return optax.chain(*chain, opt)
