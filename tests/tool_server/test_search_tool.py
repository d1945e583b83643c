"""search_retrieval tool: parsing, observations, errors, batching; then end to end
through the real tool server (when the server core is present)."""

import asyncio
import json
import os

import pytest
from support.retrieval import synthetic_index

from tool_server.kit.base import ToolSettings
from tool_server.retrieval.synthetic import town_name
from tool_server.tools.search_retrieval import SearchRetrievalTool

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tool():
    t = SearchRetrievalTool(
        ToolSettings(extra={"retrieval_index": synthetic_index("bm25"), "topk": "2"})
    )
    yield t
    t.close()


def run(tool, action, tid="t0"):
    parsed, ok = tool.parse_action(action)
    assert ok
    return asyncio.run(tool.conduct_action(tid, parsed, {}))


def test_parse_takes_the_last_search():
    t = SearchRetrievalTool(ToolSettings())
    assert t.parse_action("I think.<search>first</search> then <search>\n second \n</search>") == (
        "second",
        True,
    )
    assert t.parse_action("<answer>42</answer>") == (None, False)
    assert t.parse_action("<search>unclosed") == (None, False)
    assert t.parse_action("<search></search>") == ("", True)


def test_observation_lists_topk_documents(tool):
    obs, done, valid = run(tool, "<search>magnetic needle north market</search>")
    assert (done, valid) == (False, True)
    assert obs.startswith("<information>Doc 1 (Title: Compass) A magnetic compass has a needle")
    assert obs.endswith("</information>")
    assert obs.count("\nDoc ") == 1  # topk "2" from the option string -> 2 documents
    obs, _, _ = run(tool, "<search>which town was founded in the year 1287</search>")
    assert obs.startswith(f"<information>Doc 1 (Title: {town_name(11)})")


def test_no_match_and_empty_query_are_observations(tool):
    obs, done, valid = run(tool, "<search>xylophone quasar</search>")
    assert obs == "<information>No results found for the query: xylophone quasar</information>"
    assert valid
    obs, done, valid = run(tool, "<search>  </search>")
    assert obs["invalid_reason"] == "empty_query"
    assert "query is empty" in obs["obs"] and "<search>your query</search>" in obs["obs"]
    assert (done, valid) == (False, False)


def test_missing_or_broken_index_is_an_observation(tmp_path):
    t = SearchRetrievalTool(ToolSettings())
    obs, done, valid = run(t, "<search>chess</search>")
    assert obs["invalid_reason"] == "retrieval_error"
    assert obs["obs"].startswith("Retrieval error: no retrieval index is configured")
    assert "--tool-opt retrieval_index=" in obs["obs"] and valid is False
    t = SearchRetrievalTool(ToolSettings(extra={"retrieval_index": str(tmp_path)}))
    obs, _, valid = run(t, "<search>chess</search>")
    assert obs["obs"].startswith("Retrieval error:") and "no meta.json" in obs["obs"]
    assert not valid


def test_bad_option_is_a_clear_error():
    with pytest.raises(ValueError, match="tool option 'topk' must be an integer"):
        SearchRetrievalTool(ToolSettings(extra={"topk": "three"}))
    with pytest.raises(ValueError, match="'topk' must be >= 1"):
        SearchRetrievalTool(ToolSettings(extra={"topk": 0}))


def test_dense_index_and_concurrent_trajectories_share_batches():
    t = SearchRetrievalTool(
        ToolSettings(
            extra={"retrieval_index": synthetic_index("dense"), "topk": 1, "retrieval_batch_ms": 20}
        )
    )
    questions = [
        "how do plants make food from sunlight",
        "what guides ships at night",
        "a game with a king and sixteen pieces",
        "ice that moves slowly down a valley",
    ]

    async def go():
        return await asyncio.gather(
            *(
                t.conduct_action(f"t{i}", t.parse_action(f"<search>{q}</search>")[0], {})
                for i, q in enumerate(questions)
            )
        )

    svc = t.retrieval.service()
    svc.batch_sizes.clear()
    out = asyncio.run(go())
    titles = [o[0].split("(Title: ")[1].split(")")[0] for o in out]
    assert titles == ["Photosynthesis", "Lighthouse", "Chess", "Glacier"]
    assert list(svc.batch_sizes) == [4]  # one encoder pass answered all four


def test_end_to_end_through_the_server():
    from tool_server.launcher import get_json, post_json, run_server

    idx = synthetic_index("bm25")
    with run_server(
        tools=["search_retrieval"], tool_opt={"retrieval_index": idx, "topk": 2}, timeout=30
    ) as url:
        assert "search_retrieval" in json.dumps(get_json(url + "/tools"))
        status, body = post_json(
            url + "/get_observation",
            {
                "trajectory_ids": ["a", "b", "c", "d"],
                "actions": [
                    "<think>hmm</think><search>magnetic needle north market</search>",
                    "<search>which town was founded in the year 1287</search>",
                    "<search></search>",
                    "<search>xylophone quasar</search>",
                ],
                "extra_fields": [{}, {}, {}, {}],
            },
        )
        assert status == 200, body
        obs = body["observations"]
        assert (
            obs[0].startswith("<information>Doc 1 (Title: Compass)")
            and obs[0].count("\nDoc 2 (Title: ") == 1
        )
        assert obs[1].startswith(f"<information>Doc 1 (Title: {town_name(11)})")
        assert obs[2]["invalid_reason"] == "empty_query"
        assert obs[3].startswith("<information>No results found")
        assert body["valids"] == [True, True, False, True]
        assert body["dones"] == [False] * 4
        # Finishing the trajectories leaves nothing behind (the tool keeps no state).
        status, body = post_json(
            url + "/get_observation",
            {"trajectory_ids": ["a", "b"], "actions": ["", ""], "finish": [True, True]},
        )
        assert status == 200 and body["dones"] == [True, True]
        assert get_json(url + "/health")["live_trajectories"] == 0


def test_end_to_end_without_index_answers_with_an_error_observation():
    from tool_server.launcher import post_json, run_server

    with run_server(tools=["search_retrieval"], env={"VERLTOOL_RETRIEVAL_INDEX": ""}) as url:
        status, body = post_json(
            url + "/get_observation",
            {"trajectory_ids": ["a"], "actions": ["<search>chess</search>"]},
        )
        assert status == 200
        assert body["observations"][0]["invalid_reason"] == "retrieval_error"
        assert "retrieval_index" in body["observations"][0]["obs"]
        assert body["valids"] == [False]


def test_astart_loads_the_index_and_never_raises(tmp_path, caplog):
    from tool_server.retrieval.service import get_service

    idx = synthetic_index("bm25")
    t = SearchRetrievalTool(ToolSettings(extra={"retrieval_index": idx, "retrieval_batch_ms": 1}))
    asyncio.run(t.astart())
    svc = get_service(idx, None, 1.0, 64)
    assert svc is t.retrieval.service() and list(svc.batch_sizes) == [1]  # the warm-up query
    bad = SearchRetrievalTool(ToolSettings(extra={"retrieval_index": str(tmp_path)}))
    asyncio.run(bad.astart())  # logged, not raised: the server must still start
    assert "cannot open the retrieval index" in caplog.text


def test_torch_threads_option_sets_encoder_threads():
    import torch

    from tool_server.retrieval.options import RetrievalOptions

    before = torch.get_num_threads()
    opts = RetrievalOptions.from_extra(
        {"retrieval_index": synthetic_index("bm25"), "retrieval_torch_threads": "1"}
    )
    assert opts.torch_threads == 1
    try:
        opts.service()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="'retrieval_torch_threads' must be >= 1"):
        RetrievalOptions.from_extra({"retrieval_torch_threads": 0})
