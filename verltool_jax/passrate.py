"""``python -m verltool_jax.passrate --config CFG --checkpoint SPEC --out DIR [--k 8]``

Measures a prompt pool before training on it: each prompt's pass rate under a policy,
from ``k`` samples per prompt through the run's own sampler and tool server, scored by
the task's own reward (correctness ``acc``). Writes ``DIR/passrate.csv`` (one row per
prompt: ``prompt_id, set, group, level, k, successes, rate, reward, tokens, seconds``),
prints the histogram of successes (0..k), pass@1 (mean rate) and pass@k (share of prompts
solved at least once), per set and group, and with ``--write-pool FILE`` writes the rows
whose rate lies strictly between ``--keep-between LO,HI`` (default ``0,1``) as a training
data file (offline difficulty filtering, as Polaris and Skywork-OR1 do), to be given to a
run as ``--config.data.train_files=FILE`` (``task.name`` is then ignored for training).

The pool is the config's training data (its task's ``train.parquet``), or ``--data``
files (verl layout). Resumable: the table is appended prompt by prompt and a rerun skips
the prompts it holds (same ``k``). ``--limit N`` takes the first N prompts; ``--batch``
prompts are rolled out at once. ``--checkpoint`` as for ``python -m verltool_jax.eval``
(``base``, an HF directory, a run directory, ...). Sampling at ``--temperature``
(default: the config's ``rollout.temperature``). Library and engine logs go to
``DIR/run.log``.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Light at import: vLLM's engine core, spawned, re-imports the main module (2 s with JAX).
from verltool_jax.runtime.append_file import open_for_append
from verltool_jax.schema import ConfigError

FLAGS = {
    "checkpoint": "base",
    "out": None,
    "k": "8",
    "data": "",
    "limit": "0",
    "batch": "16",
    "temperature": "",
    "write_pool": "",
    "keep_between": "0,1",
}
COLUMNS = (
    "prompt_id",
    "set",
    "group",
    "level",
    "k",
    "successes",
    "rate",
    "reward",
    "tokens",
    "seconds",
)


@dataclass(frozen=True)
class PromptRate:
    """One prompt's measurement (a row of ``passrate.csv``)."""

    prompt_id: str
    set: str
    group: str
    level: int
    k: int
    successes: int
    reward: float
    tokens: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.successes / self.k

    def csv_row(self) -> dict:
        return {
            "prompt_id": self.prompt_id,
            "set": self.set,
            "group": self.group,
            "level": self.level,
            "k": self.k,
            "successes": self.successes,
            "rate": round(self.rate, 6),
            "reward": round(self.reward, 6),
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_csv(cls, r: dict) -> PromptRate:
        return cls(
            r["prompt_id"],
            r["set"],
            r["group"],
            int(r["level"]),
            int(r["k"]),
            int(r["successes"]),
            float(r["reward"]),
            int(r["tokens"]),
            float(r["seconds"]),
        )


def prompt_id(row: dict) -> str:
    """A stable id of a data row: its set and index plus a hash of its prompt and answer
    (so a table is never matched to other data)."""
    extra = row.get("extra_info") or {}
    body = json.dumps(
        [row.get("prompt"), (row.get("reward_model") or {}).get("ground_truth")],
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha1(body.encode()).hexdigest()[:10]
    return f"{row.get('data_source', '?')}:{extra.get('index', '?')}:{digest}"


def row_labels(row: dict) -> tuple[str, str, int]:
    """(set, group, level) of a row for the tables: ``extra_info`` ``set`` / ``difficulty``
    when present, else the data source and level 0."""
    extra = row.get("extra_info") or {}
    diff = extra.get("difficulty") or {}
    group = str(diff.get("group", row.get("data_source", "?")))
    return str(extra.get("set") or row.get("data_source") or "?"), group, int(diff.get("level", 0))


def keep_between(rates: Sequence[PromptRate], lo: float, hi: float) -> set[str]:
    """Ids of the prompts whose pass rate lies strictly between ``lo`` and ``hi``."""
    return {r.prompt_id for r in rates if lo < r.rate < hi}


def summary(rates: Sequence[PromptRate]) -> dict[str, Any]:
    """Histogram of successes, pass@1 (mean rate) and pass@k (share solved at least once)."""
    if not rates:
        return {"prompts": 0}
    k = max(r.k for r in rates)
    hist = Counter(r.successes for r in rates)
    return {
        "prompts": len(rates),
        "k": k,
        "histogram": {s: hist.get(s, 0) for s in range(k + 1)},
        "pass@1": sum(r.rate for r in rates) / len(rates),
        f"pass@{k}": sum(r.successes > 0 for r in rates) / len(rates),
        "seconds_per_prompt": sum(r.seconds for r in rates) / len(rates),
        "tokens_per_prompt": sum(r.tokens for r in rates) / len(rates),
    }


def format_summary(rates: Sequence[PromptRate]) -> str:
    """The printed report: overall, then per set and group."""
    lines = []
    parts: dict[str, list[PromptRate]] = defaultdict(list)
    for r in rates:
        parts[f"{r.set} / {r.group}"].append(r)
    for name, rs in [("all", list(rates))] + sorted(parts.items()):
        s = summary(rs)
        if not s["prompts"]:
            continue
        k = s["k"]
        hist = " ".join(f"{c}:{n}" for c, n in s["histogram"].items())
        lines.append(
            f"{name:40s} n={s['prompts']:4d}  pass@1 {s['pass@1']:.3f}  "
            f"pass@{k} {s[f'pass@{k}']:.3f}  successes/{k} [{hist}]"
        )
    return "\n".join(lines)


def read_table(path: Path) -> dict[str, PromptRate]:
    if not path.is_file():
        return {}
    with path.open() as f:
        return {r["prompt_id"]: PromptRate.from_csv(r) for r in csv.DictReader(f)}


def append_rows(path: Path, rates: Sequence[PromptRate]) -> None:
    new = not path.is_file()
    with open_for_append(path, newline="") as f:  # a row torn by a crash is dropped
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        for r in rates:
            w.writerow(r.csv_row())
        f.flush()


def parse_bounds(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--keep_between={text!r}: give two rates LO,HI, e.g. 0,1") from None
    if not 0.0 <= lo < hi <= 1.0:
        raise ConfigError(f"--keep_between={text!r}: need 0 <= LO < HI <= 1")
    return lo, hi


def measure(
    config: Any,
    checkpoint: str,
    out: Path,
    k: int,
    *,
    data: Sequence[str] = (),
    limit: int = 0,
    batch: int = 16,
    temperature: float | None = None,
    write_pool: str = "",
    bounds: tuple[float, float] = (0.0, 1.0),
    echo: bool = True,
) -> list[PromptRate]:
    """Measure (or finish measuring) the pool; returns every prompt's rate (see the
    module doc). ``write_pool``: write the kept rows there."""
    from tool_server.client import ToolClient
    from verltool_jax.data.pipeline import _prompt_transform
    from verltool_jax.data.readers import read_files, write_rows
    from verltool_jax.eval import load_policy
    from verltool_jax.models.lora import sampler_params
    from verltool_jax.reporting.progress import ProgressBar
    from verltool_jax.runtime.console import console
    from verltool_jax.train.build import build_run
    from verltool_jax.train.evaluate import prompt_item, rollout_scored

    say = (lambda m: print(m, file=console(), flush=True)) if echo else (lambda m: None)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "passrate.csv"
    done = read_table(table)
    with build_run(config, out_dir=out, write_metrics=False) as run:
        rc = run.config
        files = list(data) or run.files["train"]
        if not files:
            raise ValueError("no prompt pool: the config has no training data; give --data")
        rows = read_files(files, rc.data.format)
        if limit:
            rows = rows[:limit]
        ids = [prompt_id(r) for r in rows]
        stale = [i for i in ids if i in done and done[i].k != k]
        if stale:
            raise ValueError(
                f"{table} holds {len(stale)} prompts measured with another k; "
                f"use another --out or the same --k"
            )
        todo = [i for i, pid in enumerate(ids) if pid not in done]
        say(
            f"[passrate] {len(rows)} prompts from {', '.join(map(str, files))}: "
            f"{len(rows) - len(todo)} measured before, {len(todo)} to go, k={k}"
        )
        if todo:
            transform = _prompt_transform(
                run.tokenizer,
                rc.rollout.max_prompt_tokens,
                "drop",
                run.image_processor,
                rc.rollout.tool_chat(),
            )
            model, what = load_policy(run, checkpoint)
            # merged weights only: the engine needs no LoRA layers
            sampler = run.open_sampler(trainer_overlaps=False, adapters=False)
            sampler.update_weights(sampler_params(model), 0)
            rcfg = rc.rollout.rollout_config()
            temp = rc.rollout.temperature if temperature is None else temperature
            say(f"[passrate] policy: {what}; T={temp:g}")
            bar = ProgressBar(len(todo), file=console(), enabled=echo)
            done_before = len(rows) - len(todo)

            async def go() -> None:
                async with ToolClient(
                    run.tool_url, timeout_s=rc.tool_server.timeout_s + 30
                ) as client:
                    for start in range(0, len(todo), batch):
                        chunk = todo[start : start + batch]
                        items, kept = [], []
                        for i in chunk:
                            ex = transform(i, rows[i])
                            if ex is not None:
                                items.append(prompt_item(ex, "pr"))
                                kept.append(i)
                        t0 = time.perf_counter()
                        groups = (
                            await rollout_scored(
                                sampler,
                                items,
                                client,
                                run.tokenizer,
                                rcfg,
                                run.reward_pool,
                                n_samples=k,
                                temperature=temp,
                                image_processor=run.image_processor,
                            )
                            if items
                            else []
                        )
                        wall = (time.perf_counter() - t0) / max(1, len(items))
                        rates = []
                        for i, g in zip(kept, groups):
                            set_, group, level = row_labels(rows[i])
                            rates.append(
                                PromptRate(
                                    ids[i],
                                    set_,
                                    group,
                                    level,
                                    k,
                                    sum(float(t.reward_info.get("acc", 0.0)) > 0.5 for t in g),
                                    sum(float(t.reward or 0.0) for t in g) / len(g),
                                    sum(len(t.response_ids) for t in g),
                                    wall,
                                )
                            )
                        append_rows(table, rates)
                        done.update({r.prompt_id: r for r in rates})
                        bar.update(
                            start + len(chunk), {"prompts": done_before + start + len(chunk)}
                        )
                        if rates:
                            toks = sum(r.tokens for r in rates) / len(rates)
                            say(
                                f"[passrate] {start + len(chunk)}/{len(todo)}: {wall:.2f} s "
                                f"and {toks:.0f} sampled tokens per prompt"
                            )

            asyncio.run(go())
            bar.close()
    rates = [done[i] for i in ids if i in done]
    say("[passrate] successes per prompt (histogram), pass@1 and pass@k:\n" + format_summary(rates))
    if write_pool:
        keep = keep_between(rates, *bounds)
        pool = [r for r, pid in zip(rows, ids) if pid in keep]
        if not pool:
            raise ValueError(
                f"no prompt has a pass rate strictly between {bounds[0]:g} and "
                f"{bounds[1]:g}: nothing to write to {write_pool}"
            )
        write_rows(pool, Path(write_pool))
        say(
            f"[passrate] kept {len(pool)} of {len(rates)} prompts with "
            f"{bounds[0]:g} < rate < {bounds[1]:g}: {write_pool}"
        )
    return rates


def main(argv=None) -> int:
    from verltool_jax.runtime.console import library_output_to

    try:
        from verltool_jax.cli import parse_command_line

        cl = parse_command_line(sys.argv[1:] if argv is None else argv, FLAGS)
        config, flags = cl.config, cl.flags
        if not flags["out"]:
            raise ConfigError("--out DIR is required (the table and logs go there)")
        try:
            k, limit, batch = int(flags["k"]), int(flags["limit"]), int(flags["batch"])
        except ValueError:
            raise ConfigError("--k, --limit and --batch take integers") from None
        if k < 1 or batch < 1 or limit < 0:
            raise ConfigError("--k and --batch must be >= 1, --limit >= 0")
        temperature = float(flags["temperature"]) if flags["temperature"] else None
        bounds = parse_bounds(flags["keep_between"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(flags["out"])
    out.mkdir(parents=True, exist_ok=True)
    data = [x for x in flags["data"].split(",") if x]
    with library_output_to(out / "run.log") as term:
        print(
            f"[passrate] library logs (vLLM, XLA, tool server) go to {out / 'run.log'}", file=term
        )
        try:
            measure(
                config,
                flags["checkpoint"],
                out,
                k,
                data=data,
                limit=limit,
                batch=batch,
                temperature=temperature,
                write_pool=flags["write_pool"],
                bounds=bounds,
            )
        except (ValueError, FileNotFoundError) as e:
            print(f"[passrate] error: {e}", file=term, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()
    raise SystemExit(main())
