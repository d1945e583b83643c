"""An LLM judge as a reward: another model grades each response against a rubric.

The judge is either any OpenAI-compatible endpoint (``POST {base_url}/chat/completions``,
e.g. ``vllm serve``; plain HTTP from the standard library) or one of our samplers on its
own checkpoint (``samplers.make_sampler``: the JAX sampler or vLLM). Settings are the
config section ``reward.judge`` (:class:`JudgeSection`, declared here beside what it
configures: the one place of its defaults and allowed values). ``RewardPool`` calls :meth:`Judge.rescore` after the
rule-based rewards of a batch, in the scoring thread of the trainer's process, so the
judge's cache and its client are shared by every item.

Per item (formulas of the pure functions below):

    raw      = the number of the verdict's last ``Score: N`` (or ``<score>N</score>``)
    judge    = (raw - score_min) / (score_max - score_min)              in [0, 1]
    base     = (1 - weight) * rule + weight * judge   (rule: the rule-based base score)
    correct  = rule correct  or  judge >= correct_threshold
    score    = shaped_score(base, ...)                 (reward.* shaping, as without judge)

A request is retried (timeouts, connection errors, HTTP 429 / 5xx, an unreadable body)
up to ``max_retries`` times after ``backoff_s * 2**k`` seconds (k = 0, 1, ...); a 4xx or
a sampler's request error is not retried. Identical requests (same judge, rubric,
prompt and response: :func:`cache_key`) are answered once: within a batch, and from an
LRU cache of ``cache_size`` parsed verdicts across batches. A verdict that has no score,
or one outside [score_min, score_max], and a request that failed every try, follow
``on_error``: ``"error"`` raises :class:`JudgeError` (the run stops with the verdict in
the message), ``"zero"`` scores the judge term 0 and counts a failure.

What each item's ``info`` gets (``judge_*`` keys) is summed per batch by
:func:`judge_metrics` into ``{prefix}/judge_calls``, ``judge_cache_hits``,
``judge_failures``, ``judge_seconds_mean`` / ``_max``, ``judge_prompt_tokens``,
``judge_completion_tokens`` and ``judge_cost_usd``; the trainer logs them every step
(``rollout/``) and at every evaluation (``eval/``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import hashlib
import json
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from verltool_jax.rewards.answer_extraction import extract_answer
from verltool_jax.rewards.base import RewardResult
from verltool_jax.rewards.shaping import ShapingSettings, shaped_score
from verltool_jax.schema import Checked, above, at_least, spec

if TYPE_CHECKING:
    from verltool_jax.rewards.compute import RewardItem

DEFAULT_RUBRIC = (
    "Grade whether the RESPONSE answers the QUESTION correctly, taking the REFERENCE "
    "ANSWER as right. Give 10 when it states the same answer as the reference (other "
    "wording, units or an equivalent form are fine), 5 when it is partly right or right "
    "but hedged between several answers, and 0 when it is wrong, missing or off topic."
)


def _unit_closed() -> tuple:
    return (lambda v: 0 <= v <= 1), "in [0, 1]"


@dataclass(frozen=True)
class JudgeSection(Checked):
    """An LLM judge as a reward term (``rewards/judge.py``; docs/data_and_rewards.md)."""

    # "": no judge; "openai": POST {base_url}/chat/completions of an OpenAI-compatible
    # server; "sampler": one of our samplers (sampler_backend) on the checkpoint `model`
    backend: str = spec("", choices=("", "openai", "sampler"))
    model: str = ""  # openai: the served model's name; sampler: a local HF checkpoint dir
    base_url: str = ""  # openai: e.g. http://127.0.0.1:8000/v1
    api_key_env: str = "OPENAI_API_KEY"  # environment variable with the key ("": none)
    sampler_backend: str = spec("jax", choices=("jax", "vllm"))
    max_model_len: int = spec(2048, check=at_least(64))  # sampler: prompt + verdict
    rubric: str = DEFAULT_RUBRIC
    # what is graded: the whole response, or only its extracted final answer (no answer:
    # no call, judge term 0)
    grade: str = spec("response", choices=("response", "answer"))
    weight: float = spec(1.0, check=_unit_closed())  # (1-w) * rule + w * judge
    correct_threshold: float = spec(1.0, check=_unit_closed())  # judge >= it: correct
    score_min: float = 0.0  # the rubric's scale, mapped to [0, 1]
    score_max: float = 10.0
    max_tokens: int = spec(256, check=at_least(1))
    temperature: float = spec(0.0, check=at_least(0))
    timeout_s: float = spec(60.0, check=above(0))  # per request
    max_retries: int = spec(2, check=at_least(0))  # after backoff_s * 2**k seconds
    backoff_s: float = spec(1.0, check=at_least(0))
    max_concurrency: int = spec(8, check=at_least(1))  # requests in flight
    cache_size: int = spec(4096, check=at_least(0, "0: no cache"))  # verdicts kept
    on_error: str = spec("error", choices=("error", "zero"))  # unparseable / failed
    price_prompt_per_1m: float = spec(0.0, check=at_least(0))  # USD per 1M tokens
    price_completion_per_1m: float = spec(0.0, check=at_least(0))

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        if self.backend and not self.model:
            what = "the served model's name" if self.backend == "openai" else "a checkpoint dir"
            problems.append(f"model is empty; backend={self.backend!r} needs {what}")
        if self.backend == "openai" and not self.base_url.startswith(("http://", "https://")):
            problems.append(
                f"base_url={self.base_url!r} must be the server's http(s) URL, "
                "e.g. http://127.0.0.1:8000/v1"
            )
        if self.score_max <= self.score_min:
            problems.append(
                f"score_max={self.score_max} must be > score_min={self.score_min} "
                "(the rubric's scale)"
            )
        if self.backend and not self.rubric.strip():
            problems.append("rubric is empty; say what earns which score")
        if problems:
            raise ValueError("; ".join(problems))


SYSTEM_PROMPT = (
    "You are a strict, fair grader. Grade the RESPONSE with the RUBRIC. Reason briefly, "
    "then end with one line 'Score: N', N a number from {lo:g} to {hi:g}."
)


class JudgeError(RuntimeError):
    """The judge could not grade a response and ``reward.judge.on_error="error"``."""


class VerdictParseError(ValueError):
    """A verdict without a usable score (none, or outside the rubric's range)."""


class RetryableJudgeError(RuntimeError):
    """A request that may succeed when tried again (timeout, 429 / 5xx, bad body)."""


# ----------------------------------------------------------------------------- pure parts
_SCORE_TAG = re.compile(r"<score>\s*(-?\d+(?:\.\d+)?)\s*</score>", re.IGNORECASE)
_SCORE_LINE = re.compile(r"score\**\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_verdict(text: str, score_min: float, score_max: float) -> float:
    """The raw score of a verdict: the number of its last ``<score>N</score>``, else of its
    last ``Score: N`` (also ``score = N``, ``**Score:** N``; a following ``/10`` is
    ignored). The last one counts: a judge that reasons first may quote scores before
    its final line. :class:`VerdictParseError` when there is none or it lies outside
    [score_min, score_max]."""
    found = _SCORE_TAG.findall(text) or _SCORE_LINE.findall(text)
    tail = text[-200:].replace("\n", " ")
    if not found:
        raise VerdictParseError(
            f"the verdict has no 'Score: N' line (its end: {tail!r}); the rubric must ask "
            "for a final 'Score: N' line, and reward.judge.max_tokens must leave room for it"
        )
    raw = float(found[-1])
    if not score_min <= raw <= score_max:
        raise VerdictParseError(
            f"the verdict's score {raw:g} is outside [{score_min:g}, {score_max:g}] "
            f"(its end: {tail!r}); set reward.judge.score_min / score_max to the rubric's scale"
        )
    return raw


def normalized_score(raw: float, score_min: float, score_max: float) -> float:
    """``(raw - score_min) / (score_max - score_min)``: the rubric's scale mapped to [0, 1]."""
    return (raw - score_min) / (score_max - score_min)


def blended_score(rule: float, judge: float, weight: float) -> float:
    """``(1 - weight) * rule + weight * judge``: weight 1 is the judge alone."""
    return (1.0 - weight) * rule + weight * judge


def backoff_delays(max_retries: int, backoff_s: float) -> list[float]:
    """Seconds to wait before retry k = 1..max_retries: ``backoff_s * 2**(k-1)``."""
    return [backoff_s * 2.0**k for k in range(max_retries)]


def cost_usd(
    prompt_tokens: int, completion_tokens: int, per_1m_prompt: float, per_1m_completion: float
) -> float:
    """Price of a call: tokens times the price per million tokens, prompt and completion."""
    return (prompt_tokens * per_1m_prompt + completion_tokens * per_1m_completion) / 1e6


def reference_text(ground_truth: Any) -> str:
    """The reference answer shown to the judge: a string as is, a list (or a dict's
    ``target`` / ``answers`` / ``answer``) joined by `` | ``, anything else as JSON."""
    if isinstance(ground_truth, Mapping):
        for key in ("target", "answers", "answer"):
            if key in ground_truth:
                return reference_text(ground_truth[key])
        return json.dumps(ground_truth, sort_keys=True, default=str)
    if isinstance(ground_truth, (list, tuple)) or type(ground_truth).__name__ == "ndarray":
        return " | ".join(str(g) for g in ground_truth)
    return str(ground_truth)


def judge_messages(
    rubric: str, question: str, reference: str, response: str, score_min: float, score_max: float
) -> list[dict[str, str]]:
    """The chat messages of one request: a system line asking for a final ``Score: N``,
    then the rubric, the question, the reference answer and the response."""
    user = (
        f"RUBRIC:\n{rubric}\n\nQUESTION:\n{question}\n\nREFERENCE ANSWER:\n{reference}\n\n"
        f"RESPONSE:\n{response}"
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(lo=score_min, hi=score_max)},
        {"role": "user", "content": user},
    ]


def cache_key(judge_id: str, rubric: str, prompt: str, response: str) -> str:
    """SHA-256 of (judge, rubric, prompt, response): equal keys are identical requests."""
    blob = json.dumps([judge_id, rubric, prompt, response], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------- endpoints
@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int


class Endpoint(Protocol):
    """One chat completion; raises :class:`RetryableJudgeError` for what a retry may fix."""

    def complete(
        self, messages: list[dict[str, str]], max_tokens: int, temperature: float
    ) -> Reply: ...

    def close(self) -> None: ...


class OpenAIEndpoint:
    """``POST {base_url}/chat/completions`` of an OpenAI-compatible server; the bearer
    token is the value of the environment variable ``api_key_env`` (never the config)."""

    def __init__(self, base_url: str, model: str, timeout_s: float, api_key_env: str = ""):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s = model, timeout_s
        self.api_key = os.environ.get(api_key_env, "") if api_key_env else ""

    def complete(
        self, messages: list[dict[str, str]], max_tokens: int, temperature: float
    ) -> Reply:
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": temperature,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode("utf-8", "replace")
            if e.code == 429 or e.code >= 500:
                raise RetryableJudgeError(f"HTTP {e.code} from {self.url}: {detail}") from None
            raise JudgeError(
                f"HTTP {e.code} from {self.url}: {detail} (check reward.judge.model and "
                "reward.judge.base_url, and the key in reward.judge.api_key_env)"
            ) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            raise RetryableJudgeError(f"{self.url}: {type(e).__name__}: {e}") from None
        try:
            data = json.loads(raw)
            text = data["choices"][0]["message"]["content"] or ""
            usage = data.get("usage") or {}
            return Reply(
                str(text),
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RetryableJudgeError(
                f"{self.url} answered without choices[0].message.content "
                f"({type(e).__name__}: {raw[:200]!r})"
            ) from None

    def close(self) -> None:
        pass


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` through the tokenizer's chat template, ready for the
    assistant's reply (a ``BatchEncoding``, as newer transformers return, unwrapped)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


class SamplerEndpoint:
    """A judge model on one of our samplers: the messages through the tokenizer's chat
    template, one ``generate`` per request (its own event loop in the calling thread:
    requests from several threads are batched by the sampler)."""

    def __init__(self, sampler: Any, tokenizer: Any, timeout_s: float, owned: bool = True):
        self.sampler, self.tokenizer, self.timeout_s, self.owned = (
            sampler,
            tokenizer,
            timeout_s,
            owned,
        )

    @classmethod
    def from_checkpoint(
        cls, path: str, backend: str, max_model_len: int, timeout_s: float, max_batch: int
    ) -> SamplerEndpoint:
        from transformers import AutoTokenizer

        from verltool_jax.samplers.factory import make_sampler

        kw: dict[str, Any] = {"max_model_len": max_model_len, "request_timeout_s": timeout_s}
        if backend == "jax":  # no more rows than requests in flight
            kw["max_batch_size"] = max_batch
        sampler = make_sampler(path, backend, **kw)
        tok = getattr(sampler, "tokenizer", None) or AutoTokenizer.from_pretrained(path)
        return cls(sampler, tok, timeout_s)

    def complete(
        self, messages: list[dict[str, str]], max_tokens: int, temperature: float
    ) -> Reply:
        from verltool_jax.samplers.base import (
            SamplerRequestError,
            SamplerTimeoutError,
            SamplingParams,
        )

        ids = chat_ids(self.tokenizer, messages)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)

        async def one():
            return await asyncio.wait_for(self.sampler.generate(ids, params), self.timeout_s)

        try:
            out = asyncio.run(one())
        except (TimeoutError, SamplerTimeoutError) as e:
            raise RetryableJudgeError(f"judge sampler: {type(e).__name__}: {e}") from None
        except SamplerRequestError as e:
            raise JudgeError(
                f"judge sampler refused the request: {e} (raise reward.judge.max_model_len "
                "or shorten the rubric)"
            ) from None
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        return Reply(text, len(ids), len(out.token_ids))

    def close(self) -> None:
        if self.owned:
            self.sampler.close()


# ----------------------------------------------------------------------------- the judge
@dataclass
class Outcome:
    """One graded request: ``score`` in [0, 1] (None: failed), what it cost."""

    score: float | None
    raw: float | None = None
    verdict: str = ""
    error: str = ""
    calls: int = 0
    cached: bool = False
    seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "judge_score": self.score,
            "judge_calls": self.calls,
            "judge_cached": self.cached,
            "judge_failed": self.score is None,
            "judge_seconds": round(self.seconds, 4),
            "judge_prompt_tokens": self.prompt_tokens,
            "judge_completion_tokens": self.completion_tokens,
            "judge_cost_usd": self.cost_usd,
            "judge_verdict": self.verdict[-500:],
        }
        if self.error:
            out["judge_error"] = self.error
        return out


@dataclass
class _Request:
    key: str
    messages: list[dict[str, str]]
    items: list[int] = field(default_factory=list)  # indices of the batch that ask it


class Judge:
    """Grades responses through ``endpoint`` with the settings of ``reward.judge``
    (see the module doc); ``sleep`` is the back-off's clock (``time.sleep``)."""

    def __init__(
        self,
        settings: JudgeSection,
        endpoint: Endpoint,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.s, self.endpoint, self.sleep = settings, endpoint, sleep
        self.judge_id = json.dumps(
            [
                settings.backend,
                settings.model,
                settings.base_url,
                settings.max_tokens,
                settings.temperature,
                settings.score_min,
                settings.score_max,
            ]
        )
        self._cache: OrderedDict[str, Outcome] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = cf.ThreadPoolExecutor(settings.max_concurrency, "judge")

    @classmethod
    def from_config(cls, settings: JudgeSection) -> Judge | None:
        """The judge of ``reward.judge`` (None when ``backend`` is empty: no judge)."""
        if not settings.backend:
            return None
        endpoint: Endpoint
        if settings.backend == "openai":
            endpoint = OpenAIEndpoint(
                settings.base_url, settings.model, settings.timeout_s, settings.api_key_env
            )
        else:
            if not os.path.isdir(settings.model):
                raise ValueError(
                    f"reward.judge.model={settings.model!r} is not a directory; the sampler "
                    "judge needs a local HF checkpoint (config.json, weights, tokenizer)"
                )
            endpoint = SamplerEndpoint.from_checkpoint(
                settings.model,
                settings.sampler_backend,
                settings.max_model_len,
                settings.timeout_s,
                settings.max_concurrency,
            )
        return cls(settings, endpoint)

    # -- one request, with retries
    def _ask(self, messages: list[dict[str, str]]) -> Outcome:
        s = self.s
        delays = backoff_delays(s.max_retries, s.backoff_s)
        t0 = time.perf_counter()
        calls, err = 0, ""
        for attempt in range(s.max_retries + 1):
            calls += 1
            try:
                reply = self.endpoint.complete(messages, s.max_tokens, s.temperature)
            except RetryableJudgeError as e:
                err = str(e)
                if attempt < s.max_retries:
                    self.sleep(delays[attempt])
                continue
            except JudgeError as e:
                err = str(e)
                break
            out = Outcome(
                None,
                verdict=reply.text,
                calls=calls,
                seconds=time.perf_counter() - t0,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                cost_usd=cost_usd(
                    reply.prompt_tokens,
                    reply.completion_tokens,
                    s.price_prompt_per_1m,
                    s.price_completion_per_1m,
                ),
            )
            try:
                out.raw = parse_verdict(reply.text, s.score_min, s.score_max)
                out.score = normalized_score(out.raw, s.score_min, s.score_max)
            except VerdictParseError as e:
                out.error = f"unparseable verdict: {e}"
            return out
        return Outcome(
            None,
            error=f"no verdict after {calls} tries: {err}",
            calls=calls,
            seconds=time.perf_counter() - t0,
        )

    def _cached(self, key: str) -> Outcome | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def _store(self, key: str, out: Outcome) -> None:
        if self.s.cache_size <= 0 or out.score is None:
            return  # failures are tried again next time
        with self._lock:
            self._cache[key] = out
            self._cache.move_to_end(key)
            while len(self._cache) > self.s.cache_size:
                self._cache.popitem(last=False)

    def grade(self, requests: Sequence[tuple[str, str, str]]) -> list[Outcome | None]:
        """Outcomes of ``(question, reference, response)`` requests, in order; a request
        whose response is empty (``grade="answer"`` and no answer) gets None (no call)."""
        s = self.s
        outcomes: list[Outcome | None] = [None] * len(requests)
        todo: dict[str, _Request] = {}
        for i, (question, reference, response) in enumerate(requests):
            if not response:
                continue
            prompt = f"{question}\n{reference}"
            key = cache_key(self.judge_id, s.rubric, prompt, response)
            hit = self._cached(key)
            if hit is not None:
                outcomes[i] = _as_hit(hit)
            elif key in todo:
                todo[key].items.append(i)
            else:
                msgs = judge_messages(
                    s.rubric, question, reference, response, s.score_min, s.score_max
                )
                todo[key] = _Request(key, msgs, [i])
        futures = {r.key: self._pool.submit(self._ask, r.messages) for r in todo.values()}
        for r in todo.values():
            out = futures[r.key].result()
            self._store(r.key, out)
            outcomes[r.items[0]] = out
            for i in r.items[1:]:
                outcomes[i] = _as_hit(out)
        if s.on_error == "error":
            for o in outcomes:
                if o is not None and o.score is None:
                    raise JudgeError(
                        f"reward.judge ({s.backend} {s.model!r}): {o.error} (set "
                        "reward.judge.on_error='zero' to score such responses 0 and count "
                        "them in judge_failures)"
                    )
        return outcomes

    def rescore(
        self, items: Sequence[RewardItem], results: Sequence[RewardResult], shaping: ShapingSettings
    ) -> list[RewardResult]:
        """The rule-based ``results`` of ``items`` with the judge's term blended in and the
        shaping applied again (formulas in the module doc)."""
        s = self.s
        requests = []
        for it in items:
            response = it.text if s.grade == "response" else (extract_answer(it.text) or "")
            question = str((it.extra_info or {}).get("question") or "")
            requests.append((question, reference_text(it.ground_truth), response))
        outcomes = self.grade(requests)
        out = []
        for it, res, o in zip(items, results, outcomes):
            rule = float(res.info.get("base_score", 0.0))
            judged = o.score if o is not None and o.score is not None else 0.0
            base = blended_score(rule, judged, s.weight)
            correct = res.correct or (
                o is not None and o.score is not None and o.score >= s.correct_threshold
            )
            info = dict(res.info, rule_score=rule, base_score=base)
            info.update(o.info() if o is not None else {"judge_score": 0.0, "judge_skipped": True})
            score = shaped_score(
                RewardResult(base, correct, info), shaping, it.tool_calls, it.invalid_tool_calls
            )
            out.append(RewardResult(score, correct, info))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.endpoint.close()


def _as_hit(o: Outcome) -> Outcome:
    """A cached answer: same verdict, no call, no tokens, no cost."""
    return Outcome(o.score, o.raw, o.verdict, o.error, cached=True)


def judge_metrics(infos: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """Per-batch sums of the items' ``judge_*`` info (empty when no item was judged):
    ``{prefix}/judge_calls`` (requests sent, retries included), ``judge_cache_hits``,
    ``judge_failures`` (on_error="zero"), ``judge_seconds_mean`` / ``_max`` (wall time of
    the requests sent, retries included), ``judge_prompt_tokens``,
    ``judge_completion_tokens``, ``judge_cost_usd``."""
    judged = [i for i in infos if "judge_calls" in i]
    if not judged:
        return {}
    sent = [float(i["judge_seconds"]) for i in judged if not i["judge_cached"]]
    return {
        f"{prefix}/judge_calls": float(sum(i["judge_calls"] for i in judged)),
        f"{prefix}/judge_cache_hits": float(sum(bool(i["judge_cached"]) for i in judged)),
        f"{prefix}/judge_failures": float(sum(bool(i["judge_failed"]) for i in judged)),
        f"{prefix}/judge_seconds_mean": float(sum(sent) / len(sent)) if sent else 0.0,
        f"{prefix}/judge_seconds_max": max(sent, default=0.0),
        f"{prefix}/judge_prompt_tokens": float(sum(i["judge_prompt_tokens"] for i in judged)),
        f"{prefix}/judge_completion_tokens": float(
            sum(i["judge_completion_tokens"] for i in judged)
        ),
        f"{prefix}/judge_cost_usd": float(math.fsum(i["judge_cost_usd"] for i in judged)),
    }
