"""The tiny tokenizer (``verltool_jax/models/tiny.py``): the default one is unchanged, and
extra atomic markup (``model.tiny.markup``) shortens a native tool call and round-trips."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from verltool_jax.models.tiny import NATIVE_CALL_MARKUP, build_tokenizer
from verltool_jax.tasks.tiny_math import make_row, native_demonstration

# sha256 of the default tokenizer's vocab, merges, added tokens, pre-tokenizer and decoder
# (tokenizers 0.22): the tokenizer the main job's figures were measured with.
DEFAULT_TOKENIZER_SHA = "46262bd453eae3922e2a244869ae746f0a67fbd2f39b74e7b5af701c76916733"


def _fingerprint(tok_dir: Path) -> str:
    t = json.loads((tok_dir / "tokenizer.json").read_text())
    core = {k: t[k] for k in ("added_tokens", "pre_tokenizer", "decoder")}
    core |= {"vocab": t["model"]["vocab"], "merges": t["model"]["merges"]}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def call_tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("call_tok"), markup=NATIVE_CALL_MARKUP)


def _call_text(a: int, b: int) -> str:
    """The trained reply of a native demonstration: the call, then EOS."""
    row = native_demonstration(make_row(a, b, 0, "train", native=True), "compact")
    return row["response_segments"][0]["text"]


def test_default_tokenizer_is_unchanged(tmp_path):
    build_tokenizer(tmp_path / "default")
    build_tokenizer(tmp_path / "empty", markup=())
    assert _fingerprint(tmp_path / "default") == DEFAULT_TOKENIZER_SHA, (
        "the default tiny tokenizer changed: the main job's figures were measured with it"
    )
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "empty" / f).read_bytes() == (tmp_path / "default" / f).read_bytes()


def test_markup_shortens_the_call_and_round_trips(tmp_path, call_tok):
    plain = build_tokenizer(tmp_path / "plain")
    text = _call_text(2057, 9865)
    demo = native_demonstration(make_row(2057, 9865, 0, "train", native=True), "compact")
    whole = "".join(s["text"] for s in demo["response_segments"])

    def to_operand(tok) -> int:  # tokens from <tool_call> up to the first operand's digit
        ids = tok.encode(text, add_special_tokens=False)
        return [tok.decode([i]) for i in ids].index("2")

    assert to_operand(plain) == 39 and to_operand(call_tok) == 5
    assert len(call_tok.encode(text, add_special_tokens=False)) == 20
    ids = call_tok.encode(text, add_special_tokens=False)
    for m in NATIVE_CALL_MARKUP:  # one id each, inside the call
        assert call_tok.convert_tokens_to_ids(m) in ids
    # decoded as the vLLM sampler and the gateway do, the text is the demonstration's
    for t in (text, whole):
        assert call_tok.decode(call_tok.encode(t, add_special_tokens=False)) == t
    # the markup is atomic as MARKUP_TOKENS are: special to the BPE, not an HF special token
    assert not set(NATIVE_CALL_MARKUP) & set(call_tok.all_special_tokens)


@pytest.mark.parametrize("bad", [("",), ("<python>",), ('"}}', '"}}'), ("<|im_end|>",)])
def test_bad_markup_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="model.tiny.markup"):
        build_tokenizer(tmp_path, markup=bad)


def test_markup_is_checked_in_the_config():
    from configs import tiny_math
    from verltool_jax.run_config import ConfigError, run_config_from_dict

    assert run_config_from_dict(tiny_math.get_config("")).model.tiny.markup == ()
    gw = run_config_from_dict(tiny_math.get_config("gateway"))
    assert gw.model.tiny.markup == NATIVE_CALL_MARKUP
    c = tiny_math.get_config("")
    c.model.tiny.markup = ("<answer>",)
    with pytest.raises((ConfigError, ValueError), match=r"model\.tiny\.markup=.*non-empty"):
        run_config_from_dict(c)
