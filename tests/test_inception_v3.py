"""Inception-v3: the reference parameter counts, output shapes, bfloat16 compute."""

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from research import models
from research.errors import UserError


def _model(**overrides):
  fields = dict(
    name="inception_v3",
    num_classes=1000,
    aux_logits=True,
    dropout_rate=0.2,
    bn_momentum=0.9997,
    width=1.0,
    blocks=(3, 4, 2),
    dtype="float32",
  )
  return models.create(ml_collections.ConfigDict({**fields, **overrides}), None)


def _init_shapes(model, size=299, train=True):
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
  return jax.eval_shape(lambda: model.init(rngs, jnp.zeros((2, size, size, 3)), train=train))


def _count(tree):
  return sum(x.size for x in jax.tree.leaves(tree))


def test_parameter_count_equals_keras_inception_v3():
  variables = _init_shapes(_model(aux_logits=False))
  assert _count(variables["params"]) == 23_817_352  # Keras: trainable (BN without scale)
  assert _count(variables["batch_stats"]) == 34_432  # Keras: non-trainable (mean, var)


def test_auxiliary_head_adds_the_slim_aux_classifier():
  variables = _init_shapes(_model())
  # conv 1×1 768→128, conv 5×5 128→768, their BN offsets (128 + 768), dense 768→1000.
  aux = 768 * 128 + 5 * 5 * 128 * 768 + 128 + 768 + 768 * 1000 + 1000
  assert _count(variables["params"]) == 23_817_352 + aux


@pytest.mark.parametrize("train", [True, False])
def test_outputs_logits_and_sows_the_aux_logits_in_training_only(train):
  model = _model()
  variables = _init_shapes(model, train=True)
  logits, updates = jax.eval_shape(
    lambda v: model.apply(
      v,
      jnp.zeros((2, 299, 299, 3)),
      train=train,
      rngs={"dropout": jax.random.key(0)},
      mutable=["batch_stats", "intermediates"],
    ),
    variables,
  )
  assert logits.shape == (2, 1000)
  aux = updates.get("intermediates", {}).get("auxiliary_logits", ())
  assert [a.shape for a in aux] == ([(2, 1000)] if train else [])


def _equations(jaxpr):
  """Every equation of `jaxpr`, with those inside calls (the CPU convolution's custom_vjp)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", param)
      if isinstance(inner, jax.extend.core.Jaxpr):
        yield from _equations(inner)


def test_bfloat16_computes_in_bf16_but_keeps_params_and_stats_in_float32():
  model = _model(dtype="bfloat16")
  variables = _init_shapes(model)
  assert {x.dtype for x in jax.tree.leaves(variables)} == {jnp.dtype("float32")}
  jaxpr = jax.make_jaxpr(lambda v: model.apply(v, jnp.zeros((1, 299, 299, 3)), train=False))(
    {"params": variables["params"], "batch_stats": variables["batch_stats"]}
  )
  convs = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "conv_general_dilated"]
  assert convs and all(e.outvars[0].aval.dtype == jnp.bfloat16 for e in convs)
  assert jaxpr.out_avals[0].dtype == jnp.float32  # logits: the loss is computed in float32


def test_too_small_images_are_a_user_error():
  with pytest.raises(UserError, match="auxiliary head needs images of at least 107"):
    _init_shapes(_model(), size=96)
  with pytest.raises(UserError, match="at least 75"):
    _init_shapes(_model(aux_logits=False), size=64)


def test_fewer_blocks_keep_each_block_type_and_out_of_range_counts_are_a_user_error():
  def modules_and_parameters(**overrides):
    params = _init_shapes(_model(aux_logits=False, **overrides), size=75)["params"]
    return len(params), _count(params)  # modules: the ConvBN layers and the dense head

  full, one_each = modules_and_parameters(), modules_and_parameters(blocks=(1, 1, 1))
  # The two Inception-A, three -B and one -C blocks left out take their 7, 10 and 9 ConvBNs.
  assert full[0] - one_each[0] == 2 * 7 + 3 * 10 + 1 * 9
  assert one_each[1] < full[1]
  for bad in ((0, 1, 1), (1, 5, 1), (3, 4)):
    with pytest.raises(UserError, match=r"model.blocks=.* must count 1-3 Inception-A"):
      modules_and_parameters(blocks=bad)
