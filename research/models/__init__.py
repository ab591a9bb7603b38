"""Models, found by name: `config.model.name = 'vgg'` is the model registered as 'vgg'.

A model is `create(model_config, axis_name) -> flax.linen.Module` decorated with
`@research.models.register("name")`, in `research/models/` or in a fork's module named in
`config.modules`. The module is plain flax (`nn.Conv`, `nn.Dropout`, `nn.BatchNorm`, ...),
called on float images [batch, H, W, C] with its mode as its `__call__` names it: `train=`,
`deterministic=` (not train), or nothing for a model without one (`mode`); it returns logits
[batch, num_classes], as many as the data has classes (checked before any image is
decoded). `axis_name` is the pmap axis ('batch', as flax's examples name it; None outside
pmap) for BatchNorm, so statistics are averaged across replicas: a model copied from a flax
codebase that names 'batch' itself runs as written.
Dropout draws from the "dropout" rng collection. Forms from outside the model apply to it: the
step's dropout mask per example (research/steps.py) and, in `apply_fn`, research/cpu_forms.py's
faster convolutions on CPU. Only max-pooling, a function no interceptor reaches, is called by name:
the shipped models use `cpu_forms.max_pool`. The loss is the config's (research/losses.py).

A model checks the fields it declares itself: `register(name, fields={...}, check=f)`, where
`f(model_config)` raises a UserError for a value it cannot take (research/registry.py).

A model may also compute part of its initial parameters from training images: it is then
registered with `init_from_data=f`, `f(model_config, params, images) -> params`, given
`model_config.init_examples` training images (a random sample of the split, fixed by the
config's seed) as float32 [N, H, W, C], as the config's eval_preprocess (its first view)
shows them to the model. Where it is also registered with `data_statistics=g`,
`g(model_config, images) -> arrays` (traceable by JAX), that runs on the device instead,
compiled with the preprocessing before the run's clock starts, and `init_from_data` gets its
result on the host in place of the images. Either runs once, before the first step; the
result is in every checkpoint, so a resumed run does not redo it.
"""

import functools
import inspect
from collections.abc import Callable

import flax
import flax.linen as nn
import jax
import ml_collections
from flax import nnx

from research.cpu_forms import cpu_forms_applied
from research.errors import UserError
from research.fields import View, of_part
from research.models.base import (  # the package's public names, its models' shared ones
  MODELS as MODELS,
)
from research.models.base import (
  at_least_float32 as at_least_float32,
)
from research.models.base import (
  register as register,
)

MODES = {"train": lambda train: train, "deterministic": lambda train: not train}
# How a fork wraps a model whose __call__ needs more than the step passes (docs/extending.md)
ADAPTER = "a module whose __call__(self, x, train: bool) returns YourModel(...)(x, ...)"


def view(model_config) -> View:
  """The view of the model sub-config its model is handed: `name`, `num_classes`, `dtype` and
  the fields it declared (`register(name, fields={...})`), at their defaults where unset."""
  return of_part(MODELS, model_config.name, model_config)


def create(model_config, axis_name: str | None) -> nn.Module:
  """The flax module of the model registered as `model_config.name` (given its `view`); a
  user error for a model the step cannot call: its `__call__` must take the images, and at
  most its mode besides, or for a float64 model where JAX's 64-bit types are off."""
  name = model_config.name
  check_float64(model_config)
  module = MODELS.get(name)(view(model_config), axis_name)
  if isinstance(module, type) and issubclass(module, nnx.Module):
    module = FromNnx(module, axis_name=axis_name)  # an NNX class, as flax's examples write one
  if not isinstance(module, nn.Module):
    raise UserError(
      f"model {name!r}: create() returned {type(module).__module__}.{type(module).__name__}, not "
      "a flax linen Module nor an NNX Module class; return the NNX class itself (not an "
      "instance: the library makes it, with its rngs), or models.FromNnx(cls, kwargs=...)"
    )
  parameters = list(inspect.signature(module.__call__).parameters.values())[1:]
  needed = [
    p.name
    for p in parameters
    if p.default is p.empty
    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    and p.name not in MODES
  ]
  if needed:
    raise UserError(
      f"model {name!r}: its __call__ needs {', '.join(needed)}, which the step does not pass "
      f"(it passes the images and train= or deterministic= where __call__ names one); return "
      f"from create() {ADAPTER} (docs/extending.md)"
    )
  return module


def check_float64(model_config) -> None:
  """A user error for a model in float64 (`dtype` or `param_dtype`) while JAX's 64-bit types
  are off: JAX would make its arrays float32 without a word. float64 is for checking that two
  orders of one computation agree (docs/testing.md), not for training speed."""
  asked = [
    f"model.{f}=float64" for f in ("dtype", "param_dtype") if model_config.get(f) == "float64"
  ]
  if asked and not jax.config.jax_enable_x64:
    raise UserError(
      f"{' and '.join(asked)} needs JAX's 64-bit types, which are off: run with "
      "JAX_ENABLE_X64=1 in the environment (or jax.config.update('jax_enable_x64', True))"
    )


class FromNnx(nn.Module):
  """A flax NNX module class as a linen module (flax.nnx.bridge.ToLinen), so that it trains,
  evaluates, predicts and checkpoints as any model here: made with `nnx.Rngs` of the run's
  streams ("params", "dropout") and `kwargs`, put in training or eval mode (`.train()`,
  `.eval()`: Dropout, BatchNorm) and every `nnx.BatchNorm` averaging over the step's axis,
  whatever it names. Its parameters are under "nnx"."""

  nnx_class: type
  kwargs: dict = flax.core.FrozenDict()
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x, train: bool):
    def key(stream):  # eval passes no rngs: its draws are off, the key unused
      given = self.has_rng(stream) or self.has_rng("params")
      return self.make_rng(stream) if given else jax.random.key(0)

    rngs = nnx.Rngs(params=key("params"), dropout=key("dropout"))
    axis = self.axis_name

    def call(module, x):
      for _, sub in nnx.iter_modules(module):
        if isinstance(sub, nnx.BatchNorm):
          sub.axis_name = axis  # statistics of the global batch, as linen models have them
      module.train() if train else module.eval()
      takes_rngs = "rngs" in inspect.signature(module.__call__).parameters
      return module(x, rngs=rngs) if takes_rngs else module(x)

    kwargs = {**self.kwargs, "rngs": rngs}
    bridge = nnx.bridge.ToLinen(self.nnx_class, kwargs=kwargs, skip_rng=True, name="nnx")
    return bridge(x, nnx_method=call)


def mode(module: nn.Module, train: bool) -> dict:
  """The keyword that puts `module` in training or eval mode, as its `__call__` names it:
  {"train": train}, {"deterministic": not train}, or {} for a model without a mode."""
  parameters = inspect.signature(module.__call__).parameters
  return {name: of(train) for name, of in MODES.items() if name in parameters}


def apply_fn(module: nn.Module) -> Callable:
  """`module.apply(variables, images, train=..., **kwargs)` for any mode keyword (`mode`),
  traced in research/cpu_forms.py's forms where they are on (on CPU)."""
  return functools.partial(_apply, module)


def _apply(module, variables, images, *, train: bool, **kwargs):
  with cpu_forms_applied():
    return module.apply(variables, images, **mode(module, train), **kwargs)


def check_outputs(module: nn.Module, images, num_classes: int, name: str) -> None:
  """A user error unless the model's logits for `images` (a shape) are [batch, num_classes]."""
  init = lambda x: module.init_with_output(jax.random.key(0), x, **mode(module, False))[0]
  logits = jax.eval_shape(init, images)
  shape = getattr(logits, "shape", None)
  if shape is None:  # a tuple, a dict, ...: more than the logits
    raise UserError(
      f"model {name!r} returns a {type(logits).__name__} where the step takes its logits alone, "
      f"[batch, {num_classes}]; return the logits, and send what else it computes through "
      'self.sow("intermediates", NAME, value): a loss reads it there (docs/extending.md)'
    )
  if shape != (images.shape[0], num_classes):
    raise UserError(
      f"model {name!r} returns {shape} for a batch of {images.shape[0]}, where the data's "
      f"{num_classes} classes need logits [batch, {num_classes}]; give its last layer "
      "model.num_classes outputs"
    )


def init_from_data(model_config: ml_collections.ConfigDict) -> tuple[Callable, Callable] | None:
  """(data_statistics, init_from_data) the model registered with (the statistics are the
  images themselves where it gave none), or None if it computes nothing from data."""
  hooks = MODELS.options[model_config.name]
  if "init_from_data" not in hooks:
    return None
  return hooks.get("data_statistics", lambda _, images: images), hooks["init_from_data"]


# The shipped models register themselves on import.
from research.models import inception_v3, keras_cnn, speedrun, vgg  # noqa: E402, F401
