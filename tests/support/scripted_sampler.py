"""A scripted, deterministic :class:`~verltool_jax.samplers.base.Sampler` for tests.

It plays back text turns (a function of the request id and the turn number), tokenized
character by character unless ``canonical=True``, applying the stop strings, the
``max_tokens`` cap and EOS exactly as a real sampler would. Used to drive exact
scenarios of the agent loop; the real vLLM and JAX samplers are tested too.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from verltool_jax.samplers.base import Completion, SamplerError, SamplingParams


class ScriptedSampler:
    """Returns ``script(request_id, turn)`` as the completion of that trajectory's turn.

    ``script`` returns the turn's text, or raises to simulate a sampler failure.
    Text up to and including the first stop string is returned (``finish_reason="stop"``,
    ``stop_string`` set); text without a stop string gets the EOS id appended; anything
    beyond ``max_tokens`` is cut (``"length"``). ``logprobs[i] = -0.01 * (i + 1)``.
    ``delay_s`` sleeps per call (simulated generation time).
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Callable[[str, int], str],
        canonical: bool = False,
        delay_s: float = 0.0,
        version: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.canonical = canonical
        self.delay_s = delay_s
        self.version = version
        self.turns: dict[str, int] = defaultdict(int)
        self.calls: list[tuple[str, list[int], SamplingParams]] = []
        self.eos_id = tokenizer.eos_token_id

    def encode_turn(self, text: str) -> list[int]:
        """Token ids of a turn: one call per character (non-canonical) or the tokenizer's."""
        if self.canonical:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        out: list[int] = []
        i = 0
        specials = sorted(self.tokenizer.get_added_vocab(), key=len, reverse=True)
        while i < len(text):
            for s in specials:  # keep markup tokens atomic, as a model emits them
                if text.startswith(s, i):
                    out.append(self.tokenizer.convert_tokens_to_ids(s))
                    i += len(s)
                    break
            else:
                out.extend(self.tokenizer.encode(text[i], add_special_tokens=False))
                i += 1
        return out

    async def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str | None = None
    ) -> Completion:
        rid = request_id or "anon"
        k = self.turns[rid]
        self.turns[rid] += 1
        self.calls.append((rid, list(prompt_token_ids), params))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        try:
            text = self.script(rid, k)
        except Exception as e:
            raise SamplerError(f"scripted failure for {rid} turn {k}: {e}") from e
        stop_string = None
        cut = None
        for s in params.stop:
            j = text.find(s)
            if j >= 0 and (cut is None or j + len(s) < cut):
                cut, stop_string = j + len(s), s
        if cut is not None:
            ids = self.encode_turn(text[:cut])
        else:
            ids = self.encode_turn(text) + [self.eos_id]
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish, stop_string = ids[: params.max_tokens], "length", None
        return Completion(
            token_ids=ids,
            logprobs=[-0.01 * (i + 1) for i in range(len(ids))],
            finish_reason=finish,
            stop_string=stop_string,
            policy_version=self.version,
        )

    def update_weights(self, params: Any, version: int) -> None:
        self.version = version

    def close(self) -> None:
        pass
