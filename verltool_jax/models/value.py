"""The critic of PPO (``algo.adv_estimator = "gae"``): a value model in Flax NNX.

A *separate* model, not a second head on the policy: a copy of the policy (its backbone,
with the policy's weights at the start of RL) and ``value_head``, a linear map of the
final-norm hidden state ``[B,T,H] -> [B,T]``. This is verl's layout (its critic is its
own model, by default initialised from the actor's checkpoint): the two never share a
gradient, so the value loss cannot pull the policy's representation and needs no
weighting against the policy loss, and each has its own optimizer. It costs a second
copy of the weights and one more forward/backward pass per step.

The head starts at zero (weights and bias), so every value is 0 before the first update
and the first GAE advantages are the plain returns; the head's gradient is the hidden
state, so it learns from the first step. The copy keeps the policy's output projection
(unused; it gets zero gradient). Parameters are sharded by the policy's partition rules
(``verltool_jax.sharding.PARAM_RULES``, which name ``value_head`` too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class ValueModel(nnx.Module):
    """``values = value_head(backbone.hidden_states(...))``: float32 ``[B,T]``."""

    def __init__(self, backbone: nnx.Module):
        config = getattr(backbone, "config", None)
        if config is None or not hasattr(backbone, "hidden_states"):
            raise ValueError(
                "ValueModel needs a policy model (models.transformer.Transformer or a "
                f"vision-language model) as its backbone, got {type(backbone).__name__}"
            )
        self.config = config
        self.backbone = backbone
        self.value_head = nnx.Linear(
            config.hidden_size,
            1,
            kernel_init=nnx.initializers.zeros_init(),
            bias_init=nnx.initializers.zeros_init(),
            param_dtype=jnp.float32,
            rngs=nnx.Rngs(0),  # zero init: the key is not read
        )

    def __call__(self, input_ids, attention_mask=None, **extra) -> jax.Array:
        """Values ``[B,T]`` float32: V(s_t) at every position (``extra``: ``positions`` /
        ``row_images`` of a vision-language batch, passed to ``hidden_states``)."""
        h = self.backbone.hidden_states(input_ids, attention_mask, **extra)
        return self.value_head(h.astype(jnp.float32))[..., 0]


def value_model_from_policy(policy: nnx.Module, mesh=None) -> ValueModel:
    """A :class:`ValueModel` on a copy of ``policy`` (its weights copied in the shardings
    they have, the policy left untouched); with ``mesh``, the value head placed by the
    policy's partition rules (``verltool_jax.sharding.param_spec``)."""
    graphdef, state = nnx.split(policy)
    critic = ValueModel(nnx.merge(graphdef, jax.tree.map(jnp.copy, state)))
    if mesh is not None:
        from jax.sharding import NamedSharding

        from verltool_jax.sharding import param_spec

        def place(path, x):
            spec = param_spec(("value_head", *path), x.shape, mesh)
            return jax.device_put(x, NamedSharding(mesh, spec))

        head = nnx.state(critic.value_head, nnx.Param)
        nnx.update(critic.value_head, jax.tree_util.tree_map_with_path(place, head))
    return critic
