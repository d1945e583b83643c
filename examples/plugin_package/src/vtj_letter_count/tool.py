"""The ``letter_count`` tool: ``<count>LETTER in WORD</count>`` -> the number of times
LETTER occurs in WORD (ignoring case). A query it cannot read is an invalid action whose
observation says how to write one; it never raises."""

from __future__ import annotations

import re
from typing import Any

from tool_server.kit.base import BaseTool, Observation
from tool_server.kit.tags import last_tag_body
from vtj_letter_count import TAG, count_letter

_QUERY = re.compile(r"^\s*(\S)\s+in\s+(\S.*?)\s*$", re.IGNORECASE | re.DOTALL)


def parse_query(body: str) -> tuple[str, str] | None:
    """``"r in strawberry"`` -> ``("r", "strawberry")``; None if it is not that form."""
    m = _QUERY.match(body)
    return (m.group(1), m.group(2)) if m else None


class LetterCountTool(BaseTool):
    name = "letter_count"
    usage = f"Count a letter in a word: <{TAG}>r in strawberry</{TAG}> answers 3."

    def parse_action(self, action: str) -> tuple[Any, bool]:
        body = last_tag_body(action, TAG)
        return (body, True) if body is not None else (None, False)

    def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        query = parse_query(parsed)
        if query is None:
            return (
                {
                    "obs": f"Write one letter, 'in', then the word: <{TAG}>r in strawberry</{TAG}>",
                    "invalid_reason": "bad_count_query",
                },
                False,
                False,
            )
        letter, word = query
        env = self.load_env(trajectory_id)
        env["calls"] = env.get("calls", 0) + 1
        self.save_env(trajectory_id, env)
        return (
            {"obs": str(count_letter(letter, word)), "metrics": {"calls": env["calls"]}},
            False,
            True,
        )
