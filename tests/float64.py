"""Two orders of one computation (N devices against 1, two processes against one, micro-batches
against the whole batch, a sweep's point or a seed against its single run) compared where float
rounding cannot reach the bound: in float64 end to end (docs/testing.md). The models compute
in float64 and keep their parameters in it, so do BatchNorm's statistics and the optimizer's
state, which follow the parameters, and the augmentation, which computes in JAX's default float
(research/augment.py): in float32 its per-image reductions round otherwise on another batch
shape (predict's pixels on 1 device and on 8 were 3.8e-6 apart, 2026-12-07)."""

import contextlib
import os

import jax
import numpy as np

from research import configuration

# The model sub-config's fields of a float64 run (research/models/__init__.py needs JAX's
# 64-bit types on for them: `on`).
FIELDS = {"model.dtype": "float64", "model.param_dtype": "float64"}
# What a model's float64 runs add (`fields`). The Keras CNN has no width knob: its float64
# convolutions over 32-pixel images take some 7 s a step of 64 examples on the suite's
# unoptimized CPU kernels (tests/conftest.py), 16-pixel ones (4×4 after its two poolings) a fifth
# of that, and the orders of additions compared are the same. (VGG needs its 32 pixels: its five
# poolings leave 16 none.)
SMALLER = {"keras_cnn": {"synthetic_image_size": "16"}}
# The bound on a compared result's relative difference (`difference`). float64 rounds by
# u = 1.1e-16 a sum; training amplifies it as it does float32's (docs/long_runs.md: some 1e4
# over a few steps), to about 1e-12 at most. The errors these tests exist to catch (an example
# left out, one device's gradient where all devices' mean belongs) move the results by 1e-4 and
# more. Each test's comment gives the largest difference it measured on XLA's default CPU kernels
# and on the other set (--xla_cpu_max_isa=SSE4_2 and
# --xla_cpu_experimental_ynn_fusion_type=-individual_dot,-individual_convolution: other vector
# widths, no YNNPACK), both on a 2-core AMD EPYC Zen 4 with JAX 0.12, 2026-12-07; and what a
# mutation of the code, run once, moved it to (each such run failed the test).
RTOL = 1e-8


@contextlib.contextmanager
def on():
  """JAX's 64-bit types on for the block, in every thread of this process and in the processes
  it starts (JAX_ENABLE_X64=1, as a user runs a float64 config)."""
  before, variable = jax.config.jax_enable_x64, os.environ.get("JAX_ENABLE_X64")
  jax.config.update("jax_enable_x64", True)
  os.environ["JAX_ENABLE_X64"] = "1"
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", before)
    if variable is None:
      os.environ.pop("JAX_ENABLE_X64")
    else:
      os.environ["JAX_ENABLE_X64"] = variable


def fields(model: str) -> dict:
  """The config fields of a float64 run of `model` (`FIELDS`, `SMALLER`)."""
  return {**FIELDS, **SMALLER.get(model, {})}


def config(spec: str):
  """The config `spec` names, in float64 (`fields`), its parts' fields added."""
  loaded = configuration.load(spec)
  configuration.resolve(loaded, list(fields(loaded.model.name).items()))
  return loaded


def difference(a, b, start=None) -> float:
  """How far `a` is from `b`, relative: |a - b| / |b| over every leaf of two pytrees (or
  numbers) at once, or / |b - start| for parameters after steps from `start` (the update's
  size, not the parameters'). Where RESEARCH_DIFFERENCES names a file, each is appended to it
  with the test's name: how the comments' numbers were measured."""
  flat = lambda tree: np.concatenate(
    [np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)]
  )
  a, b = flat(a), flat(b)
  scale = np.linalg.norm(b if start is None else b - flat(start))
  relative = float(np.linalg.norm(a - b) / scale)
  if path := os.environ.get("RESEARCH_DIFFERENCES"):
    with open(path, "a") as f:
      f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{relative:.3e}\n")
  return relative


def assert_close(a, b, start=None, what: str = "") -> None:
  """`a` is `b` to `RTOL` (`difference`)."""
  relative = difference(a, b, start)
  assert relative <= RTOL, f"{what} {relative:.3e} apart (relative), more than {RTOL:g}"
