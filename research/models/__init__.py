"""Models are found by name: `config.model.name = 'vgg'` loads `research/models/vgg.py`.

Each model module defines `create(model_config, axis_name) -> flax.linen.Module`, a plain
flax module (`nn.Conv`, `nn.Dropout`, `nn.BatchNorm`, ...). It is called as
`model.apply(variables, images, train=...)` on float images [batch, H, W, C] and returns
logits [batch, num_classes]. `axis_name` is given to BatchNorm so statistics are averaged
across replicas; it is None outside pmap. Dropout draws from the "dropout" rng collection.
The step applies its own forms from outside the model (research/steps.py: a dropout mask per
example; research/cpu_forms.py: faster convolutions on CPU). Only max-pooling, a function no
interceptor reaches, is called by name: the shipped models use `cpu_forms.max_pool`.

A model module may define its training loss, `loss(logits, targets, intermediates, config)
-> [batch]` per-example losses, where `targets` are class probabilities [batch, num_classes]
(one-hot, or mixed by an augmentation such as mixup), `intermediates` what the model sowed
there in training (`self.sow("intermediates", name, value)`: Inception-v3's auxiliary
logits) and `config` the whole training config. Without one, `cross_entropy` is the loss.

A model may also compute part of its initial parameters from training images: it then
defines `init_from_data(model_config, params, images) -> params`, given
`model_config.init_examples` training images (a random sample of the split, fixed by the
config's seed) as float32 [N, H, W, C], as the config's
eval_preprocess (its first view) shows them to the model. It runs once, on the host, before
the first step; the result is in every checkpoint, so a resumed run does not redo it.
"""

import importlib
import pkgutil
from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import optax

from research.errors import UserError


def available() -> list[str]:
  names = (m.name for m in pkgutil.iter_modules(__path__))
  return sorted(n for n in names if not n.startswith("_"))


def cross_entropy(logits, targets, intermediates, config):
  """The default loss: softmax cross-entropy per example in float32, against the targets
  smoothed by `config.label_smoothing`."""
  del intermediates  # what a model's own loss may use
  smoothed = optax.smooth_labels(targets, config.label_smoothing)
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), smoothed)


def loss(model_config: ml_collections.ConfigDict) -> Callable:
  """The model module's `loss`, or `cross_entropy`."""
  module = importlib.import_module(f"research.models.{model_config.name}")
  return getattr(module, "loss", cross_entropy)


def init_from_data(model_config: ml_collections.ConfigDict):
  """The model module's `init_from_data`, or None if it computes nothing from data."""
  module = importlib.import_module(f"research.models.{model_config.name}")
  return getattr(module, "init_from_data", None)


def create(model_config: ml_collections.ConfigDict, axis_name: str | None) -> nn.Module:
  """Imports research.models.<model_config.name> and builds its module."""
  if model_config.name not in available():
    raise UserError(
      f"model.name={model_config.name!r} is not a model; available: {', '.join(available())}"
    )
  module = importlib.import_module(f"research.models.{model_config.name}")
  return module.create(model_config, axis_name)
