"""Several seeds in one program (`config.seeds`): the one-seed train step, wrapped.

The one-seed step (research/steps.py) reads as if seeds did not exist; here its state gains a
leading seed axis and each seed's step runs as its single run would (docs/seeds.md).
"""

import jax
import jax.numpy as jnp
import numpy as np


def seeds_of(config) -> tuple:
  """The seeds a run of `config` trains in one program: seed, seed + 1, ... (`config.seeds` of
  them; one for a run recorded before the field)."""
  return tuple(range(config.seed, config.seed + config.get("seeds", 1)))


def seed_part(batch, batch_axes, index: int, axis: int = 0):
  """Seed `index`'s part of `batch`: the parts whose `batch_axes` (as `seeded` takes them) is 0
  indexed at `axis` (0 inside the pmap, 1 for a pmapped batch [devices, seeds, ...]); the
  parts with None (the data, shared by the seeds) as they are."""
  at = (slice(None),) * axis + (index,)
  part = lambda seed_axis, x: jax.tree.map(lambda a: a[at], x) if seed_axis == 0 else x
  return jax.tree.map(part, batch_axes, batch, is_leaf=lambda a: a is None)


def seeded(train_step, seeds, batch_axes, *, vectorized: bool = False):
  """`train_step` for `len(seeds)` runs at once (`config.seeds`): the state has a leading seed
  axis, and so has each part of the batch whose `batch_axes` (a vmap in_axes prefix of the
  batch) is 0 (the data order); the parts with None (the data itself) are shared. Each seed's
  step draws from its own keys, the step's and its examples' own, as its single run would.

  `vectorized`: the seeds' steps are one batched computation (`jax.vmap`; collectives batch
  over the seeds, each averaged apart); else (`seeds_mode="unroll"`, the default) each seed's
  step is traced apart in the program, as the step's micro-batches are: the single step's
  kernels, which XLA may run side by side; the compile grows with the seeds. BENCHMARKS.md
  measures both, on a CPU and a GPU."""
  seeds = np.asarray(seeds, np.int32)

  def step(state, batch, horizon=None, hyper=None):
    def one(state, batch, seed):
      return train_step(state, batch, horizon, seed, hyper)

    if vectorized:
      return jax.vmap(one, in_axes=(0, batch_axes, 0))(state, batch, seeds)
    states = unstack(state, len(seeds))
    outs = [one(states[i], seed_part(batch, batch_axes, i), seed) for i, seed in enumerate(seeds)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

  return step


def stack(trees):
  """Trees of the same structure as one with a leading axis (seed i at index i), on the host."""
  return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def unstack(tree, count: int) -> list:
  """`stack`'s inverse: the `count` trees along the leading axis."""
  return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(count)]
