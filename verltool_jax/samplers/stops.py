"""Stop conditions of one completion, checked token by token on the host.

Order per new token (as vLLM): a stop token id (explicit ``stop_token_ids`` or the model's
EOS) ends the completion and is kept; then a stop string appearing in the decoded text
(the tokenizer decodes the generated ids incrementally) ends it, keeping the token that
completed it; then ``max_tokens`` ends it with "length".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class StopState:
    stop: tuple[str, ...]
    stop_token_ids: frozenset
    eos_token_ids: frozenset
    max_tokens: int
    tokenizer: Any = None
    text_len_checked: int = 0
    text: str = ""

    def check(self, token_ids: Sequence[int]) -> tuple[str, str | None, int | None] | None:
        """After ``token_ids[-1]`` was appended: ``(finish_reason, stop_string, stop_token_id)``
        if the completion is finished, else None."""
        t = token_ids[-1]
        if t in self.stop_token_ids:
            return "stop", None, t
        if t in self.eos_token_ids:
            return "stop", None, None
        if self.stop:
            self.text = self.tokenizer.decode(list(token_ids), skip_special_tokens=False)
            longest = max(len(s) for s in self.stop)
            start = max(0, self.text_len_checked - longest + 1)
            hits = [(self.text.find(s, start), s) for s in self.stop]
            hits = [(i, s) for i, s in hits if i >= 0]
            self.text_len_checked = len(self.text)
            if hits:
                return "stop", min(hits)[1], None
        if len(token_ids) >= self.max_tokens:
            return "length", None, None
        return None


def stop_across_boundaries(
    token_ids: Sequence[int], boundaries: Sequence[int], stop: Sequence[str], decode: Any
) -> tuple[int, str] | None:
    """The first stop string that straddles a boundary of a continued completion.

    A partial rollout continues a request after a weight sync as a new request whose
    prompt ends with the tokens sampled so far (``token_ids[:b]`` for a boundary ``b``); the
    engine looks for stop strings in the new request's output only, so a stop string begun
    before ``b`` and completed after it is missed. Returns ``(j, s)``: token ``j`` (``j >= b``)
    is the first whose text completes ``s``, begun before ``b``, so the completion ends at
    ``j`` as an uninterrupted one would (the token that completed a stop string is kept);
    None if no stop string straddles a boundary. ``decode`` maps ids to text.
    """
    if not stop:
        return None
    longest = max(len(s) for s in stop)
    for b in boundaries:
        if b <= 0 or b >= len(token_ids):
            continue
        before = decode(list(token_ids[:b]))
        start = max(0, len(before) - longest + 1)
        # a token may decode to no text (part of a character): look a little further
        for j in range(b, min(len(token_ids), b + 2 * longest)):
            text = decode(list(token_ids[: j + 1]))
            hits = [(text.find(s, start), s) for s in stop]
            hits = [(i, s) for i, s in hits if 0 <= i < len(before) < i + len(s)]
            if hits:
                return j, min(hits)[1]
    return None
