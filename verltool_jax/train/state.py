"""``TrainState``: everything the functional train step reads and returns.

``graphdef`` (the static structure of the Flax NNX model) is not a pytree leaf; the
rest are arrays: ``params`` (an ``nnx.State`` of the ``nnx.Param`` variables),
``opt_state`` (optax), ``step`` (int32, number of train steps applied = policy
version), ``rng`` (a raw uint32[2] PRNG key), and ``ref_params`` (frozen reference
policy for the KL loss, ``None`` unless ``algo.kl_coef > 0`` and the trainer does not
supply ``ref_logprobs`` in the batch).
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct


@struct.dataclass
class TrainState:
    graphdef: Any = struct.field(pytree_node=False)
    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    ref_params: Optional[Any] = None

    @classmethod
    def create(cls, model: nnx.Module, optimizer: optax.GradientTransformation,
               seed: int = 0, with_reference: bool = False) -> "TrainState":
        """Split ``model`` into ``(graphdef, params)`` and initialise the optimizer.

        ``with_reference``: keep a frozen copy of the initial params as the KL reference.
        """
        graphdef, params = nnx.split(model, nnx.Param)
        ref = jax.tree.map(jnp.copy, params) if with_reference else None
        return cls(graphdef=graphdef, params=params, opt_state=optimizer.init(params),
                   step=jnp.zeros((), jnp.int32), rng=jax.random.PRNGKey(seed),
                   ref_params=ref)

    def model(self, params: Optional[Any] = None) -> nnx.Module:
        """The NNX module with ``params`` (default: the current ones) merged in."""
        return nnx.merge(self.graphdef, self.params if params is None else params)
