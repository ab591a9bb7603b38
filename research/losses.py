"""Training losses, found by name: `config.loss` names one for any model.

A loss is `loss(logits, targets, intermediates, config) -> [batch]` per-example losses, where
`targets` are class probabilities [batch, num_classes] (one-hot, or mixed by an augmentation
such as mixup), `intermediates` what the model sowed there in training
(`self.sow("intermediates", name, value)`) and `config` its view of the config: a loss's
fields (`label_smoothing`, ...: research/fields.py) and those it declares. A fork registers
its own with `@research.losses.register("name", fields={...})` in a module of
`config.modules`.
The eval reports cross-entropy whatever the training loss is, and its record says so.
"""

import optax

from research.fields import KINDS
from research.models.base import at_least_float32
from research.registry import Registry

LOSSES = Registry("loss", "loss", "research.losses")
register = LOSSES.register


def reads(name: str) -> tuple:
  """The config fields the loss `name` reads: a loss's and those it declares."""
  return (*KINDS["loss"], *LOSSES.declared[name])


@register("cross_entropy")
def cross_entropy(logits, targets, intermediates, fields):
  """Softmax cross-entropy per example in at least float32 (float64 for float64 logits),
  against the targets smoothed by `fields.label_smoothing`."""
  del intermediates  # what other losses may use
  smoothed = optax.smooth_labels(targets, fields.label_smoothing)
  return optax.softmax_cross_entropy(logits.astype(at_least_float32(logits)), smoothed)


@register("auxiliary_cross_entropy")
def auxiliary_cross_entropy(logits, targets, intermediates, fields):
  """Cross-entropy of the logits plus `fields.aux_loss_weight` × that of each auxiliary head
  the model sowed as `auxiliary_logits` (Inception-v3's; none: plain cross-entropy)."""
  losses = cross_entropy(logits, targets, intermediates, fields)
  for aux_logits in intermediates.get("auxiliary_logits", ()):
    losses += fields.aux_loss_weight * cross_entropy(aux_logits, targets, intermediates, fields)
  return losses
