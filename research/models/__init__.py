"""Models, found by name: `config.model.name = 'vgg'` is the model registered as 'vgg'.

A model is `create(model_config, axis_name) -> flax.linen.Module` decorated with
`@research.models.register("name")`, in `research/models/` or in a fork's module named in
`config.modules`. The module is plain flax (`nn.Conv`, `nn.Dropout`, `nn.BatchNorm`, ...),
called as `model.apply(variables, images, train=...)` on float images [batch, H, W, C],
returning logits [batch, num_classes]. `axis_name` is the pmap axis ('batch', as flax's
examples name it; None outside pmap) for BatchNorm, so statistics are averaged across
replicas: a model copied from a flax codebase that names 'batch' itself runs as written.
Dropout draws from the "dropout" rng collection. The step applies its own forms from outside
the model (research/steps.py: a dropout mask per example; its CPU forms: faster
convolutions on CPU). Only max-pooling, a function no interceptor reaches, is called by name:
the shipped models use `cpu_forms.max_pool`. The loss is the config's (research/losses.py).

A model may also compute part of its initial parameters from training images: its module
then defines `init_from_data(model_config, params, images) -> params`, given
`model_config.init_examples` training images (a random sample of the split, fixed by the
config's seed) as float32 [N, H, W, C], as the config's eval_preprocess (its first view)
shows them to the model. Where the module also defines `data_statistics(model_config,
images) -> arrays` (traceable by JAX), that runs on the device instead, compiled with the
preprocessing before the run's clock starts, and `init_from_data` gets its result on the
host in place of the images. Either runs once, before the first step; the result is in every
checkpoint, so a resumed run does not redo it.
"""

import sys
from collections.abc import Callable

import flax.linen as nn
import ml_collections

from research.registry import Registry

MODELS = Registry("model", "model.name")
register = MODELS.register


def create(model_config: ml_collections.ConfigDict, axis_name: str | None) -> nn.Module:
  """The flax module of the model registered as `model_config.name`."""
  return MODELS.get(model_config.name)(model_config, axis_name)


def init_from_data(model_config: ml_collections.ConfigDict) -> tuple[Callable, Callable] | None:
  """(data_statistics, init_from_data) of the model's module (the statistics are the images
  themselves where it defines none), or None if it computes nothing from data."""
  module = sys.modules[MODELS.get(model_config.name).__module__]
  if not hasattr(module, "init_from_data"):
    return None
  return getattr(module, "data_statistics", lambda _, images: images), module.init_from_data


# The shipped models register themselves on import.
from research.models import inception_v3, keras_cnn, speedrun, vgg  # noqa: E402, F401
