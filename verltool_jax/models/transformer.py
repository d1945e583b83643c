"""``Transformer``: the decoder-only policy (Qwen2 / Qwen3 / Llama) in Flax NNX.

One code path; the family switches come from :class:`ModelConfig`. Parameters are
``nnx.Param`` leaves, so the functional trainer can do
``graphdef, params = nnx.split(model, nnx.Param)`` and ``nnx.merge`` inside jit. Parameter
paths (used by ``name_maps``): ``embed/embedding [V,H]``,
``layers/<i>/{input_norm,post_attn_norm}/weight``,
``layers/<i>/attn/{q,k,v,o}_proj/{kernel [in,out], bias}``, ``layers/<i>/attn/{q,k}_norm/weight``,
``layers/<i>/mlp/{gate,up,down}_proj/kernel``, ``final_norm/weight``, ``lm_head/kernel [H,V]``
(absent when embeddings are tied).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from ..sharding import constrain_activations
from .config import ModelConfig
from .layers import DecoderLayer, RMSNorm, _linear, dtype_of

REMAT_JAX_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat_call(fn, module: nnx.Module, *args, policy: str):
    """``fn(module, *args)`` rematerialised in the backward pass under ``policy`` (a key of
    ``REMAT_JAX_POLICIES``): the module is split into its graph and state and the state goes
    through ``jax.checkpoint`` as an argument, so parameters that are tracers of different
    transforms (LoRA adapters under ``grad``, frozen base weights closed over by ``jit``)
    are read, never written back (``nnx.remat`` writes them back and refuses that mix)."""
    graphdef, state = nnx.split(module)

    def pure(state, *args):
        return fn(nnx.merge(graphdef, state), *args)

    return jax.checkpoint(pure, policy=REMAT_JAX_POLICIES[policy])(state, *args)


def default_positions(attention_mask: jnp.ndarray) -> jnp.ndarray:
    """``positions = max(cumsum(mask) - 1, 0)``: real tokens count 0, 1, 2, ... whatever the padding."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def causal_padding_mask(attention_mask: jnp.ndarray) -> jnp.ndarray:
    """``[B,T,T]`` bool: query t sees key s iff ``s <= t`` and key s is a real token."""
    T = attention_mask.shape[-1]
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    return causal[None] & (attention_mask.astype(bool)[:, None, :])


def text_only_error(config: ModelConfig) -> str:
    """The message for images given to a model without a vision tower."""
    return (
        f"model_type {config.model_type!r} is text-only and cannot take images; use a "
        f"vision-language checkpoint (model_type qwen2_5_vl or qwen2_vl)"
    )


def _layer_call(layer, x, positions, mask):
    return layer(x, positions, mask)[0]


def _shared_layer_call(layer, xs, pos_p, mask_p, pos_r, mask_r, group_size: int):
    """One layer of the shared-prefix forward (``Transformer.shared_prefix_hidden``):
    ``xs = (x_prefix [G,P,H], x_rows [G*n,T,H])``. The prefixes attend causally over
    themselves; each row attends over its group's prefix keys and values (repeated n
    times: autodiff of the repeat sums the n rows' gradients into the one prefix) then
    causally over its own tokens."""
    x_p, x_r = xs
    y_p, (k, v) = layer(x_p, pos_p, mask_p)
    kv = (jnp.repeat(k, group_size, axis=0), jnp.repeat(v, group_size, axis=0))
    return y_p, layer(x_r, pos_r, mask_r, prefix_kv=kv)[0]


def _constrain(x):
    return jax.tree.map(constrain_activations, x)


def layer_runs(layers: Sequence[nnx.Module]) -> list[tuple[nnx.GraphDef, list[nnx.State]]]:
    """``layers`` split into runs of consecutive layers of one structure: the same graph
    (so the same code, LoRA adapters in the same places) and parameters of the same shapes
    and dtypes. Each run is ``(graphdef, [state of each layer])``."""
    runs: list[tuple[nnx.GraphDef, list[nnx.State]]] = []
    sig_of_last = None
    for layer in layers:
        graphdef, state = nnx.split(layer)
        sig = (
            graphdef,
            jax.tree.structure(state),
            tuple((a.shape, a.dtype) for a in jax.tree.leaves(state)),
        )
        if runs and sig == sig_of_last:
            runs[-1][1].append(state)
        else:
            runs.append((graphdef, [state]))
        sig_of_last = sig
    return runs


def scan_run(
    graphdef: nnx.GraphDef,
    states: Sequence[nnx.State],
    x,
    aux: tuple,
    policy: str,
    call=_layer_call,
):
    """``x`` through the layers ``merge(graphdef, s) for s in states``, in order, as one
    ``lax.scan`` over their stacked parameters (XLA compiles the layer once, not once per
    layer); each layer is ``call(layer, x, *aux)`` (``x`` may be a pytree of activations).
    With a remat ``policy`` other than ``none`` the scanned body is checkpointed, so
    the backward pass keeps only each layer's input ``[B,T,H]`` and recomputes the layer's
    inside from it: on the CPU backend the per-layer ``jax.checkpoint`` of an unrolled loop
    lowers no peak memory (XLA schedules the recomputation early), a loop's iterations it
    cannot look across do. Same math as the unrolled loop; the stacking copies the run's
    parameters once per call."""
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *states)

    def body(h, state):
        return _constrain(call(nnx.merge(graphdef, state), h, *aux)), None

    if policy != "none":
        body = jax.checkpoint(body, policy=REMAT_JAX_POLICIES[policy], prevent_cse=False)
    return jax.lax.scan(body, x, stacked)[0]


class Transformer(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        cfg = config
        self.config = cfg
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=dtype_of(cfg.dtype),
            param_dtype=dtype_of(cfg.param_dtype),
            embedding_init=nnx.initializers.normal(0.02),
            rngs=rngs,
        )
        self.layers = nnx.List([DecoderLayer(cfg, rngs, i) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs)

    # -------------------------------------------------------------------- backbone
    def backbone(
        self,
        input_ids,
        positions,
        mask,
        kv_caches: Sequence | None = None,
        write_index=0,
        inputs_embeds=None,
    ):
        """Embed, run every layer, final norm: ``-> (hidden [B,T,H], new_kv_caches)``.

        ``mask [B,T,S]`` (see ``Attention``; causal when there are no caches);
        ``kv_caches`` is a per-layer sequence of
        ``(k, v)`` caches or None (plain forward, with per-layer remat as configured; when
        ``config.scans_layers`` runs of identical layers go through ``scan_run``).
        ``inputs_embeds [B,T,H]`` replaces the token embeddings when given (a VL model
        passes the text embeddings with its image features scattered in).
        """
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        x = constrain_activations(inputs_embeds.astype(dtype_of(self.config.dtype)))
        if kv_caches is None:
            return self.final_norm(self._run_layers(x, _layer_call, (positions, mask))), None
        new_caches = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, positions, mask, kv_caches[i], write_index)
            new_caches.append(kv)
            x = constrain_activations(x)
        return self.final_norm(x), new_caches

    def _run_layers(self, x, call, aux: tuple):
        """The plain forward (no KV cache) of every layer: ``x = call(layer, x, *aux)``,
        each layer rematerialised as ``config.remat_policy`` says, and runs of identical
        layers in one ``scan_run`` when ``config.scans_layers``."""
        policy = self.config.remat_policy
        if not self.config.scans_layers:
            for layer in self.layers:
                x = self._one_layer(layer, x, call, aux)
            return x
        for graphdef, states in layer_runs(self.layers):
            if len(states) == 1:
                x = self._one_layer(nnx.merge(graphdef, states[0]), x, call, aux)
            else:
                x = scan_run(graphdef, states, x, aux, policy, call)
        return x

    def _one_layer(self, layer, x, call, aux: tuple):
        """One layer of the plain forward, rematerialised as ``config.remat_policy`` says."""
        policy = self.config.remat_policy
        if policy == "none":
            x = call(layer, x, *aux)
        else:
            x = remat_call(call, layer, x, *aux, policy=policy)
        return _constrain(x)

    def shared_prefix_hidden(self, prefix_ids, prefix_mask, input_ids, attention_mask):
        """Final-norm hidden states ``[G*n,T,H]`` of rows that continue a shared prefix:
        row b continues prefix ``b // n`` (``n = G*n / G``, rows grouped in order).

        ``prefix_ids, prefix_mask [G,P]`` (left- or right-padded), ``input_ids,
        attention_mask [G*n,T]`` (right-padded). Row b's token t sits at position
        ``len(prefix_{b//n}) + t`` and sees every real token of its prefix and its own
        tokens up to t, so its hidden states are those of the concatenated sequence
        ``prefix + row``; the prefix runs once per group, not once per row (each prefix's
        keys and values are broadcast to its rows, and autodiff sums the rows' gradients
        back into it). Used by the train step on a shared-prompt batch
        (``train.batch``); text-only."""
        G, P = prefix_ids.shape
        B, T = input_ids.shape
        if prefix_mask.shape != (G, P) or attention_mask.shape != (B, T):
            raise ValueError(
                f"prefix_mask {prefix_mask.shape} must be prefix_ids' {(G, P)} and "
                f"attention_mask {attention_mask.shape} input_ids' {(B, T)}"
            )
        if G == 0 or B % G:
            raise ValueError(f"{B} rows cannot be split into groups of the {G} prefixes")
        n = B // G
        dt = dtype_of(self.config.dtype)
        pos_p = default_positions(prefix_mask)
        start = jnp.repeat(prefix_mask.astype(jnp.int32).sum(-1), n)
        pos_r = start[:, None] + default_positions(attention_mask)
        seen = jnp.repeat(prefix_mask.astype(bool), n, axis=0)[:, None, :]
        mask_r = jnp.concatenate(
            [jnp.broadcast_to(seen, (B, T, P)), causal_padding_mask(attention_mask)], axis=-1
        )
        xs = _constrain((self.embed(prefix_ids).astype(dt), self.embed(input_ids).astype(dt)))
        call = functools.partial(_shared_layer_call, group_size=n)
        aux = (pos_p, causal_padding_mask(prefix_mask), pos_r, mask_r)
        return self.final_norm(self._run_layers(xs, call, aux)[1])

    def hidden_states(
        self,
        input_ids,
        attention_mask=None,
        positions=None,
        inputs_embeds=None,
        images=None,
        row_images=None,
    ) -> jnp.ndarray:
        """Final-norm hidden states ``[B,T,H]`` (in ``config.dtype``). ``images`` /
        ``row_images`` are for the vision-language subclass; a text-only model raises if
        given any."""
        if images is not None or row_images is not None:
            raise ValueError(text_only_error(self.config))
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {attention_mask.shape} must equal "
                f"input_ids shape {input_ids.shape}"
            )
        if positions is None:
            positions = default_positions(attention_mask)
        h, _ = self.backbone(
            input_ids, positions, causal_padding_mask(attention_mask), inputs_embeds=inputs_embeds
        )
        return h

    # ------------------------------------------------------------------ output head
    def lm_head_weight(self) -> jnp.ndarray:
        """The output projection ``[H, V]`` (the transposed embedding when tied)."""
        if self.config.tie_word_embeddings:
            return self.embed.embedding[...].T
        return self.lm_head.kernel[...]

    def project(self, hidden: jnp.ndarray) -> jnp.ndarray:
        """``logits = hidden @ W_out`` in float32 (float64 for a float64 model)
        (``[..., H] -> [..., V]``)."""
        w = self.lm_head_weight().astype(hidden.dtype)
        return jnp.einsum(
            "...h,hv->...v",
            hidden,
            w,
            preferred_element_type=jnp.promote_types(hidden.dtype, jnp.float32),
        )

    def __call__(self, input_ids, attention_mask=None, positions=None, images=None) -> jnp.ndarray:
        """``logits [B,T,V]`` float32; ``attention_mask`` 1 = token, 0 = padding (left or right)."""
        return self.project(self.hidden_states(input_ids, attention_mask, positions, images=images))
