"""Pure, jittable token sampling with per-row temperature, top-k, top-p and seeds.

Per row b with logits ``l``: ``z = l / T_b``; top-k keeps the ``k`` largest ``z``; top-p
keeps the smallest prefix of the sorted distribution whose mass reaches ``p`` (the token
that crosses ``p`` is kept); everything else is ``-inf``. The token is drawn from
``softmax(z_kept)`` and its logprob is ``log_softmax(z_kept)[token]`` -- equal to
``log_softmax(l / T)[token]`` when no truncation is active, as vLLM's
``processed_logprobs``. Greedy rows (``T == 0``) take ``argmax l`` with logprob
``log_softmax(l)[token]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from verltool_jax.truncation import truncate_logits

__all__ = ["row_keys", "sample_tokens", "truncate_logits"]


def row_keys(seeds: jnp.ndarray, counters: jnp.ndarray) -> jnp.ndarray:
    """One PRNG key per row: ``fold_in(PRNGKey(seed_b), counter_b)`` (counter = tokens so far)."""
    return jax.vmap(lambda s, n: jax.random.fold_in(jax.random.PRNGKey(s), n))(
        seeds.astype(jnp.uint32), counters.astype(jnp.uint32)
    )


def sample_tokens(
    logits: jnp.ndarray,
    temperature: jnp.ndarray,
    top_k: jnp.ndarray,
    top_p: jnp.ndarray,
    keys: jnp.ndarray,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Sample one token per row -> ``(tokens [B] int32, logprobs [B] float32)`` (see module doc)."""
    logits = logits.astype(jnp.float32)
    greedy = temperature <= 0
    z = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    zk = truncate_logits(z, top_k, top_p)
    drawn = jax.vmap(jax.random.categorical)(keys, zk)
    tok = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
    lp_sampled = jax.nn.log_softmax(zk, axis=-1)
    lp_greedy = jax.nn.log_softmax(logits, axis=-1)
    pick = lambda a: jnp.take_along_axis(a, tok[:, None], axis=-1)[:, 0]
    return tok, jnp.where(greedy, pick(lp_greedy), pick(lp_sampled))
