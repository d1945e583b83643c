"""The report's token view (``reporting/token_view.py``): the per-token data and the HTML
it writes (fast, no browser), then the page in a real headless Chromium: the selector
repaints the tokens, the legend follows, hovering a token shows its numbers, nothing is
fetched."""

from __future__ import annotations

import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support.tiny_data import tiny_tokenizer

from verltool_jax.reporting import render_report, write_trajectory_report
from verltool_jax.reporting.token_view import METRICS, mismatch_line, token_data
from verltool_jax.rollout.trajectory import (
    ENTROPY,
    IS_WEIGHT,
    TRAINER_LOGPROB,
    Trajectory,
    dump_trajectories,
    load_trajectories,
)

CHROMIUM = "/usr/bin/chromium"


def _trajs() -> list[Trajectory]:
    """Two trajectories of a tool call: model turn, observation, answer. The first has the
    trainer's stats (one token masked, one sampled by an older version, a large gap at its
    '<answer>' token); the second has none (e.g. a held-out one)."""
    tok = tiny_tokenizer()
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    act, obs, ans = (
        enc("<python>print(6*7)</python>"),
        enc("<result>42</result>"),
        enc("<answer>42"),
    )
    ids = act + obs + ans
    mask = [1] * len(act) + [0] * len(obs) + [1] * len(ans)
    n = len(ids)
    s = [-0.05 * (j + 1) if m else 0.0 for j, m in enumerate(mask)]
    s[0] = -3.5  # the least likely token for the sampler
    t = [x + 0.001 if m else None for x, m in zip(s, mask)]
    big = len(act) + len(obs)  # the first answer token: the trainer disagrees
    t[big] = s[big] + 1.5
    w = [1.0 if m else None for m in mask]
    w[big] = 0.0
    ent = [0.1 * (j % 7) if m else None for j, m in enumerate(mask)]
    versions = [2 if j < 3 else 3 for j in range(n)]
    versions = [v if m else -1 for v, m in zip(versions, mask)]
    first = Trajectory(
        trajectory_id="g0-0",
        group_id="g0",
        prompt_ids=enc("6*7?"),
        response_ids=ids,
        loss_mask=mask,
        logprobs=s,
        versions=versions,
        token_stats={TRAINER_LOGPROB: t, ENTROPY: ent, IS_WEIGHT: w},
        reward=1.0,
        reward_info={"acc": 1.0},
        termination="eos",
    )
    plain = Trajectory(
        trajectory_id="g0-1",
        group_id="g0",
        prompt_ids=enc("6*7?"),
        response_ids=ans,
        loss_mask=[1] * len(ans),
        logprobs=[-0.2] * len(ans),
        versions=[3] * len(ans),
        reward=0.0,
    )
    return [first, plain]


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_token_data_holds_the_gap_and_leaves_observations_out():
    first, plain = _trajs()
    d = token_data(first)
    assert d is not None
    n = len(first.response_ids)
    assert d["id"] == first.response_ids and len(d["m"]) == n
    for key in ("s", "t", "g", "e", "w", "v"):
        assert len(d[key]) == n, key
    for j, m in enumerate(first.loss_mask):
        if not m:
            assert d["s"][j] is d["t"][j] is d["g"][j] is d["e"][j] is d["w"][j] is None
            continue
        assert d["g"][j] == pytest.approx(d["t"][j] - d["s"][j], abs=1e-6)
    big = d["g"].index(max(g for g in d["g"] if g is not None))
    assert d["g"][big] == pytest.approx(1.5) and d["w"][big] == 0.0
    line = mismatch_line(d)
    assert f"max 1.5 at #{big}" in line and "1 masked" in line
    # a trajectory the trainer did not score: no trainer lists, the line says so
    p = token_data(plain)
    assert p is not None and "t" not in p and "g" not in p and "w" not in p
    assert "not recorded" in mismatch_line(p)


def test_token_stats_survive_the_dump_and_the_report_reads_the_dump(tmp_path):
    trajs = _trajs()
    dump_trajectories(tmp_path / "step.jsonl", trajs)
    back = load_trajectories(tmp_path / "step.jsonl")
    assert back[0].token_stats == trajs[0].token_stats
    back[0].check()
    rows = [json.loads(x) for x in (tmp_path / "step.jsonl").read_text().splitlines()]
    assert token_data(rows[0]) == token_data(trajs[0])  # the report reads the JSON form too


def test_trajectory_check_names_a_token_stats_list_of_the_wrong_length():
    t = _trajs()[0]
    t.token_stats[ENTROPY] = t.token_stats[ENTROPY][:-1]
    with pytest.raises(ValueError, match=r"token_stats\['entropy'\] has length"):
        t.check()


def test_report_page_is_self_contained_and_escapes_the_token_texts():
    trajs = _trajs()
    evil = trajs[1]
    tok = tiny_tokenizer()
    evil.response_ids = tok.encode('</script><img src="http://x/y.png">', add_special_tokens=False)
    n = len(evil.response_ids)
    evil.loss_mask, evil.logprobs, evil.versions = [1] * n, [-0.1] * n, [3] * n
    page = render_report(trajs, tokenizer=tok)
    p = _Tags()
    p.feed(page)
    tags = [t for t, _ in p.tags]
    assert tags.count("script") == 1  # the view's own, inline
    assert all("src" not in a for t, a in p.tags if t == "script")
    assert "img" not in tags and "link" not in tags  # no token text became markup
    assert "http" not in page.replace("http://x/y.png", "")  # nothing else to fetch
    options = [a["value"] for t, a in p.tags if t == "option"]
    assert options == [v for v, _ in METRICS]
    boxes = [a for t, a in p.tags if t == "div" and a.get("class") == "toks"]
    assert len(boxes) == 2
    assert json.loads(boxes[0]["data-tok"]) == token_data(trajs[0])
    spans = [a for t, a in p.tags if t == "span" and a.get("class", "").startswith("tk")]
    assert len(spans) == len(trajs[0].response_ids) + n
    # no response tokens at all: no selector, no script
    empty = render_report([{"trajectory_id": "x", "prompt_ids": [1]}])
    assert "<script" not in empty and "tokmetric" not in empty


def _browser_or_skip():
    """playwright's sync API and Debian's chromium (scripts/setup.sh installs both); in CI
    their absence fails the test instead of skipping it."""
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the playwright package (requirements-dev.txt)")
        sync_playwright = None
    if not (Path(CHROMIUM).is_file() or shutil.which("chromium")):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        msg = "no browser for the token view test: " + ", ".join(missing) + "; run scripts/setup.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return sync_playwright


def _backgrounds(page) -> list[str]:
    return page.eval_on_selector_all(
        ".toks .tk", "els => els.map(e => getComputedStyle(e).backgroundColor)"
    )


def test_token_view_in_a_real_browser(tmp_path):
    """Chromium headless: the default view is the gap; switching the selector repaints
    every sampled token and rewrites the legend; each view's colours sit where its numbers
    say; hovering a token shows its numbers; the page asks for nothing but itself."""
    sync_playwright = _browser_or_skip()
    trajs = _trajs()
    first = trajs[0]
    path = write_trajectory_report(trajs, tmp_path / "report.html", tokenizer=tiny_tokenizer())
    mask = first.loss_mask
    big = mask.index(0) + mask.count(0)  # the first answer token (the large gap)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 600})
        requests, errors = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        assert page.input_value("#tokmetric") == "gap"
        gap = _backgrounds(page)
        n = len(mask)
        grey = gap[mask.index(0)]
        assert all(gap[j] == grey for j in range(n) if not mask[j])  # observations
        # the gap view: the large positive gap is the scale's end, pure red
        assert gap[big] == "rgb(202, 0, 32)"
        assert "trainer finds the token likelier" in page.inner_text("#toklegend")
        views = {"gap": gap}
        for value, _ in METRICS[1:]:
            page.select_option("#tokmetric", value)
            views[value] = _backgrounds(page)
            assert page.get_attribute("body", "data-metric") == value
        sampled = [j for j in range(n) if mask[j]]
        for a in views:
            for b in views:
                if a < b and a != "trainer" and b != "trainer":
                    assert [views[a][j] for j in sampled] != [views[b][j] for j in sampled], (a, b)
        # the sampler's least likely token (-3.5, the scale's low end) is pure red
        assert views["sampler"][0] == "rgb(202, 0, 32)"
        assert views["masked"][big] == "rgb(244, 109, 67)"  # weight 0
        assert views["masked"][0] == "rgb(166, 219, 160)"  # kept
        assert len({views["version"][j] for j in sampled}) == 2  # versions 2 and 3
        # the second trajectory has no trainer stats: its tokens are "not recorded"
        page.select_option("#tokmetric", "entropy")
        second = page.locator(".toks").nth(1).locator(".tk")
        assert "na" in (second.first.get_attribute("class") or "")
        # hover: the numbers of the token under the pointer
        page.select_option("#tokmetric", "gap")
        page.locator(".toks").first.locator(".tk").nth(big).hover()
        tip = page.locator("#toktip")
        assert tip.is_visible()
        text = tip.inner_text()
        s, t = first.logprobs[big], first.token_stats[TRAINER_LOGPROB][big]
        assert f"sampler logprob  {s:.4f}" in text and f"trainer logprob  {t:.4f}" in text
        assert "gap (t - s)      1.5000" in text and "(masked)" in text
        assert "policy version   3" in text
        page.locator(".toks").first.locator(".tk.obs").first.hover()
        assert "observation token" in tip.inner_text()
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot))
        browser.close()
    assert not errors, errors
    assert requests == [path.as_uri()]  # one file, nothing fetched
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
