"""What every model module shares: the registry of models (`register`) and the dtype their
logits and losses are kept in. The package (research/models/__init__.py) re-exports them; its
models import them from here."""

import jax.numpy as jnp

from research.registry import Registry

MODELS = Registry("model", "model.name", "research.models")
register = MODELS.register


def at_least_float32(x) -> jnp.dtype:
  """`x`'s dtype, or float32 where it is narrower (bfloat16): what logits, losses and eval sums
  are kept in; a float64 model's stay float64."""
  return jnp.promote_types(x.dtype, jnp.float32)
