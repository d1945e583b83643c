"""tiny_math in the native tool-call format through our own loop
(``configs/tiny_math.py:smoke,native``): the tiny model, warm-started on the gateway
variant's demonstrations, rolls out through the real tool server and takes one RL step.
The trained prompts are the chat template's rendering with the tool server's schemas, the
model's calls are answered in the template's tool turns (loss mask 0), and its held-out
evaluation makes well-formed calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tool_server.tools.python_code import PythonCodeTool
from verltool_jax.chat.render import ToolChat
from verltool_jax.cli import parse_command_line
from verltool_jax.rollout.response_text import response_segments
from verltool_jax.rollout.trajectory import load_trajectories

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # about a minute on 2 CPU cores


def test_one_rl_step_in_the_native_format(tmp_path):
    from transformers import AutoTokenizer

    from verltool_jax.train.trainer import train

    cfg = parse_command_line(
        [
            "--config",
            str(REPO / "configs/tiny_math.py") + ":smoke,native",
            f"--config.trainer.out_dir={tmp_path / 'run'}",
            "--config.logging.progress_bar=false",
            "--config.logging.dump_trajectories=true",
            "--config.sampler.backend=jax",
            "--config.sft.steps=60",  # enough for the call's markup, not its operands
            "--config.trainer.steps=1",
            "--config.data.max_eval_examples=4",
        ]
    ).config
    result = train(cfg, echo=False)
    assert result.policy_version == 1

    tok = AutoTokenizer.from_pretrained(tmp_path / "run" / "init_model")
    chat = ToolChat((PythonCodeTool().function_schema(),), "hermes", "compact")
    trained = load_trajectories(tmp_path / "run" / "trained" / "step_00001.jsonl")
    assert len(trained) == 4  # 2 groups x 2 samples
    for t in trained:
        t.check()
        assert t.prompt_ids == chat.render(tok, t.data["prompt"])[1]
        for text, is_model in response_segments(t.response_ids, t.loss_mask, tok):
            if not is_model:  # a tool turn: the template's tool message, then our turn
                assert "<|im_start|>tool\n" in text
                assert text.endswith("<|im_start|>assistant\n")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # held-out episodes made well-formed calls, which the tool server answered
    valid = [
        m["eval/tool_calls"] - m["eval/invalid_tool_calls"] for m in metrics if "eval/acc" in m
    ]
    assert valid and max(valid) > 0, metrics
