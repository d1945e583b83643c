"""Observation tokens: truncation in tokens (head/tail + marker) and template wrapping."""

import pytest

from verltool_jax.rollout.config import OBS_TEMPLATE_CHATML, RolloutConfig
from verltool_jax.rollout.observation import ObservationFormatter, truncate_tokens


def test_truncate_tokens_head_tail_and_edge_cases():
    ids = list(range(10))
    assert truncate_tokens(ids, 10, "head", [99]) == ids
    assert truncate_tokens(ids, 4, "head", [99]) == [0, 1, 2, 99]
    assert truncate_tokens(ids, 4, "tail", [99]) == [99, 7, 8, 9]
    assert truncate_tokens(ids, 1, "tail", [98, 99]) == [9]  # marker does not fit
    assert truncate_tokens(ids, 0, "head", [99]) == []
    with pytest.raises(ValueError, match="side"):
        truncate_tokens(ids, 4, "middle", [])


def test_formatter_counts_tokens_not_characters(tok):
    f = ObservationFormatter(
        tok, "<result>{obs}</result>", max_obs_tokens=12, side="head", marker="..."
    )
    long_obs = "123456789 " * 40
    ids, cut = f(long_obs)
    assert cut
    assert ids[0] == tok.convert_tokens_to_ids("<result>")
    assert ids[-1] == tok.convert_tokens_to_ids("</result>")
    body = ids[1:-1]
    assert len(body) == 12
    marker = tok.encode("...", add_special_tokens=False)
    assert body[-len(marker) :] == marker
    assert (
        body[: 12 - len(marker)]
        == tok.encode(long_obs, add_special_tokens=False)[: 12 - len(marker)]
    )
    short, cut = f("42")
    assert not cut and tok.decode(short) == "<result>42</result>"


def test_chatml_wrapping(tok):
    f = ObservationFormatter(tok, OBS_TEMPLATE_CHATML, max_obs_tokens=64, side="tail")
    ids, _ = f("out")
    assert tok.decode(ids) == "<|im_end|>\n<|im_start|>user\nout<|im_end|>\n<|im_start|>assistant\n"


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="obs_truncate_side"):
        RolloutConfig(obs_truncate_side="both")
    with pytest.raises(ValueError, match="obs_template"):
        RolloutConfig(obs_template="no placeholder")
    with pytest.raises(ValueError, match="action_stop_strings"):
        RolloutConfig(action_stop_strings="</python>")
    with pytest.raises(ValueError, match="unknown rollout config keys"):
        RolloutConfig.from_mapping({"max_turn": 3})
    assert RolloutConfig.from_mapping(
        {"max_turns": 3, "action_stop_strings": ["</sql>"]}
    ).action_stop_strings == ("</sql>",)
