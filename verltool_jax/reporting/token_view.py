"""The token view of the trajectory report: every response token of a trajectory as its
own box, coloured by the quantity a selector at the top of the page picks, with a
legend, and its numbers on hover, so a researcher finds where the sampler and the
trainer disagree.

The quantities (``METRICS``), per response token ``j``:

* ``sampler``: the sampler's logprob ``s_j`` (``Trajectory.logprobs``);
* ``trainer``: the trainer's logprob ``t_j`` (``token_stats["trainer_logprob"]``,
  recorded by the trainer's token pass, ``train/token_stats.py``);
* ``gap``: ``t_j - s_j``, the token's log importance ratio (``log rho_j`` of
  ``algos/offpolicy.py``: > 0 where the trainer finds the token likelier);
* ``entropy``: the entropy of the trainer's distribution the token was drawn from;
* ``version``: the policy version that sampled it (``Trajectory.versions``);
* ``masked``: its off-policy weight (``token_stats["is_weight"]``): 0 masked, else kept.

Observation tokens (loss mask 0) are grey in every view. Colour scales are shared by the
whole page (both logprobs on one scale; the gap symmetric around 0), so colours compare
across trajectories; the legend prints the scale's ends. The page stays self-contained:
the data sit in ``data-tok`` attributes (JSON, HTML-escaped), the script and style are
inline, nothing is fetched. Works on a ``Trajectory`` or its JSON form (the dumps).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from verltool_jax.rollout.trajectory import ENTROPY, IS_WEIGHT, TRAINER_LOGPROB, trajectory_field

# (value of the selector, its label); the first whose data the page has is shown first
METRICS = (
    ("gap", "gap: trainer − sampler logprob"),
    ("sampler", "sampler logprob"),
    ("trainer", "trainer logprob"),
    ("entropy", "trainer entropy"),
    ("version", "policy version"),
    ("masked", "off-policy mask"),
)

CSS = """
#tokbar{position:sticky;top:0;z-index:2;background:#fff;border-bottom:1px solid #ccc;
 padding:.4em 0;display:flex;flex-wrap:wrap;gap:.4em 1.2em;align-items:center}
#toklegend{display:flex;flex-wrap:wrap;gap:.3em .9em;align-items:center;font-size:.85em}
#toklegend .bar{display:inline-block;width:10em;height:.9em;border:1px solid #999;
 vertical-align:middle;margin:0 .3em}
#toklegend .sw{display:inline-block;width:1.1em;height:.9em;border:1px solid #999;
 vertical-align:middle;margin-right:.25em}
.toks{font-family:ui-monospace,monospace;font-size:.85em;line-height:1.9;
 white-space:pre-wrap;word-break:break-word;border:1px solid #ddd;border-radius:4px;padding:.4em}
.tk{border-radius:2px;padding:1px 0;cursor:default}
.tk.obs{background:#e6e6e6;color:#777}.tk.na{outline:1px dashed #bbb}
.tk:hover{outline:2px solid #000}
.tokstat{font-size:.85em;color:#444;margin:.2em 0}
#toktip{position:fixed;display:none;z-index:3;background:#222;color:#fff;font-size:.8em;
 padding:.4em .6em;border-radius:4px;pointer-events:none;white-space:pre;
 font-family:ui-monospace,monospace}
"""

# Reads every .toks box's data-tok, paints the tokens for the selected metric (inline
# background colours), writes the legend, and shows a token's numbers in #toktip on hover.
JS = r"""
(function () {
  var boxes = Array.prototype.map.call(document.querySelectorAll('.toks'), function (el) {
    return {d: JSON.parse(el.getAttribute('data-tok')), spans: el.querySelectorAll('.tk')};
  });
  var sel = document.getElementById('tokmetric');
  var legend = document.getElementById('toklegend');
  var tip = document.getElementById('toktip');
  if (!sel || !boxes.length) return;
  var WHITE = [255, 255, 255], RED = [202, 0, 32], BLUE = [5, 113, 176],
      PURPLE = [84, 39, 143], KEPT = [166, 219, 160], MASKED = [244, 109, 67];
  var PALETTE = [[141, 211, 199], [255, 237, 111], [190, 186, 218], [251, 128, 114],
                 [128, 177, 211], [253, 180, 98], [179, 222, 105], [252, 205, 229]];
  var KEY = {sampler: 's', trainer: 't', gap: 'g', entropy: 'e', version: 'v', masked: 'w'};
  function mix(a, b, f) {
    f = Math.max(0, Math.min(1, f));
    return [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * f); });
  }
  function css(c) { return 'rgb(' + c.join(',') + ')'; }
  function values(m) {  // every sampled token's value of metric m on the page
    var out = [];
    boxes.forEach(function (b) {
      var xs = b.d[KEY[m]] || [];
      xs.forEach(function (x, i) { if (b.d.m[i] && x !== null && x !== undefined) out.push(x); });
    });
    return out;
  }
  function fmt(x) {
    if (x === null || x === undefined) return 'not recorded';
    if (x !== 0 && Math.abs(x) < 1e-3) return x.toExponential(2);
    return x.toFixed(4);
  }
  function scaleOf(m) {
    var xs = values(m);
    if (m === 'sampler' || m === 'trainer') {
      var both = values('sampler').concat(values('trainer'));
      var lo = both.reduce(function (a, x) { return Math.min(a, x); }, -1e-6);
      return {lo: Math.max(lo, -20), hi: 0, n: xs.length};
    }
    if (m === 'gap') {
      var g = xs.reduce(function (a, x) { return Math.max(a, Math.abs(x)); }, 0);
      return {lo: -g, hi: g, n: xs.length};
    }
    if (m === 'entropy') {  // reduce, not Math.max.apply: a long page has many tokens
      return {lo: 0, hi: xs.reduce(function (a, x) { return Math.max(a, x); }, 1e-6), n: xs.length};
    }
    if (m === 'version') {
      var vs = xs.filter(function (v, i) { return xs.indexOf(v) === i; });
      return {cats: vs.sort(function (a, b) { return a - b; }), n: xs.length};
    }
    return {n: xs.length};
  }
  function colour(m, sc, x) {
    if (x === null || x === undefined) return null;
    if (m === 'sampler' || m === 'trainer') return mix(WHITE, RED, x / sc.lo);
    if (m === 'gap') {
      if (sc.hi === 0) return WHITE;
      return x >= 0 ? mix(WHITE, RED, x / sc.hi) : mix(WHITE, BLUE, x / sc.lo);
    }
    if (m === 'entropy') return mix(WHITE, PURPLE, x / sc.hi);
    if (m === 'version') return PALETTE[sc.cats.indexOf(x) % PALETTE.length];
    return x > 0 ? KEPT : MASKED;
  }
  function swatch(c, label) {
    return '<span><span class="sw" style="background:' + css(c) + '"></span>' + label + '</span>';
  }
  function bar(a, b, c, lo, hi, what) {
    var grad = 'linear-gradient(to right,' + css(a) + ',' + css(b) + (c ? ',' + css(c) : '') + ')';
    return '<span>' + fmt(lo) + '<span class="bar" style="background:' + grad + '"></span>' +
      fmt(hi) + ' ' + what + '</span>';
  }
  function legendOf(m, sc) {
    var parts = [];
    if (!sc.n) parts.push('<span><i>nothing recorded for this view' +
      (m === 'masked' ? ' (no off-policy correction: every weight is 1)' : '') + '</i></span>');
    else if (m === 'sampler' || m === 'trainer')
      parts.push(bar(RED, WHITE, null, sc.lo, sc.hi, '(red: unlikely; one scale for both)'));
    else if (m === 'gap')
      parts.push(bar(BLUE, WHITE, RED, sc.lo, sc.hi,
        '(red: trainer finds the token likelier than the sampler did; blue: less likely)'));
    else if (m === 'entropy') parts.push(bar(WHITE, PURPLE, null, sc.lo, sc.hi, 'nats'));
    else if (m === 'version') sc.cats.forEach(function (v) { parts.push(swatch(colour(m, sc, v), 'v' + v)); });
    else { parts.push(swatch(KEPT, 'kept (weight > 0)')); parts.push(swatch(MASKED, 'masked (weight 0)')); }
    parts.push(swatch([230, 230, 230], 'observation (not trained)'));
    parts.push('<span><span class="sw" style="outline:1px dashed #bbb;border:0"></span>not recorded</span>');
    return parts.join('');
  }
  function paint(m) {
    var sc = scaleOf(m), key = KEY[m];
    boxes.forEach(function (b) {
      var xs = b.d[key] || [];
      Array.prototype.forEach.call(b.spans, function (sp, i) {
        if (!b.d.m[i]) return;
        var c = colour(m, sc, xs[i]);
        sp.classList.toggle('na', c === null);
        sp.style.background = c ? css(c) : '';
        var dark = c && (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) < 140;
        sp.style.color = dark ? '#fff' : '';
      });
    });
    legend.innerHTML = legendOf(m, sc);
    document.body.setAttribute('data-metric', m);
  }
  function tipText(b, i, text) {
    var d = b.d;
    var head = '#' + i + ' ' + JSON.stringify(text) + ' (id ' + d.id[i] + ')';
    if (!d.m[i]) return head + '\nobservation token (not sampled, not trained)';
    var w = d.w ? d.w[i] : null;
    return [head,
      'sampler logprob  ' + fmt(d.s[i]),
      'trainer logprob  ' + fmt(d.t ? d.t[i] : null),
      'gap (t - s)      ' + fmt(d.g ? d.g[i] : null),
      'entropy          ' + fmt(d.e ? d.e[i] : null),
      'policy version   ' + d.v[i],
      'off-policy weight ' + (w === null || w === undefined ? 'not recorded' :
        fmt(w) + (w > 0 ? ' (kept)' : ' (masked)'))].join('\n');
  }
  boxes.forEach(function (b) {
    Array.prototype.forEach.call(b.spans, function (sp, i) {
      sp.addEventListener('mouseenter', function (ev) {
        tip.textContent = tipText(b, i, sp.getAttribute('data-text'));
        tip.style.display = 'block';
        tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - tip.offsetWidth - 4) + 'px';
        var below = ev.clientY + 16, above = ev.clientY - tip.offsetHeight - 8;
        tip.style.top = (below + tip.offsetHeight > window.innerHeight && above > 0 ? above : below) + 'px';
      });
      sp.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    });
  });
  sel.addEventListener('change', function () { paint(sel.value); });
  var want = (location.hash.match(/tokens=(\w+)/) || [])[1];
  if (want && KEY[want]) sel.value = want;
  else if (!values('gap').length) sel.value = 'sampler';
  paint(sel.value);
})();
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _f(x: Any) -> float | None:
    """``x`` to float32 precision; None for a missing or non-finite value (no NaN in JSON)."""
    if x is None or not math.isfinite(float(x)):
        return None
    return float(f"{float(x):.7g}")


def _texts(ids: Sequence[int], tokenizer) -> list[str]:
    if tokenizer is None:
        return [f"⟨{i}⟩ " for i in ids]
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def token_data(t: Any) -> dict[str, list] | None:
    """The per-token lists the view reads, or None for an empty response: ``id`` token
    ids, ``m`` loss mask, ``v`` versions, ``s`` sampler logprobs, and when recorded ``t``
    trainer logprobs, ``g`` their gap ``t - s``, ``e`` entropies, ``w`` off-policy weights;
    None at observation tokens and where a value is missing."""
    ids = list(trajectory_field(t, "response_ids") or [])
    if not ids:
        return None
    mask = [int(m) for m in trajectory_field(t, "loss_mask") or [1] * len(ids)]
    n = len(ids)

    def per_token(values: Sequence | None) -> list | None:
        if not values or len(values) != n:
            return None
        return [_f(x) if m else None for x, m in zip(values, mask)]

    stats = trajectory_field(t, "token_stats") or {}
    s = per_token(trajectory_field(t, "logprobs"))
    out: dict[str, list] = {
        "id": ids,
        "m": mask,
        "v": [int(v) for v in trajectory_field(t, "versions") or [-1] * n],
        "s": s or [None] * n,
    }
    tr = per_token(stats.get(TRAINER_LOGPROB))
    if tr is not None:
        out["t"] = tr
        out["g"] = [None if a is None or b is None else _f(a - b) for a, b in zip(tr, out["s"])]
    for key, name in (("e", ENTROPY), ("w", IS_WEIGHT)):
        values = per_token(stats.get(name))
        if values is not None:
            out[key] = values
    return out


def mismatch_line(d: dict[str, list]) -> str:
    """One line on a trajectory's sampler/trainer mismatch (:func:`token_data`'s ``d``):
    the mean and largest ``|t - s|`` and where, the tokens masked."""
    n = sum(d["m"])
    gaps = [(abs(g), i) for i, g in enumerate(d.get("g") or []) if g is not None]
    if not gaps:
        return f"{n} sampled tokens; trainer logprobs not recorded for this trajectory"
    mean = sum(g for g, _ in gaps) / len(gaps)
    big, at = max(gaps)
    line = f"{n} sampled tokens · mean |trainer − sampler| {mean:.3g} · max {big:.3g} at #{at}"
    w = [x for x in d.get("w") or [] if x is not None]
    if w:
        line += f" · {sum(x <= 0 for x in w)} masked by the off-policy correction"
    return line


def token_section(t: Any, tokenizer=None) -> str:
    """The trajectory's tokens as spans in a ``.toks`` box carrying :func:`token_data`, with
    :func:`mismatch_line` above it; "" for an empty response."""
    d = token_data(t)
    if d is None:
        return ""
    spans = []
    for text, m in zip(_texts(d["id"], tokenizer), d["m"]):
        shown = (text or "∅").replace("\n", "↵\n")
        cls = "tk" if m else "tk obs"
        spans.append(f'<span class="{cls}" data-text="{_e(text)}">{_e(shown)}</span>')
    data = _e(json.dumps(d, separators=(",", ":"), allow_nan=False))
    return (
        f'<div class="tokstat">{_e(mismatch_line(d))}</div>'
        f'<div class="toks" data-tok="{data}">{"".join(spans)}</div>'
    )


def toolbar() -> str:
    """The page's selector, legend and tooltip (once, at the top)."""
    options = "".join(f'<option value="{v}">{_e(label)}</option>' for v, label in METRICS)
    return (
        '<div id="tokbar"><label>Colour tokens by <select id="tokmetric">'
        f"{options}</select></label>"
        '<span id="toklegend"></span></div><div id="toktip" role="tooltip"></div>'
    )
