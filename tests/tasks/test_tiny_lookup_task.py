"""The tiny_lookup task (configs/tiny_math.py:lookup): deterministic data with held-out
keys, demonstrations whose observations are what the real tool server answers from the
real index, and a short run that trains end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from verltool_jax.cli import load_config, parse_command_line
from verltool_jax.data import read_rows, validate_sft_row
from verltool_jax.run_config import run_config_from_dict
from verltool_jax.tasks import prepare_task, tiny_lookup

REPO = Path(__file__).resolve().parents[2]


def _config(index: Path, *variants: str):
    cfg = load_config("configs/tiny_math.py:" + ",".join(("lookup",) + variants), lock=False)
    cfg.tool_server.tool_opt.retrieval_index = str(index)
    return run_config_from_dict(cfg)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lookup")
    rc = _config(tmp / "index", "smoke")
    return rc, prepare_task(rc, tmp / "data"), tmp


def test_data_is_deterministic_with_held_out_keys(written):
    rc, files, tmp = written
    train, evals = read_rows(files.train), read_rows(files.eval)
    sft = read_rows(files.sft, validate=validate_sft_row)
    t = rc.task
    assert (len(train), len(evals), len(sft)) == (t.num_train, t.num_eval, t.num_demos)
    keys = lambda rows: {r["extra_info"]["key"] for r in rows}
    assert len(keys(train)) == len(train) and not keys(train) & keys(evals)
    corpus = [json.loads(x) for x in (tmp / "data" / "corpus.jsonl").read_text().splitlines()]
    code_of = {d["title"]: d["contents"] for d in corpus}
    assert set(code_of) == keys(train) | keys(evals)
    for r in train + evals:
        x = r["extra_info"]
        assert 1000 <= x["code"] <= 9999 and 10 <= x["factor"] <= 99
        assert len(x["key"]) == 8 and x["key"].startswith("item") and x["key"][4:].isdigit()
        assert code_of[x["key"]] == f"code {x['code']}"
        assert r["reward_model"]["ground_truth"] == str(x["code"] * x["factor"])
        assert r["prompt"][-1]["content"] == f"What is the code of {x['key']} times {x['factor']}?"
        assert r["data_source"] == "tiny_lookup"
    again = tiny_lookup.generate(t.num_train, t.num_eval, t.num_demos, seed=t.seed)
    assert again[0] == train and again[1] == evals
    other = tiny_lookup.generate(t.num_train, t.num_eval, t.num_demos, seed=t.seed + 1)
    assert [r["reward_model"] for r in other[0]] != [r["reward_model"] for r in train]
    # the index is kept while it holds this corpus
    stamp = (tmp / "index" / "meta.json").stat().st_mtime_ns
    prepare_task(rc, tmp / "data2")
    assert (tmp / "index" / "meta.json").stat().st_mtime_ns == stamp


def test_demonstration_observations_are_the_real_tools(written):
    """Each demonstrated action, sent to the run's own tool server (search_retrieval over
    the task's index, topk 1; python_code), answers exactly the demonstrated observation;
    a wrong key finds nothing."""
    from tool_server.client import ToolClient
    from tool_server.launcher import serve_tools

    rc, files, _ = written
    sft = read_rows(files.sft, validate=validate_sft_row)[:3]

    async def ask(url: str, actions: list[str]) -> list[str]:
        async with ToolClient(url) as client:
            ids = [f"t{i}" for i in range(len(actions))]
            res = await client.get_observations(ids, actions, [{} for _ in actions])
            await client.finish(ids)
            assert all(r.valid for r in res)
            return [r.observation for r in res]

    actions, expected = [], []
    for row in sft:
        segs = row["response_segments"]
        assert [s["loss"] for s in segs] == [True, False, True, False, True]
        for act, obs in ((segs[0], segs[1]), (segs[2], segs[3])):
            actions.append(act["text"])
            expected.append(obs["text"])
    with serve_tools(rc.tool_server) as (url, _):
        got = asyncio.run(ask(url, actions + ["<search>item0000</search>"]))
    assert got[:-1] == expected
    assert "No results" in got[-1] and "code" not in got[-1]


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="num_demos=5 must be <= num_train=3"):
        tiny_lookup.generate(3, 1, 5)
    with pytest.raises(ValueError, match="task.factor_digits"):
        tiny_lookup.generate(3, 1, 1, factor_digits=())
    with pytest.raises(ValueError, match="cannot draw"):
        tiny_lookup.generate(5000, 10, 0)
    rc = _config(tmp_path / "index", "smoke")
    no_index = {**rc.tool_server.tool_opt, "retrieval_index": ""}
    import dataclasses

    bad = dataclasses.replace(
        rc, tool_server=dataclasses.replace(rc.tool_server, tool_opt=no_index)
    )
    with pytest.raises(ValueError, match="tool_server.tool_opt.retrieval_index is empty"):
        prepare_task(bad, tmp_path / "data")


@pytest.mark.slow  # a whole trainer run: over a minute on 2 busy cores
def test_lookup_smoke_trains_end_to_end(tmp_path):
    """``:lookup,smoke``: SFT on the two-call demonstrations, then RL steps through the
    real tool server (retrieval and sandboxed python) with the JAX sampler."""
    from verltool_jax.train.trainer import train

    argv = [
        "--config",
        str(REPO / "configs/tiny_math.py") + ":lookup,smoke",
        f"--config.trainer.out_dir={tmp_path / 'run'}",
        f"--config.tool_server.tool_opt.retrieval_index={tmp_path / 'index'}",
        "--config.sampler.backend=jax",
        "--config.logging.progress_bar=false",
        "--config.logging.plot=false",
        "--config.logging.tensorboard=false",
    ]
    summary = train(parse_command_line(argv).config, echo=False).summary
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    sft = [x for x in lines if "sft/sft_loss" in x]
    steps = [x for x in lines if "train/loss" in x]
    assert len(sft) == 2 and all(x["sft/sft_tokens"] > 0 for x in sft)
    assert [x["step"] for x in steps] == [1, 2] and all(x["rollout/errors"] == 0 for x in steps)
    assert summary.steps == 2 and (tmp_path / "index" / "meta.json").is_file()
