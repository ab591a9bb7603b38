"""What the configs share: the library's fields (research/fields.py, where each is declared
with its default and unit) and the helpers that apply variants and build one config on another."""

import ml_collections

from research.errors import UserError
from research.fields import library


def training_defaults() -> ml_collections.ConfigDict:
  """Every field the library reads, at its default (research/fields.py): a training config
  starts here, and the parts it names add theirs."""
  return library()


def apply_variant(config: ml_collections.ConfigDict, arg: str | None, variants: dict) -> None:
  """Applies `arg` ("smoke", or several joined by ",") from `variants` {name: fn(config)}."""
  for name in filter(None, (arg or "").split(",")):
    if name not in variants:
      raise UserError(f"unknown config variant {name!r}; choose from: {', '.join(variants)}")
    variants[name](config)


def extend(parent, arg: str | None, variants: dict) -> ml_collections.ConfigDict:
  """A config built on another: `parent` (a config module, with its VARIANTS) gives its
  config and applies the variants of `arg` it has; then `variants` {name: fn(config)} apply
  the rest, in `arg`'s order. `get_config(arg)` of a config that adds an optimizer, say:
  `return extend(cifar_vgg, arg, {"adamw": _adamw})`; `:smoke,adamw` takes both."""
  names = list(filter(None, (arg or "").split(",")))
  known = {**parent.VARIANTS, **variants}
  if unknown := [n for n in names if n not in known]:
    raise UserError(f"unknown config variant {unknown[0]!r}; choose from: {', '.join(known)}")
  config = parent.get_config(",".join(n for n in names if n not in variants) or None)
  apply_variant(config, ",".join(n for n in names if n in variants), variants)
  return config
