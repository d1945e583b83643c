"""The trainer's logprobs under the sampler's top-k / top-p truncation
(``models.logprobs.truncated_logprobs``): the identity without truncation, a numpy
reference with it, agreement with the JAX sampler's own logprob, the chunked path and
its gradient, and the config that turns it on."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from verltool_jax.algos.config import algo_config
from verltool_jax.models.logprobs import chunked_logprobs, truncated_logprobs
from verltool_jax.samplers.sampling_ops import sample_tokens


def _numpy_truncated(z, y, top_k, top_p):
    """float64: sort descending, keep the top_k, then the prefix whose mass before a token
    is below top_p (the crossing token kept); the target always kept; renormalise."""
    z = z.astype(np.float64)
    order = np.argsort(-z, kind="stable")
    k = top_k if top_k > 0 else len(z)
    kept = order[:k]
    p = np.exp(z[kept] - z[kept].max())
    p /= p.sum()
    before = np.cumsum(p) - p
    kept = set(kept[before < top_p].tolist()) | {int(y)}
    idx = np.array(sorted(kept))
    lse = np.log(np.exp(z[idx] - z[idx].max()).sum()) + z[idx].max()
    return z[y] - lse


@pytest.mark.parametrize("top_k", [-1, 0])
def test_no_truncation_is_the_identity(top_k):
    z = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 17)) * 3
    y = jax.random.randint(jax.random.PRNGKey(1), (3, 5), 0, 17)
    got = truncated_logprobs(z, y, top_k=top_k, top_p=1.0)
    want = jnp.take_along_axis(jax.nn.log_softmax(z, -1), y[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("top_k", "top_p"), [(3, 1.0), (-1, 0.8), (5, 0.6), (1, 1.0)])
def test_truncation_matches_a_numpy_reference(top_k, top_p):
    rng = np.random.default_rng(top_k + int(top_p * 10))
    z = rng.normal(0, 2, (4, 6, 23)).astype(np.float32)
    y = rng.integers(0, 23, (4, 6))
    y[:, :3] = np.argsort(-z, -1)[:, :3, 0]  # half the targets are each row's top token
    got = np.asarray(truncated_logprobs(jnp.asarray(z), jnp.asarray(y), top_k, top_p))
    want = np.vectorize(
        lambda b, t: _numpy_truncated(z[b, t], y[b, t], top_k, top_p), otypes=[float]
    )(*np.indices(y.shape))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.all(got <= 1e-6)
    # a kept token's renormalised logprob is at least its untruncated one
    full = np.take_along_axis(np.asarray(jax.nn.log_softmax(jnp.asarray(z), -1)), y[..., None], -1)
    assert np.all(got >= full[..., 0] - 1e-6)


def test_equals_the_jax_samplers_reported_logprob():
    z = jax.random.normal(jax.random.PRNGKey(3), (8, 31)) * 2
    keys = jax.random.split(jax.random.PRNGKey(4), 8)
    tok, lp = sample_tokens(z, jnp.ones(8), jnp.full(8, 4), jnp.full(8, 0.7), keys)
    got = truncated_logprobs(z, tok, top_k=4, top_p=0.7)
    np.testing.assert_allclose(np.asarray(got), np.asarray(lp), rtol=1e-5, atol=1e-6)


def test_chunked_path_and_gradient_match_full_logits():
    kh, kw, kt = jax.random.split(jax.random.PRNGKey(5), 3)
    h = jax.random.normal(kh, (2, 7, 8))
    w = jax.random.normal(kw, (8, 29))
    y = jax.random.randint(kt, (2, 7), 0, 29)
    T = 0.7

    def full(w):
        lp, ent = truncated_logprobs(
            jnp.einsum("bth,hv->btv", h, w) / T, y, 5, 0.9, return_entropy=True
        )
        return lp.sum() + 0.5 * ent.sum(), (lp, ent)

    def chunked(w):
        lp, ent = chunked_logprobs(h, w, y, T, 3, return_entropy=True, top_k=5, top_p=0.9)
        return lp.sum() + 0.5 * ent.sum(), (lp, ent)

    (_, (lp_f, ent_f)), g_f = jax.value_and_grad(full, has_aux=True)(w)
    (_, (lp_c, ent_c)), g_c = jax.value_and_grad(chunked, has_aux=True)(w)
    np.testing.assert_allclose(np.asarray(lp_c), np.asarray(lp_f), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent_c), np.asarray(ent_f), rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(np.asarray(g_c)))
    np.testing.assert_allclose(np.asarray(g_c), np.asarray(g_f), rtol=1e-4, atol=1e-5)
    plain = chunked_logprobs(h, w, y, T, 3)  # the untruncated path is unchanged
    assert np.all(np.asarray(lp_c) >= np.asarray(plain) - 1e-5)


def test_config_turns_it_on_only_when_the_sampler_truncates():
    from verltool_jax.run_config import run_config_from_dict

    assert algo_config().truncation() == {}
    cfg = algo_config(top_p=0.9, top_k=-1)
    assert cfg.truncation() == {"top_k": -1, "top_p": 0.9}
    assert dataclasses.replace(cfg, truncated_logprobs=False).truncation() == {}
    rc = run_config_from_dict({"rollout": {"top_p": 0.8, "top_k": 20}})
    assert rc.algo_for_run().truncation() == {"top_k": 20, "top_p": 0.8}
