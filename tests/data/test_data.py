"""Data pipelines: real parquet / JSONL files, a real HF tokenizer, grain iterators."""

from __future__ import annotations

import json

import pytest
from support.tiny_data import tiny_tokenizer

from verltool_jax.data import (
    DataRowError,
    PromptPipeline,
    SFTPipeline,
    prompt_token_ids,
    read_rows,
    validate_row,
    write_rows,
)


def _row(i: int, **changes) -> dict:
    row = {
        "prompt": [{"role": "user", "content": f"What is {i} * 3?"}],
        "data_source": "tiny_math",
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(3 * i)},
        "extra_info": {"index": i, "split": "train"},
    }
    row.update(changes)
    return row


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_roundtrip_and_templating(tmp_path, suffix):
    rows = [_row(i) for i in range(5)]
    rows[1]["extra_info"] = {"index": 1, "split": "train", "db": "x.sqlite"}  # uneven structs
    path = write_rows(rows, tmp_path / f"d.{suffix}")
    back = read_rows(path)
    assert [r["reward_model"]["ground_truth"] for r in back] == ["0", "3", "6", "9", "12"]
    assert back[0]["prompt"] == rows[0]["prompt"]
    assert back[0]["extra_info"] == {"index": 0, "split": "train"}  # no null padding
    assert back[1]["extra_info"]["db"] == "x.sqlite"
    tok = tiny_tokenizer()
    ids = prompt_token_ids(tok, back[2]["prompt"])
    text = tok.decode(ids)
    assert text == "<|im_start|>user\nWhat is 2 * 3?<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"prompt": "What is 2?"}, r"row 3: field 'prompt' is a string"),
        ({"prompt": []}, r"row 3: field 'prompt' must be a non-empty list"),
        (
            {"prompt": [{"role": "bot", "content": "x"}]},
            r"row 3: field 'prompt\[0\].role' must be one of",
        ),
        (
            {"prompt": [{"role": "user", "content": 5}]},
            r"row 3: field 'prompt\[0\].content' must be a string",
        ),
        ({"data_source": ""}, r"row 3: field 'data_source' must be a non-empty string"),
        (
            {"reward_model": {"style": "rule"}},
            r"row 3: field 'reward_model.ground_truth' is missing",
        ),
        ({"reward_model": None}, r"row 3: field 'reward_model' is missing or not a dict"),
        ({"extra_info": [1]}, r"row 3: field 'extra_info' must be a dict"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, change, message):
    rows = [_row(i) for i in range(5)]
    rows[3].update(change)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataRowError, match=message) as e:
        read_rows(path)
    assert "bad.jsonl" in str(e.value)


def test_bad_json_line_and_missing_fields(tmp_path):
    p = tmp_path / "broken.jsonl"
    p.write_text(json.dumps(_row(0)) + "\n{not json\n")
    with pytest.raises(DataRowError, match=r"broken.jsonl:2: not valid JSON"):
        read_rows(p)
    with pytest.raises(DataRowError, match="expected a dict"):
        validate_row([1, 2], 7)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_rows(tmp_path / "nope.parquet")
    with pytest.raises(ValueError, match="cannot tell the format"):
        read_rows(p.rename(tmp_path / "x.txt"))


def test_shuffle_is_deterministic_and_resume_is_exact(tmp_path):
    tok = tiny_tokenizer()
    path = write_rows([_row(i) for i in range(7)], tmp_path / "t.parquet")

    def order(pipe, n):
        return [ex.index for ex in pipe.next_batch(n)]

    a = PromptPipeline.from_files([path], tok, seed=3)
    first = order(a, 10)
    assert sorted(first[:7]) == list(range(7))  # one full epoch, each row once
    assert first[:7] != list(range(7))  # shuffled
    assert order(PromptPipeline.from_files([path], tok, seed=3), 10) == first
    assert order(PromptPipeline.from_files([path], tok, seed=4), 10) != first

    state = json.loads(json.dumps(a.get_state()))  # JSON-serialisable
    expected = order(a, 12)
    b = PromptPipeline.from_files([path], tok, seed=3)
    b.set_state(state)
    assert order(b, 12) == expected
    assert b.example_at(4).prompt_ids == prompt_token_ids(tok, b.rows[4]["prompt"])
    assert b.consumed == a.consumed == 22

    c = PromptPipeline.from_files([path], tok, seed=5)
    with pytest.raises(ValueError, match="different data or settings.*seed"):
        c.set_state(state)
    d = PromptPipeline([_row(i) for i in range(8)], tok, seed=3)
    with pytest.raises(ValueError, match="different data or settings"):
        d.set_state(state)


def test_finite_epochs_and_overlong_prompts():
    tok = tiny_tokenizer()
    rows = [_row(i) for i in range(4)]
    rows[2]["prompt"] = [{"role": "user", "content": "long " * 200}]
    pipe = PromptPipeline(rows, tok, shuffle=False, num_epochs=1, max_prompt_tokens=40)
    got = pipe.next_batch(10)
    assert [ex.index for ex in got] == [0, 1, 3]  # the long prompt is dropped
    assert got[1].ground_truth == "3" and got[1].data_source == "tiny_math"
    from verltool_jax.rollout.agent_loop import as_prompt_item

    item = as_prompt_item(got[1].to_prompt("step3-g1"), 0)  # what the rollout accepts
    assert item.group_id == "step3-g1" and item.prompt_ids == got[1].prompt_ids
    assert item.data["reward_model"]["ground_truth"] == "3"
    strict = PromptPipeline(
        rows, tok, shuffle=False, num_epochs=1, max_prompt_tokens=40, overlong="error"
    )
    with pytest.raises(ValueError, match="row 2: the prompt has .* max_prompt_tokens=40"):
        strict.next_batch(10)


def test_a_pipeline_that_drops_every_row_fails_instead_of_spinning():
    """Every prompt over the limit: a repeating pipeline would skip rows forever; it
    raises, naming the setting. One row that fits keeps it going across epochs."""
    tok = tiny_tokenizer()
    rows = [_row(i) for i in range(3)]
    for r in rows:
        r["prompt"] = [{"role": "user", "content": "long " * 200}]
    pipe = PromptPipeline(rows, tok, seed=1, max_prompt_tokens=40)  # repeats forever
    with pytest.raises(ValueError, match="every one of the 3 rows was dropped.*max_prompt_tokens"):
        pipe.next_batch(1)
    rows[1] = _row(1)
    ok = PromptPipeline(rows, tok, seed=1, max_prompt_tokens=40)
    assert [ex.index for ex in ok.next_batch(5)] == [1] * 5


def test_sft_pipeline_masks_observations(tmp_path):
    tok = tiny_tokenizer()
    row = _row(
        2,
        response_segments=[
            {"text": "<python>print(2 * 3)</python>", "loss": True},
            {"text": "<result>\n6\n</result>", "loss": False},
            {"text": "<answer>6</answer>", "loss": True},
        ],
    )
    path = write_rows([row], tmp_path / "sft.parquet")
    ex = next(SFTPipeline.from_files([path], tok))
    toks = tok.convert_ids_to_tokens(ex.response_ids)
    masked = [t for t, m in zip(toks, ex.loss_mask) if m == 0]
    assert masked == ["<result>", "Ċ", "6", "Ċ", "</result>"]
    assert toks[-1] == "<|im_end|>" and ex.loss_mask[-1] == 1
    assert tok.decode(ex.response_ids) == (
        "<python>print(2 * 3)</python><result>\n6\n</result><answer>6</answer><|im_end|>"
    )
    bad = dict(row, response_segments=[{"text": "x", "loss": "yes"}])
    write_rows([bad], tmp_path / "bad.jsonl")
    with pytest.raises(DataRowError, match=r"row 0: field 'response_segments\[0\].loss'"):
        SFTPipeline.from_files([tmp_path / "bad.jsonl"], tok)


def test_sft_observation_segments_are_formatted_as_the_rollout_formats_them(tmp_path):
    """An ``observation`` segment holds the raw tool answer; SFT tokenizes it with the
    rollout's ObservationFormatter (template around it, truncation), mixed in one parquet
    file with plain segments; without a formatter, or trained on, it is an error."""
    from verltool_jax.rollout.observation import ObservationFormatter

    tok = tiny_tokenizer()
    fmt = ObservationFormatter(
        tok, "<result>\n{obs}\n</result>", max_obs_tokens=3, side="head", marker=""
    )
    obs = "1 2 3 4 5 6"
    row = _row(
        1,
        response_segments=[
            {"text": "<python>print(1)</python>", "loss": True},
            {"text": obs, "loss": False, "observation": True},
            {"text": "<answer>6</answer>", "loss": True},
        ],
    )
    path = write_rows(
        [row, _row(2, response_segments=[{"text": "x", "loss": True}])], tmp_path / "sft.parquet"
    )
    ex = next(SFTPipeline.from_files([path], tok, shuffle=False, observation_ids=fmt))
    want = fmt(obs)[0]
    assert fmt(obs)[1] and len(want) < len(tok.encode(f"<result>\n{obs}\n</result>"))
    masked = [i for i, m in zip(ex.response_ids, ex.loss_mask) if m == 0]
    assert masked == want  # exactly the rollout's ids
    assert sum(ex.loss_mask) == len(ex.response_ids) - len(want)
    with pytest.raises(ValueError, match="observation formatter"):
        next(SFTPipeline.from_files([path], tok, shuffle=False))
    bad = dict(row, response_segments=[{"text": obs, "loss": True, "observation": True}])
    write_rows([bad], tmp_path / "bad.jsonl")
    with pytest.raises(DataRowError, match=r"response_segments\[0\].loss"):
        SFTPipeline.from_files([tmp_path / "bad.jsonl"], tok)
