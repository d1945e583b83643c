"""``python_code`` under ``--compat verltool``: VerlTool's action parsing, program
prelude, standard input and observation format (not a tool: ``_`` files are skipped).

Follows VerlTool's ``verl_tool/servers/tools/python_code.py`` (stateless, prelude on,
no history re-execution):

* code: all ``<python>...</python>`` blocks, else all ```` ```python...``` ````, else all
  ```` ```py...``` ```` (an optional newline may follow the opening fence), each
  stripped, joined by newlines;
* the program is a prelude of imports (``from math import *`` and the others in
  :data:`STAR_IMPORTS`, then ``import`` of the same modules, a recursion limit of
  600000, ``import sys, os, io, ast``) with the user's code starting on line
  :data:`USER_CODE_LINE` of ``main.py``, as in VerlTool's generated file, so traceback
  line numbers agree;
* code naming a module or call in :data:`BLOCKED_MODULES` / :data:`BLOCKED_CALLS` is not
  run: stderr is :data:`BLOCKED_MESSAGE` (VerlTool's check; the sandbox is still there);
* stdin: ``extra_field["stdin"]``, replaced by the first ```` ```input\\n...\\n``` ```` block
  of the action (stripped); empty means none;
* text = (stdout + "\\n" + stderr [+ "Execution timed out after T seconds.\\n"]),
  stripped of spaces and newlines at both ends, cut to :data:`MAX_OBS_CHARS`;
* the observation wraps the text in a ``result`` block chosen by the action's shape
  (:func:`wrap_observation`); done=False, valid=True.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tool_server.python_pool import RunResult

STAR_IMPORTS = (
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
    "builtins",
    "typing",
)
PLAIN_IMPORTS = tuple(m for m in STAR_IMPORTS if m not in ("builtins", "typing"))
RECURSION_LIMIT = 6 * 10**5
USER_CODE_LINE = 82
MAX_OBS_CHARS = 100_000
OUTPUT_TAG = "result"
BLOCKED_MODULES = (
    "subprocess",
    "multiprocessing",
    "threading",
    "socket",
    "psutil",
    "resource",
    "ctypes",
)
BLOCKED_CALLS = (
    "os.system",
    "os.popen",
    "os.spawn",
    "os.fork",
    "os.exec",
    "sys.exit",
    "os._exit",
    "os.kill",
)
BLOCKED_MESSAGE = "Execution blocked: Code contains potentially dangerous operations or imports."

_CODE_PATTERNS = tuple(
    re.compile(p, re.DOTALL)
    for p in (r"<python>(.*?)</python>", r"```\n?python(.*?)```", r"```\n?py(.*?)```")
)
_INPUT_RE = re.compile(r"```input\n(.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class CompatCall:
    """A parsed action: the code to run and the whole action (its shape picks the
    observation wrapping; it may carry an ``input`` block)."""

    code: str
    action: str


def extract_code(action: str) -> str | None:
    """The code of ``action`` as VerlTool parses it (module docstring), or None."""
    for pattern in _CODE_PATTERNS:
        blocks = pattern.findall(action)
        if blocks:
            return "\n".join(b.strip() for b in blocks)
    return None


def _prelude() -> str:
    lines = [f"from {m} import *" for m in STAR_IMPORTS]
    lines += [f"import {m}" for m in PLAIN_IMPORTS]
    lines += [f"sys.setrecursionlimit({RECURSION_LIMIT})", "import sys, os, io, ast"]
    assert len(lines) < USER_CODE_LINE
    return "\n".join(lines) + "\n" * (USER_CODE_LINE - len(lines))


PRELUDE = _prelude()


def program(code: str) -> str:
    """``main.py``: the prelude, then ``code`` from line :data:`USER_CODE_LINE`."""
    return PRELUDE + code + "\n"


def is_blocked(code: str) -> bool:
    """VerlTool's refusal test: an ``import m`` / ``from m`` of a blocked module, or a
    blocked call name, anywhere in the code text."""
    return any(f"import {m}" in code or f"from {m}" in code for m in BLOCKED_MODULES) or any(
        c in code for c in BLOCKED_CALLS
    )


def stdin_for(action: str, extra_field: dict | None) -> str | None:
    """The program's standard input (module docstring), None for none."""
    stdin = (extra_field or {}).get("stdin", "")
    blocks = _INPUT_RE.findall(action)
    if blocks:
        stdin = blocks[0].strip()
    return stdin if isinstance(stdin, str) and stdin else None


def result_text(r: RunResult, wall_s: float, clean=lambda s: s) -> str:
    """The observation text of a run (module docstring); ``clean`` edits stderr."""
    stderr = clean(r.stderr)
    if r.timed_out:
        stderr += f"Execution timed out after {wall_s:g} seconds.\n"
    return (r.stdout + "\n" + stderr).strip(" \n")[:MAX_OBS_CHARS]


def wrap_observation(action: str, text: str, tag: str = OUTPUT_TAG) -> str:
    """VerlTool's output block for ``text``, by the action's shape:

    * contains ```` ```output```` or ```` ```python````: ``"\\n```result\\n{text}\\n```\\n"``
      when the action's ```` ``` ```` count is even, else ``"\\n{text}\\n```\\n"``;
    * contains ``</tool_call>``: ``"\\n<tool_response>\\n```result\\n{text}\\n```\\n</tool_response>\\n"``;
    * ends (ignoring spaces/newlines) with ``<result>``: ``"\\n{text}\\n</result>\\n"``;
    * otherwise: ``"\\n<result>\\n{text}\\n</result>\\n"``.
    """
    if "```output" in action or "```python" in action:
        if action.count("```") % 2 == 0:
            return f"\n```{tag}\n{text}\n```\n"
        return f"\n{text}\n```\n"
    if "</tool_call>" in action:
        return f"\n<tool_response>\n```{tag}\n{text}\n```\n</tool_response>\n"
    tagged = f"<{tag}>" in action or f"</{tag}>" in action or "</python>" in action
    if tagged and action.strip(" \n").endswith(f"<{tag}>"):
        return f"\n{text}\n</{tag}>\n"
    return f"\n<{tag}>\n{text}\n</{tag}>\n"


def blocked_result() -> RunResult:
    """The run result of a refused program (nothing ran)."""
    return RunResult(stderr=BLOCKED_MESSAGE)
