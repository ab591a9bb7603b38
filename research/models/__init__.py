"""Models are found by name: `config.model.name = 'vgg'` loads `research/models/vgg.py`.

Each model module defines `create(model_config, axis_name) -> flax.linen.Module`. The module
is called as `model.apply(variables, images, train=...)` on float images [batch, H, W, C]
and returns logits [batch, num_classes] (Inception-v3 in training returns
`(logits, aux_logits)`). `axis_name` is given to BatchNorm so statistics are averaged across
replicas; it is None outside pmap. `layers.py` holds the layers models share; it is no model.

A model may also compute part of its initial parameters from training images: it then
defines `init_from_data(model_config, params, images) -> params`, given
`model_config.init_examples` training images (a random sample of the split, fixed by the
config's seed) as float32 [N, H, W, C], as the config's
eval_preprocess (its first view) shows them to the model. It runs once, on the host, before
the first step; the result is in every checkpoint, so a resumed run does not redo it.
"""

import importlib
import pkgutil

import flax.linen as nn
import ml_collections

from research.errors import UserError
from research.models.layers import EXAMPLES  # noqa: F401 (steps pass example positions in it)


def available() -> list[str]:
  names = (m.name for m in pkgutil.iter_modules(__path__))
  return sorted(n for n in names if not n.startswith("_") and n != "layers")


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
