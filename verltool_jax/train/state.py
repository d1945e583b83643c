"""``TrainState``: everything the functional train step reads and returns.

``graphdef`` (the static structure of the Flax NNX model) is not a pytree leaf; the
rest are arrays: ``params`` (an ``nnx.State`` of the ``nnx.Param`` variables),
``opt_state`` (optax), ``step`` (int32, number of train steps applied = policy
version), ``rng`` (a raw uint32[2] PRNG key), and ``ref_params`` (frozen reference
policy for the KL loss, ``None`` unless ``algo.kl_coef > 0`` and the trainer does not
supply ``ref_logprobs`` in the batch).

The critic of PPO (``algo.adv_estimator = "gae"``, :mod:`verltool_jax.models.value`),
when the run has one (:meth:`TrainState.with_critic`; ``None`` otherwise): ``value_params``
(all its ``nnx.Param`` variables, all trained), ``value_opt_state`` (its own optimizer)
and the static ``value_graphdef``.

``trainable`` (static) is the nnx filter of the parameters that train: all of them, or
only the LoRA adapters (``models.lora.trainable_filter``). The optimizer state covers
the trainable part only; the train steps differentiate with respect to it alone
(:meth:`split_trainable` / :meth:`join`), so frozen weights cost no weight gradients and
the backward pass stops below the lowest trainable layer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct


class TrainState(struct.PyTreeNode):  # a frozen flax struct dataclass with a typed replace()
    graphdef: Any = struct.field(pytree_node=False)
    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    ref_params: Any | None = None
    trainable: Any = struct.field(pytree_node=False, default=nnx.Param)
    value_graphdef: Any = struct.field(pytree_node=False, default=None)
    value_params: Any | None = None
    value_opt_state: Any | None = None

    @classmethod
    def create(
        cls,
        model: nnx.Module,
        optimizer: optax.GradientTransformation,
        seed: int = 0,
        with_reference: bool = False,
    ) -> TrainState:
        """Split ``model`` into ``(graphdef, params)`` and initialise the optimizer on the
        trainable params (all, or the LoRA adapters when the model has them).

        ``with_reference``: keep a frozen copy of the initial params as the KL reference.
        """
        from verltool_jax.models.lora import trainable_filter

        graphdef, params = nnx.split(model, nnx.Param)
        trainable = trainable_filter(getattr(model, "config", None))
        ref = jax.tree.map(jnp.copy, params) if with_reference else None
        state = cls(
            graphdef=graphdef,
            params=params,
            opt_state=None,
            step=jnp.zeros((), jnp.int32),
            rng=jax.random.PRNGKey(seed),
            ref_params=ref,
            trainable=trainable,
        )
        return state.replace(opt_state=optimizer.init(state.split_trainable()[0]))

    def with_critic(
        self, value_model: nnx.Module, optimizer: optax.GradientTransformation
    ) -> TrainState:
        """This state with the critic ``value_model`` (``models.value.ValueModel``) and
        ``optimizer``'s state initialised on all of its params."""
        graphdef, params = nnx.split(value_model, nnx.Param)
        return self.replace(
            value_graphdef=graphdef, value_params=params, value_opt_state=optimizer.init(params)
        )

    @property
    def has_critic(self) -> bool:
        return self.value_params is not None

    def split_trainable(self, params: Any | None = None) -> tuple[Any, Any]:
        """``(trainable, frozen)`` parts of ``params`` (default: the current ones); the
        frozen part is empty when everything trains."""
        p = self.params if params is None else params
        if self.trainable is nnx.Param:
            return p, None
        trainable, frozen = nnx.split_state(p, self.trainable, ...)  # two filters, two parts
        return trainable, frozen

    def join(self, trainable: Any, frozen: Any) -> Any:
        """The full param state from the two parts of :meth:`split_trainable`."""
        return trainable if frozen is None else nnx.merge_state(trainable, frozen)

    def model(self, params: Any | None = None) -> nnx.Module:
        """The NNX module with ``params`` (default: the current ones) merged in."""
        return nnx.merge(self.graphdef, self.params if params is None else params)

    def sampler_params(self) -> Any:
        """The params the samplers serve: all of them, or with LoRA the base and its
        adapters as ``models.lora.AdapterWeights`` (the publisher merges them unless
        ``sampler.lora_sync="adapter"``)."""
        from verltool_jax.models.lora import AdapterWeights

        if self.trainable is nnx.Param:
            return self.params
        return AdapterWeights(self.params, self.graphdef_config())

    def graphdef_config(self):
        """The model's ``ModelConfig``."""
        # every policy model (models.transformer, models.vision_language) has .config
        return self.model().config  # type: ignore[attr-defined]
