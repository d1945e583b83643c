"""Placing a model, a state or a batch on a mesh in one call: test conveniences over
``verltool_jax.sharding``'s rules (production places parameters as it loads them,
``models/hf_io.py``, and batches in the train loop)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from verltool_jax.sharding import PARAM_RULES, batch_sharding, param_spec


def state_shardings(state: nnx.State, mesh: Mesh, rules=PARAM_RULES) -> nnx.State:
    """A pytree like ``state`` holding the ``NamedSharding`` of each parameter (for jit)."""

    def one(path, leaf):
        return NamedSharding(mesh, param_spec(path, np.shape(leaf), mesh, rules))

    return jax.tree_util.tree_map_with_path(one, state)


def shard_state(state: nnx.State, mesh: Mesh, rules=PARAM_RULES) -> nnx.State:
    """``state`` with every array placed in its rule's sharding."""
    return jax.device_put(state, state_shardings(state, mesh, rules))


def shard_model(model: nnx.Module, mesh: Mesh, rules=PARAM_RULES) -> nnx.Module:
    """Place every parameter of ``model`` in its sharding (in place); returns ``model``."""
    nnx.update(model, shard_state(nnx.state(model), mesh, rules))
    return model


def shard_batch(batch: dict, mesh: Mesh) -> dict:
    """Place every array of ``batch`` with its batch dimension over ``(data, fsdp)``."""
    return {k: jax.device_put(v, batch_sharding(mesh, jnp.ndim(v))) for k, v in batch.items()}
