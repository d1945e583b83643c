"""``write_trajectory_report(trajs, html_path)``: a page a person can read in a browser.

One collapsible section per trajectory: the prompt (chat messages), then the response
in order: each model turn and each tool observation (interleaved from the token ids and
loss mask when a tokenizer is given, else from the recorded actions / observations),
inline images (only well-formed ``data:image/...;base64`` URLs), the reward with its
details, and how the trajectory ended. A search turn is labelled with its query, and
the ``<information>`` block of its observation is shown as a numbered list of the
retrieved documents (title in bold; a gold passage of the row's
``extra_info.gold_titles`` marked). Then every response token on its own, coloured by
the sampler's or the trainer's logprob, their gap, the entropy, the policy version or
the off-policy mask, as a selector at the top picks (``reporting/token_view.py``).
All text is HTML-escaped; the page fetches nothing (its one script is inline).
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tool_server.kit.search_format import parse_information
from tool_server.kit.tags import last_tag_body
from verltool_jax.reporting import token_view
from verltool_jax.rollout.response_text import response_segments
from verltool_jax.rollout.trajectory import trajectory_field

_DATA_URL_RE = re.compile(r"data:image/(png|jpeg|jpg|gif|webp);base64,[A-Za-z0-9+/=\s]+")

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:70em;color:#222}
details{border:1px solid #ccc;border-radius:6px;margin:.6em 0;padding:.3em .8em}
summary{cursor:pointer;font-weight:600}
pre{white-space:pre-wrap;word-break:break-word;margin:.2em 0;padding:.4em;border-radius:4px}
.msg pre{background:#f4f4f4}.action pre{background:#e8f0fe}.obs pre{background:#fff4e0}
.label{font-size:.8em;color:#555;margin-top:.5em}.good{color:#0a7a2f}.bad{color:#b3261e}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:2px 6px}
img{max-width:30em;border:1px solid #ccc;margin:.3em 0}
.info{background:#fff4e0;border-radius:4px;padding:.3em .6em;margin:.2em 0}
.info ol{margin:.2em 0;padding-left:1.6em}.info li{margin:.25em 0}
.info li.gold{background:#e3f5e1}.goldtag{color:#0a7a2f;font-size:.8em;font-weight:600}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _block(kind: str, label: str, text: str) -> str:
    return f'<div class="{kind}"><div class="label">{_e(label)}</div><pre>{_e(text)}</pre></div>'


def _action_label(label: str, text: str) -> str:
    query = last_tag_body(text, "search")
    return f"{label} · search: {query}" if query else label


def _obs_html(label: str, text: str, gold_titles: set) -> str:
    """An observation; its ``<information>`` blocks as lists of documents."""
    blocks = parse_information(text)
    if not blocks:
        return _block("obs", label, text)
    parts = [f'<div class="obs"><div class="label">{_e(label)} · retrieved documents</div>']
    for docs in blocks:
        if not docs:
            parts.append(f'<div class="info"><i>{_e(text.strip())}</i></div>')
            continue
        items = []
        for title, body in docs:
            gold = " ".join(title.split()) in gold_titles
            li = '<li class="gold">' if gold else "<li>"
            tag = ' <span class="goldtag">gold</span>' if gold else ""
            items.append(f"{li}<b>{_e(title)}</b>{tag}<br>{_e(body)}</li>")
        parts.append(f'<div class="info"><ol>{"".join(items)}</ol></div>')
    return "".join(parts) + "</div>"


def _gold_titles(t: Any) -> set:
    data = trajectory_field(t, "data") or {}
    extra = data.get("extra_info") if isinstance(data, Mapping) else None
    titles = (extra or {}).get("gold_titles") or ()
    return {" ".join(str(x).split()) for x in titles}


def image_urls(extras: Iterable[Mapping]) -> list[tuple[Any, str]]:
    """(turn, data URL) of every well-formed image in the observations' extras."""
    out = []
    for ex in extras or ():
        imgs = ex.get("image") if isinstance(ex, Mapping) else None
        for url in imgs if isinstance(imgs, (list, tuple)) else [imgs]:
            if isinstance(url, str) and _DATA_URL_RE.fullmatch(url.strip()):
                out.append((ex.get("turn"), url.strip()))
    return out


def prompt_image_urls(t: Any) -> list[str]:
    """PNG data URLs of the images a trajectory's prompt showed the policy
    (``Trajectory.images`` with source ``"prompt"``; their ``image.image`` is a PIL image)."""
    import base64
    import io

    out = []
    for im in trajectory_field(t, "images") or []:
        pil = getattr(getattr(im, "image", None), "image", None)
        if getattr(im, "source", "") != "prompt" or pil is None:
            continue
        buf = io.BytesIO()
        pil.save(buf, format="PNG")
        out.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


def _prompt_html(t: Any, tokenizer) -> str:
    data = trajectory_field(t, "data") or {}
    messages = data.get("prompt") if isinstance(data, Mapping) else None
    imgs = "".join(
        f'<div class="label">prompt image {k}</div><img alt="prompt image" src="{_e(u)}">'
        for k, u in enumerate(prompt_image_urls(t))
    )
    if messages:
        return imgs + "".join(
            _block("msg", m.get("role", "?"), m.get("content", "")) for m in messages
        )
    ids = trajectory_field(t, "prompt_ids") or []
    if tokenizer is not None:
        return _block("msg", "prompt", tokenizer.decode(list(ids), skip_special_tokens=False))
    return _block("msg", "prompt", f"({len(ids)} prompt tokens; pass a tokenizer to show them)")


def _response_html(t: Any, tokenizer) -> str:
    ids, mask = trajectory_field(t, "response_ids") or [], trajectory_field(t, "loss_mask") or []
    gold = _gold_titles(t)
    parts = []
    if tokenizer is not None and ids:
        turn = obs = 0
        for text, is_model in response_segments(ids, mask, tokenizer):
            if is_model:
                turn += 1
                parts.append(_block("action", _action_label(f"model turn {turn}", text), text))
            else:
                obs += 1
                parts.append(_obs_html(f"observation {obs}", text, gold))
    else:
        actions, observations = (
            trajectory_field(t, "actions") or [],
            trajectory_field(t, "observations") or [],
        )
        for i in range(max(len(actions), len(observations))):
            if i < len(actions):
                parts.append(
                    _block("action", _action_label(f"action {i + 1}", actions[i]), actions[i])
                )
            if i < len(observations):
                parts.append(_obs_html(f"observation {i + 1}", observations[i], gold))
    for turn, url in image_urls(trajectory_field(t, "extras") or []):
        parts.append(
            f'<div class="label">image (turn {_e(turn)})</div>'
            f'<img alt="observation image" src="{_e(url)}">'
        )
    return "".join(parts) or "<p><i>(empty response)</i></p>"


def _summary(i: int, t: Any) -> str:
    reward = trajectory_field(t, "reward")
    info = trajectory_field(t, "reward_info") or {}
    acc = info.get("acc")
    cls = "good" if acc else "bad"
    r = "n/a" if reward is None else f"{reward:.3f}"
    data = trajectory_field(t, "data") or {}
    gt = (data.get("reward_model") or {}).get("ground_truth") if isinstance(data, Mapping) else None
    return (
        f'#{i} <span class="{cls}">reward {_e(r)}</span> · {_e(trajectory_field(t, "termination") or "?")}'
        f" · turns {_e(trajectory_field(t, 'num_turns', 0))} · tool calls {_e(trajectory_field(t, 'tool_calls', 0))}"
        f" ({_e(trajectory_field(t, 'invalid_tool_calls', 0))} invalid)"
        + (f" · truth {_e(gt)}" if gt is not None else "")
        + f" · <code>{_e(trajectory_field(t, 'trajectory_id', ''))}</code>"
    )


def _details_table(t: Any) -> str:
    rows = {
        "group": trajectory_field(t, "group_id"),
        "reward info": json.dumps(
            trajectory_field(t, "reward_info") or {}, default=str, sort_keys=True
        ),
        "policy versions": sorted({v for v in (trajectory_field(t, "versions") or []) if v >= 0}),
        "response tokens": len(trajectory_field(t, "response_ids") or []),
        "wall time (s)": trajectory_field(t, "wall_time_s"),
        "error": trajectory_field(t, "error"),
    }
    return (
        "<table>"
        + "".join(
            f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
            for k, v in rows.items()
            if v not in (None, "")
        )
        + "</table>"
    )


def render_report(
    trajectories: Iterable[Any], title: str = "Trajectories", tokenizer=None, open_first: int = 3
) -> str:
    """The HTML page as a string (see the module doc)."""
    trajs = list(trajectories)
    rewards = [r for r in (trajectory_field(t, "reward") for t in trajs) if r is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "n/a"
    body = [f"<h1>{_e(title)}</h1>", f"<p>{len(trajs)} trajectories · mean reward {_e(mean)}</p>"]
    tokens = [token_view.token_section(t, tokenizer) for t in trajs]
    if any(tokens):
        body.insert(0, token_view.toolbar())
    for i, t in enumerate(trajs):
        opened = " open" if i < open_first else ""
        body.append(
            f'<details class="traj"{opened}><summary>{_summary(i, t)}</summary>'
            f"<h3>Prompt</h3>{_prompt_html(t, tokenizer)}"
            f"<h3>Response</h3>{_response_html(t, tokenizer)}"
            + (f"<h3>Tokens</h3>{tokens[i]}" if tokens[i] else "")
            + f"<h3>Details</h3>{_details_table(t)}</details>"
        )
    script = f"<script>{token_view.JS}</script>" if any(tokens) else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}{token_view.CSS}</style></head><body>"
        + "\n".join(body)
        + script
        + "</body></html>\n"
    )


def write_trajectory_report(
    trajectories: Iterable[Any],
    html_path: str | os.PathLike,
    title: str = "Trajectories",
    tokenizer: Any | None = None,
) -> Path:
    """Write :func:`render_report` to ``html_path``; returns the path."""
    path = Path(html_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(trajectories, title, tokenizer), encoding="utf-8")
    return path
