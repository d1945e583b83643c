"""Reporting: metrics JSONL + TensorBoard events, the progress line, the PNG plot, the HTML page."""

from __future__ import annotations

import base64
import io
import json
import struct
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.tiny_data import tiny_tokenizer

from verltool_jax import metric_names as names
from verltool_jax.reporting import (
    MetricsWriter,
    ProgressBar,
    format_progress,
    plot_metrics,
    read_metrics,
    write_trajectory_report,
)
from verltool_jax.rollout.trajectory import Trajectory


def _tb_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Decode the TFRecord event files that tensorboardX wrote."""
    from tensorboardX.proto import event_pb2

    out: dict = {}
    for f in sorted(tb_dir.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            ev = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((ev.step, v.simple_value))
    return out


def test_metrics_jsonl_tensorboard_and_plot(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=True) as w:
        for step in range(1, 6):
            w.write(
                step,
                {
                    names.REWARD: 0.1 * step,
                    names.ACC: np.float32(0.2 * step - 0.1),
                    "loss": float("nan"),
                    "note": "x",
                },
            )
        w.write(5, {names.EVAL_ACC: 0.8})
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert len(recs) == 6 and recs[0]["step"] == 1
    assert recs[2][names.REWARD] == pytest.approx(0.3)
    assert recs[2][names.ACC] == pytest.approx(0.5) and recs[0]["loss"] is None
    with open(tmp_path / "metrics.jsonl", "a") as f:  # a torn line from a crash
        f.write('{"step": 7, "rew')
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 6
    tb = _tb_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in tb[names.REWARD]] == [1, 2, 3, 4, 5]
    assert tb[names.ACC][-1][1] == pytest.approx(0.9)
    assert "note" not in tb and tb[names.EVAL_ACC] == [(5, pytest.approx(0.8))]

    png = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots" / "curves.png")
    img = Image.open(png)
    assert img.format == "PNG" and img.size == (1000, 380)
    px = np.asarray(img.convert("L"), dtype=np.float32)
    assert px.std() > 10  # not a blank canvas

    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"step": 1, "loss": 0.3}) + "\n")
    with pytest.raises(ValueError, match="no 'reward/mean'"):
        plot_metrics(empty, tmp_path / "e.png")


def test_progress_line():
    m = {
        names.REWARD: 0.4123,
        names.ACC: 0.375,
        names.TOKENS_PER_S: 1234.0,
        names.TIME_ROLLOUT_WAIT: 3.14,
        names.TIME_TRAIN: 1.0,
        names.TIME_SYNC: 0.25,
    }
    assert format_progress(12, 100, m) == (
        "step 12/100 | reward 0.412 | acc 0.375 | "
        "1.23k tok/s | rollout-wait 3.1s train 1.0s sync 0.2s"
    )
    assert format_progress(3, None, {names.ACC: 1.0}) == "step 3 | acc 1.000"
    buf = io.StringIO()
    bar = ProgressBar(total=4, file=buf)
    bar.update(1, m)
    bar.update(2, {names.REWARD: 0.9})
    bar.close()
    text = buf.getvalue()
    assert "step 1/4 | reward 0.412" in text and "step 2/4 | reward 0.900" in text
    # an evaluation's bar counts problems of a mode, and shows 0/N before the first
    buf = io.StringIO()
    bar = ProgressBar(total=3, file=buf, unit="greedy")
    bar.update(2, {})
    bar.close()
    assert "greedy 0/3" in buf.getvalue() and "greedy 2/3" in buf.getvalue()


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _png_data_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 30, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_html_report_structure_and_escaping(tmp_path):
    tok = tiny_tokenizer()
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    act = enc("<python>print('<script>alert(1)</script>')</python>")
    obs = enc("<result>\n<script>alert(1)</script>\n</result>")
    ans = enc("<answer>7</answer>")
    n = len(act) + len(obs) + len(ans)
    row = {
        "prompt": [{"role": "user", "content": "What is 3 + 4? <b>bold?</b>"}],
        "data_source": "tiny_math",
        "reward_model": {"ground_truth": "7"},
    }
    good = Trajectory(
        trajectory_id="g0-0",
        group_id="g0",
        prompt_ids=enc("x"),
        response_ids=act + obs + ans,
        loss_mask=[1] * len(act) + [0] * len(obs) + [1] * len(ans),
        logprobs=[0.0] * n,
        versions=[3] * n,
        num_turns=2,
        tool_calls=1,
        termination="eos",
        reward=1.0,
        reward_info={"acc": 1.0, "pred": "7"},
        extras=[{"turn": 1, "image": _png_data_url()}, {"turn": 1, "image": "javascript:alert(1)"}],
        actions=["<python>print(1)</python>"],
        observations=["1"],
        data=row,
    )
    bad = {
        "trajectory_id": "g0-1",
        "group_id": "g0",
        "prompt_ids": [1, 2],
        "actions": ["<python>1/0</python>"],
        "observations": ["ZeroDivisionError"],
        "reward": 0.0,
        "reward_info": {"acc": 0.0},
        "termination": "max_turns",
        "num_turns": 3,
        "tool_calls": 2,
        "invalid_tool_calls": 1,
        "data": {},
    }
    path = write_trajectory_report(
        [good, bad], tmp_path / "report" / "t.html", title="step 5 <samples>", tokenizer=tok
    )
    page = path.read_text()
    p = _Collector()
    p.feed(page)
    tags = [t for t, _ in p.tags]
    assert "b" not in tags  # everything escaped; the one script is the token view's own
    scripts = [a for t, a in p.tags if t == "script"]
    assert scripts == [{}]
    assert tags.count("details") == 2
    imgs = [a for t, a in p.tags if t == "img"]
    assert len(imgs) == 1 and imgs[0]["src"].startswith("data:image/png;base64,")
    text = "".join(p.text)
    assert "step 5 <samples>" in text and "<script>alert(1)</script>" in text
    assert "What is 3 + 4? <b>bold?</b>" in text
    for label in (
        "model turn 1",
        "observation 1",
        "model turn 2",
        "action 1",
        "ZeroDivisionError",
        "max_turns",
        "(1 invalid)",
        "truth 7",
    ):
        assert label in text, label
    assert text.index("model turn 1") < text.index("observation 1") < text.index("model turn 2")
    assert "<answer>7</answer>" in text
    assert "mean reward 0.500" in text


def test_trailing_mean_and_seed_mean_curve():
    from verltool_jax.reporting.plots import seed_mean_curve, trailing_mean

    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([2.0, 4.0], 5) == [2.0, 3.0]
    assert trailing_mean([], 3) == []
    with pytest.raises(ValueError, match="window"):
        trailing_mean([1.0], 0)
    # two seeds; the second stopped after step 2: the mean covers the common steps
    a = ([0, 1, 2, 3], [10.0, 20.0, 30.0, 40.0], [0.0, 0.2, 0.4, 0.6])
    b = ([0, 1, 2], [12.0, 22.0, 32.0], [0.2, 0.4, 0.6])
    steps, secs, ys = seed_mean_curve([a, b, ([], [], [])])
    assert steps == [0, 1, 2]
    assert secs == [11.0, 21.0, 31.0]
    assert ys == pytest.approx([0.1, 0.3, 0.5])
    assert seed_mean_curve([]) == ([], [], [])
