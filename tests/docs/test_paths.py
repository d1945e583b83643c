"""Every repository path the documentation names exists, and the README stays a guide.

A reference is checked when it is a markdown link (resolved from the page's folder, with
its ``#anchor`` checked against the target page's headings) or sits in backticks (inline
code or a fenced block), where it is read from the repository root:

* a path whose first part is a top-level entry of the repository (``verltool_jax/...``,
  ``tests/...``, ``docs/...``); a ``:variant`` or ``::test`` suffix is dropped
  (``configs/vt_math.py:smol`` -> ``configs/vt_math.py``);
* a path inside a package written without the package (``train/step.py``,
  ``kit/workspace.py``) when it ends in ``/`` or a file extension: it must exist under
  ``verltool_jax/``, ``tool_server/`` or ``tests/``;
* a dotted module name (``verltool_jax.train.step``, ``tool_server.kit.tags``), with at
  most one attribute after the module, which must appear in the module's source.
  ``tool_server.<x>`` is a config key (``tool_server.url``) unless ``x`` is a module.

Not repository paths, and skipped: URLs, absolute paths, run outputs (``runs/``,
``outputs/``), the virtual environment, ``<placeholders>``, ``$VARIABLES``, globs and
``...``. Entry-point group names (``verltool_jax.tools``) look like modules but are not.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tool_server.registry import TOOLS_GROUP
from verltool_jax.rewards.base import REWARDS_GROUP
from verltool_jax.tasks import TASKS_GROUP

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250

# Top-level entries that a path may start with (run outputs and tool folders are not).
NOT_REPO = {"runs", "outputs", "build", "dist", "__pycache__"}
ROOTS = {
    p.name
    for p in REPO.iterdir()
    if (not p.name.startswith(".") or p.name == ".ci")
    and p.name not in NOT_REPO
    and not p.name.endswith(".egg-info")
}
# Folders whose subfolders the docs name without the folder (``train/step.py``).
PACKAGES = ("verltool_jax", "tool_server", "tests")
SUBPACKAGES = {d.name for pkg in PACKAGES for d in (REPO / pkg).iterdir() if d.is_dir()}
SUBPACKAGES -= NOT_REPO

SKIP_CHARS = set("<>*?{}$~")
SEPARATORS = re.compile(r"[\s()\[\],;|\"'`]+")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DOTTED = re.compile(r"^(verltool_jax|tool_server)(\.[A-Za-z_]\w*)+$")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
ISO_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.\w+)?$")  # NAME, DIR, NAME.py


def doc_files() -> list[Path]:
    pages = [REPO / "README.md", REPO / "DEVELOPERS.md", REPO / "launch" / "README.md"]
    return pages + sorted((REPO / "docs").rglob("*.md"))


def split_code(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(code, prose)``: (line number, text) of the code (fenced blocks and inline spans)
    and of the prose with the inline code taken out."""
    code, prose = [], []
    in_fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if in_fence:
            code.append((n, line))
            continue
        code.extend((n, m.group(2)) for m in INLINE_CODE.finditer(line))
        prose.append((n, INLINE_CODE.sub(" ", line)))
    return code, prose


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            s = slug(m.group(1))
            out.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
    return out


def check_link(target: str, page: Path, text: str) -> str | None:
    """Why the markdown link ``target`` on ``page`` (whose text is ``text``) is broken."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    if path:
        dest = (page.parent / path).resolve()
        if dest != REPO and REPO not in dest.parents:
            return "points outside the repository"
        if not dest.exists():
            return "no such file"
        if not anchor or dest.suffix != ".md":
            return None
        text, where = dest.read_text(), str(dest.relative_to(REPO))
    else:
        where = "this page"
    return None if anchor in anchors(text) else f"no heading #{anchor} in {where}"


def module_problem(name: str) -> str | None:
    """Why the dotted name ``verltool_jax.a.b[.attr]`` does not resolve, or None."""
    parts = name.split(".")
    cur, i = REPO / parts[0], 1
    while i < len(parts) and (cur / parts[i]).is_dir():
        cur, i = cur / parts[i], i + 1
    if i < len(parts) and (cur / f"{parts[i]}.py").is_file():
        cur, i = cur / f"{parts[i]}.py", i + 1
    elif i == 1:
        # tool_server.url, tool_server.tool_opt...: a config key, not a module
        return None if parts[0] == "tool_server" else "no such module"
    if i == len(parts):
        return None
    source = cur / "__init__.py" if cur.is_dir() else cur
    if not re.search(rf"\b{re.escape(parts[i])}\b", source.read_text()):
        return f"{parts[i]!r} is not in {source.relative_to(REPO)}"
    return None


def path_problem(token: str) -> str | None:
    """Why the code token ``token`` names a repository path that does not exist, or None
    (also None when it is no repository path at all)."""
    if not token or "://" in token or "..." in token or SKIP_CHARS & set(token):
        return None
    token = token.split("=")[-1].rstrip(".:")
    if token in (TOOLS_GROUP, TASKS_GROUP, REWARDS_GROUP):
        return None  # an entry-point group (docs/plugins.md), not a module
    if DOTTED.match(token):
        return module_problem(token)
    if token.startswith(("/", "./")) or "/" not in token:
        return None
    token = token.split(":")[0]
    parts = token.rstrip("/").split("/")
    if parts[0] in ROOTS:
        where = [REPO / token]
    elif parts[0] in SUBPACKAGES and (token.endswith("/") or "." in parts[-1]):
        where = [REPO / pkg / token for pkg in PACKAGES]
    else:
        return None
    if any(p.exists() for p in where):
        return None
    if any(PLACEHOLDER.match(part) for part in parts):
        return None  # configs/NAME.py, BIN/llama-server: written for the reader to fill in
    return "no such file" + ("" if len(where) == 1 else " under " + ", ".join(PACKAGES))


def problems_in(text: str, page: Path) -> list[str]:
    """Every broken reference in ``text``, the text of ``page``."""
    out = []
    code, prose = split_code(text)
    for n, chunk in code:
        for token in SEPARATORS.split(chunk):
            why = path_problem(token)
            if why:
                out.append(f"line {n}: `{token}`: {why}")
    for n, line in prose:
        for m in LINK.finditer(line):
            why = check_link(m.group(1), page, text)
            if why:
                out.append(f"line {n}: ({m.group(1)}): {why}")
    return out


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_page_names_exists(doc):
    found = problems_in(doc.read_text(), doc)
    assert not found, f"{doc.relative_to(REPO)}:\n" + "\n".join(found)


def test_the_readme_is_a_guide():
    text = (REPO / "README.md").read_text()
    n = len(text.splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move reference material "
        "to docs/ and figures to docs/performance.md"
    )
    dates = ISO_DATE.findall(text)
    assert not dates, (
        f"README.md holds dates {dates}: a dated figure belongs in docs/performance.md"
    )


def test_the_checker_finds_stale_paths():
    page = """
The health test is `tests/test_trainer_health.py`; the shared engine is
`tests/conftest_samplers.py: vllm_sampler`; the VL test `tests/test_vision_language.py`.
Run `python -m pytest tests/train/test_nope.py::test_x -q` with `configs/vt_nope.py:smol`.
Modules: `verltool_jax.train.no_such_module`, `verltool_jax.train.step.no_such_name`,
`tool_server.kit.no_such_kit`, package-relative `train/no_such.py`.
See [the page](no_such_page.md), [a heading](architecture.md#no-such-heading) and
[outside](../../secret.md).
```bash
python benchmarks/no_such_benchmark.py --steps 2
```
"""
    found = problems_in(page, REPO / "docs" / "page.md")
    for stale in (
        "tests/test_trainer_health.py",
        "tests/conftest_samplers.py",
        "tests/test_vision_language.py",
        "tests/train/test_nope.py",
        "configs/vt_nope.py",
        "verltool_jax.train.no_such_module",
        "verltool_jax.train.step.no_such_name",
        "tool_server.kit.no_such_kit",
        "train/no_such.py",
        "no_such_page.md",
        "architecture.md#no-such-heading",
        "../../secret.md",
        "benchmarks/no_such_benchmark.py",
    ):
        assert any(stale in f for f in found), (stale, found)
    assert len(found) == 13, found


def test_the_checker_passes_what_exists_and_what_is_no_repo_path():
    page = """
`verltool_jax/train/step.py`, `tests/train/test_config.py`, `configs/vt_math.py:smol`,
`tests/train/test_trainer_e2e.py::test_console_shows_the_trainer_and_the_log_file_the_libraries`,
`train/batch.py`, `kit/workspace.py`, `support/samplers.py`, `verltool_jax.train.step`,
`verltool_jax.cli.parse_command_line`, `tool_server.kit.tags`, `python -m verltool_jax.eval`,
[architecture](architecture.md#layout), [launch](../launch/README.md), [web](https://example.com/x.md).
Not repository paths: `runs/tiny_math/metrics.jsonl`, `<out_dir>/run.log`, `tests/*.py`,
`configs/<family>.py`, `/tmp/x`, `tool_server.url`, `tool_server.tool_opt.topk`,
`--config.trainer.out_dir=runs/x`, `.venv/bin/ruff`, `$HOME/x`, `reward/mean`, `eval/acc`,
`http://127.0.0.1:5000/get_observation`, `~/.cache/verltool_jax/models`, `a/b/...`.
"""
    assert problems_in(page, REPO / "docs" / "page.md") == []
