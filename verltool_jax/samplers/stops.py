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
