"""LoRA adapters: identity at start, merged == unmerged logits, only adapters train (and
the backward pass skips the frozen layers below them), samplers and exports get merged
weights, and a LoRA run trains end to end through the real trainer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from support.train import MODEL_CFG as _CFG
from support.train import batch

from verltool_jax.models.hf_io import hf_named_tensors, load_hf, save_hf
from verltool_jax.models.lora import fold_lora, sampler_params, with_lora
from verltool_jax.models.transformer import Transformer
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step


def _flat(state) -> dict:
    return {
        k: np.asarray(v.get_value() if isinstance(v, nnx.Variable) else v)
        for k, v in nnx.to_flat_state(state)
    }


MODEL_CFG = _CFG.replace(model_type="llama")  # writable as an HF checkpoint


def new_model(seed: int = 0) -> Transformer:
    return Transformer(MODEL_CFG, nnx.Rngs(seed))


def _lora_model(last_layers=0, targets=("q_proj", "v_proj", "down_proj"), seed=0):
    m = with_lora(
        new_model(seed), rank=4, alpha=8.0, targets=targets, last_layers=last_layers, seed=seed
    )
    # non-zero B so the adapters change the function
    for path, v in nnx.to_flat_state(nnx.state(m, nnx.LoRAParam)):
        if path[-1] == "lora_b":
            v.set_value(jax.random.normal(jax.random.PRNGKey(len(path)), v.shape) * 0.05)
    return m


IDS = jnp.asarray([[3, 9, 4, 1, 0, 0], [7, 7, 2, 5, 6, 8]])
MASK = jnp.asarray([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])


def test_adapters_start_as_identity_and_sit_where_configured():
    # layers one by one in both (the adapters split the layers into runs the plain model
    # would scan), so the outputs can be compared bit for bit
    base = Transformer(MODEL_CFG.replace(scan_layers=False), nnx.Rngs(0))
    m = with_lora(base, rank=4, alpha=8.0, targets=("q_proj", "gate_proj"), last_layers=1)
    np.testing.assert_array_equal(np.asarray(m(IDS, MASK)), np.asarray(base(IDS, MASK)))
    paths = {k[:-1] for k, _ in nnx.to_flat_state(nnx.state(m, nnx.LoRAParam))}
    last = MODEL_CFG.num_layers - 1
    assert paths == {("layers", last, "attn", "q_proj"), ("layers", last, "mlp", "gate_proj")}
    assert m.config.lora_scale == 2.0
    with pytest.raises(ValueError, match="lora_targets"):
        with_lora(base, rank=4, alpha=8.0, targets=("qkv",))


def test_merged_weights_give_the_unmerged_logits():
    m = _lora_model()
    unmerged = np.asarray(m(IDS, MASK))
    folded = sampler_params(m)
    assert not any(k[-1] in ("lora_a", "lora_b") for k, _ in nnx.to_flat_state(folded))
    plain = Transformer(MODEL_CFG, nnx.Rngs(1))
    nnx.update(plain, folded)
    merged = np.asarray(plain(IDS, MASK))
    assert np.abs(unmerged - np.asarray(new_model()(IDS, MASK))).max() > 1e-3  # adapters act
    np.testing.assert_allclose(merged, unmerged, atol=2e-5, rtol=0)


def test_hf_export_and_sync_tensors_are_merged(tmp_path):
    m = _lora_model()
    save_hf(m, tmp_path / "hf")
    back = load_hf(tmp_path / "hf")
    np.testing.assert_allclose(
        np.asarray(back(IDS, MASK)), np.asarray(m(IDS, MASK)), atol=2e-5, rtol=0
    )
    # a bare state with adapters and a config without them: an error, never dropped silently
    with pytest.raises(ValueError, match="lora_rank=0"):
        list(hf_named_tensors(nnx.state(m, nnx.Param), MODEL_CFG))


def test_only_adapters_train_and_frozen_layers_get_no_backward():
    m = _lora_model(last_layers=1)
    opt = optax.adam(1e-2)
    state = TrainState.create(m, opt)
    train_p, frozen = state.split_trainable()
    assert all(k[-1] in ("lora_a", "lora_b") for k, _ in nnx.to_flat_state(train_p))
    # optimizer moments exist for the adapters only
    n_opt = sum(x.size for x in jax.tree.leaves(state.opt_state))
    n_lora = sum(x.size for x in jax.tree.leaves(train_p))
    assert n_opt == 2 * n_lora + 1  # mu, nu (+ the step count)
    before = _flat(state.params)
    step = make_train_step(
        dict(mini_batch_size=None, micro_batch_size=None), state.graphdef, opt, donate=False
    )
    new, metrics = step(state, batch(0))
    assert np.isfinite(float(metrics["loss"]))
    after = _flat(new.params)
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert changed and all(k[-1] in ("lora_a", "lora_b") for k in changed)
    # the sampler view folds the trained adapters in: it differs from the base kernels
    sp = _flat(new.sampler_params().merged())
    k = next(iter(changed))[:-1] + ("kernel",)
    assert not np.array_equal(sp[k], before[k])

    # the gradient graph has no matmul for the frozen first layer's weights: the backward
    # of a LoRA-on-the-last-layer model has fewer dots than full fine-tuning's
    def backward_dots(st):
        tp, fr = st.split_trainable()
        f = lambda t: jnp.sum(st.model(st.join(t, fr))(IDS, MASK))
        dots = lambda g: str(jax.make_jaxpr(g)(tp)).count("dot_general")
        return dots(jax.grad(f)) - dots(f)

    # (layers one by one: a jaxpr holds a scanned layer's dots once for all its layers)
    full = TrainState.create(Transformer(MODEL_CFG.replace(scan_layers=False), nnx.Rngs(0)), opt)
    assert backward_dots(state) < 0.5 * backward_dots(full)


def test_fold_is_exact_for_a_hand_computed_case():
    m = _lora_model(targets=("o_proj",))
    st = nnx.state(m, nnx.Param)
    flat = _flat(st)
    p = ("layers", 0, "attn", "o_proj")
    want = flat[p + ("kernel",)] + 2.0 * flat[p + ("lora_a",)] @ flat[p + ("lora_b",)]
    got = _flat(fold_lora(st, 2.0))[p + ("kernel",)]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("policy", ["full", "dots"])
def test_remat_with_adapters_gives_the_same_loss_and_gradient(policy):
    """Per-layer remat with LoRA (adapters traced by grad, frozen weights by jit): the
    SmolLM2 SQL recipe needs both, and nnx.remat refused the mix."""

    def run(remat):
        m = _lora_model(last_layers=1)
        if remat != "none":
            m2 = Transformer(m.config.replace(remat_policy=remat), nnx.Rngs(0))
            nnx.update(m2, nnx.state(m))
            m = m2
        st = TrainState.create(m, optax.sgd(0.1))
        tp, fr = st.split_trainable()
        f = jax.jit(
            jax.value_and_grad(
                lambda t: jnp.sum(st.model(st.join(t, fr))(IDS, MASK) * MASK[..., None])
            )
        )
        return f(tp)

    (l0, g0), (l1, g1) = run("none"), run(policy)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    leaves0, leaves1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert leaves0 and any(np.abs(np.asarray(a)).max() > 0 for a in leaves0)
    for a, b in zip(leaves0, leaves1):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4)
