"""Chaos soak: the main job (``configs/tiny_math.py``) for N RL steps while a seeded
fault injector kills, once each, the tool server, a sandbox, a reward worker, the vLLM
engine core and the trainer itself (SIGKILL; then the same command resumes it), and
fills the disk once (a file takes every free byte of the run's tmpfs; the run stops
with exit 4, the file is removed, the same command resumes).

    python experiments/chaos_soak.py --steps 200 --seed 0 [--out runs/chaos_soak]

Needs root for the tmpfs (``--no-tmpfs``: the out dir is on the disk it is on, and the
disk fault is skipped). The script makes itself a child subreaper, so every process a
run starts stays its descendant: after each trainer kill and at the end, what is still
alive a moment later is listed (the orphan check of ``tests/train/test_no_orphans.py``,
``tests/support/orphans.py``). It prints a table of the faults injected and survived,
the run's data accounting (``summary.json`` ``data``), the orphan checks and the
held-out accuracy after the SFT warm start and at the end; ``--json`` writes it all.
A fault is *survived* when the run went on to a later step (and finished). Faults are
injected once the run's ``metrics.jsonl`` has reached their step.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from support.orphans import PR_SET_CHILD_SUBREAPER, descendants, reap  # noqa: E402

sys.path.insert(0, str(REPO))
from verltool_jax.reporting.metrics_writer import read_metrics  # noqa: E402

KINDS = ("tool_server", "sandbox", "reward_worker", "engine", "trainer", "disk_full")
MARKERS = {  # a process of the kind, by its command line
    "tool_server": "-m tool_server",
    "sandbox": "bwrap",
    "reward_worker": "spawn_main",
    "engine": "EngineCore",
}


@dataclass
class Fault:
    kind: str
    step: int  # injected once the run reached this RL step
    injected_at: int | None = None  # the step it was injected at
    detail: str = ""
    survived: bool = False


@dataclass
class Soak:
    faults: list[Fault]
    restarts: list[dict] = field(default_factory=list)  # each start: exit code, why
    orphan_checks: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    eval_after_sft: float | None = None
    steps_reached: int = 0
    wall_s: float = 0.0


def plan(steps: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """One fault of each kind at distinct steps in ``[2, steps - 2]``, seeded."""
    rng = random.Random(seed)
    if steps - 3 < len(kinds):
        raise ValueError(
            f"--steps {steps}: too few steps for {len(kinds)} faults (>= {len(kinds) + 3})"
        )
    at = sorted(rng.sample(range(2, steps - 1), len(kinds)))
    order = list(kinds)
    rng.shuffle(order)
    return [Fault(k, s) for k, s in zip(order, at)]


def last_step(metrics: Path) -> int:
    step = 0
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line being written
        if "policy/version" in r:
            step = max(step, int(r["step"]))
    return step


def orphans(me: int, grace_s: float = 30.0) -> dict:
    """What is still alive under ``me`` (after the run's process died), waited for up
    to ``grace_s``; what is left is then killed (counted first)."""
    t0 = time.monotonic()
    left = descendants(me)
    while left and time.monotonic() - t0 < grace_s:
        time.sleep(0.2)
        reap()
        left = descendants(me)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {
        "left": {str(k): v for k, v in left.items()},
        "waited_s": round(time.monotonic() - t0, 1),
    }


def fill(path: Path) -> int:
    """Write zeros to ``path`` until the disk is full; the bytes written."""
    block, n = b"\0" * (1 << 20), 0
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(block)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                return n


def kill_one(me: int, trainer: int, kind: str) -> str:
    """SIGKILL one live process of ``kind`` under ``me``; what was killed ('' if none)."""
    for pid, cmd in sorted(descendants(me).items()):
        engine = MARKERS["engine"] in cmd  # its process title; not a reward worker
        if pid != trainer and MARKERS[kind] in cmd and (kind == "engine" or not engine):
            os.kill(pid, signal.SIGKILL)
            return f"pid {pid}: {cmd[:80]}"
    return ""


STOP: list[int] = []  # the signals that asked the soak to stop


def run(args: argparse.Namespace) -> Soak:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: STOP.append(n))
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    me, out = os.getpid(), Path(args.out).resolve()
    kinds = tuple(k for k in args.faults if args.tmpfs_mb or k != "disk_full")
    soak = Soak(plan(args.steps, args.seed, kinds))
    cmd = [
        sys.executable, "-m", "verltool_jax.train", "--config", str(REPO / "configs/tiny_math.py"),
        f"--config.trainer.out_dir={out}", f"--config.trainer.steps={args.steps}",
        f"--config.trainer.ckpt_every={args.ckpt_every}",
        f"--config.trainer.eval_every={args.eval_every}",
        "--config.logging.progress_bar=false", *args.override,
    ]  # fmt: skip
    t0 = time.monotonic()
    filler = out / "filler.bin"
    for attempt in range(args.max_starts):
        # the run's console, beside its out dir: not on the tmpfs the disk fault fills
        with open(out.parent / f"{out.name}.console.log", "a") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        why = "exited"
        while proc.poll() is None:
            time.sleep(0.5)
            if STOP:  # SIGTERM / Ctrl-C of the soak: stop the run cleanly, report so far
                proc.send_signal(signal.SIGTERM)
                why = "soak stopped"
                break
            step = last_step(out / "metrics.jsonl")
            soak.steps_reached = max(soak.steps_reached, step)
            due = [f for f in soak.faults if f.injected_at is None and f.step <= step]
            if not due:
                continue
            f = due[0]
            if f.kind == "trainer":
                proc.send_signal(signal.SIGKILL)
                f.detail, why = f"trainer pid {proc.pid}", "killed (fault)"
            elif f.kind == "disk_full":
                f.detail, why = f"filled the tmpfs with {fill(filler) >> 20} MiB", "disk full"
            else:
                f.detail = kill_one(me, proc.pid, f.kind)
                if not f.detail:
                    continue  # none alive right now (a sandbox between calls): later
            f.injected_at = step
            print(f"[soak] step {step}: {f.kind} fault injected ({f.detail})", flush=True)
        rc = proc.wait()
        soak.restarts.append({"start": attempt + 1, "exit": rc, "why": why})
        soak.orphan_checks.append({"after": f"start {attempt + 1} (exit {rc})"} | orphans(me))
        filler.unlink(missing_ok=True)
        if rc == 0 or STOP:
            break
        print(f"[soak] the run exited with {rc} ({why}); resuming", flush=True)
    soak.wall_s = time.monotonic() - t0
    soak.steps_reached = max(soak.steps_reached, last_step(out / "metrics.jsonl"))
    for f in soak.faults:
        f.survived = f.injected_at is not None and soak.steps_reached > f.injected_at
    if (out / "summary.json").exists():
        soak.summary = json.loads((out / "summary.json").read_text())
    m = out / "metrics.jsonl"
    evals = read_metrics(m) if m.exists() else []
    first = [r["eval/acc"] for r in evals if "eval/acc" in r and r.get("step") == 0]
    soak.eval_after_sft = first[0] if first else None
    return soak


def table(soak: Soak, steps: int) -> str:
    rows = [
        "| Fault | Planned at step | Injected at step | What | Survived |",
        "|---|---|---|---|---|",
    ]
    for f in soak.faults:
        at = "-" if f.injected_at is None else str(f.injected_at)
        rows.append(
            f"| {f.kind} | {f.step} | {at} | {f.detail or '-'} | {'yes' if f.survived else 'NO'} |"
        )
    data = soak.summary.get("data") or {}
    left = sum(len(c["left"]) for c in soak.orphan_checks)
    done = soak.restarts and soak.restarts[-1]["exit"] == 0
    lines = [
        "\n".join(rows),
        "",
        f"- run: {'finished' if done else 'NOT finished'}, {soak.steps_reached}/{steps} steps, "
        f"{len(soak.restarts)} starts (exit codes {[r['exit'] for r in soak.restarts]}), "
        f"{soak.wall_s / 60:.1f} min",
        f"- data accounting: {'exact' if data.get('ok') else 'NOT exact'} "
        + (
            f"({data['drawn']} drawn, {data['trained']} trained once, {data['no_signal']} "
            f"no-signal, {data['in_flight']} in flight; given back {data['given_back']})"
            if data
            else "(no summary)"
        ),
        f"- orphans: {left} processes left after {len(soak.orphan_checks)} exits of the run",
        f"- held-out accuracy: {soak.eval_after_sft} after SFT -> "
        f"{soak.summary.get('eval_after')} at the end",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "runs/chaos_soak"))
    p.add_argument("--tmpfs-mb", type=int, default=384, help="0: no tmpfs, no disk fault")
    p.add_argument("--no-tmpfs", dest="tmpfs_mb", action="store_const", const=0)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--max-starts", type=int, default=6)
    p.add_argument(
        "--faults",
        default=",".join(KINDS),
        help=f"comma-separated fault kinds to inject, once each (default: all of {KINDS})",
    )
    p.add_argument("--json", default=str(REPO / "runs/chaos_soak.json"), help="results")
    p.add_argument("override", nargs="*", help="more --config.key=value flags (after --)")
    args = p.parse_args(argv)
    args.faults = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = sorted(set(args.faults) - set(KINDS))
    if unknown or not args.faults:
        p.error(f"--faults: unknown or no kinds {unknown}; choose from {','.join(KINDS)}")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not os.path.ismount(out):
        raise SystemExit(f"--out {out} is not empty: choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    mounted = False
    if args.tmpfs_mb:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={args.tmpfs_mb}m", "tmpfs", str(out)]
        )
        if r.returncode:
            raise SystemExit("cannot mount a tmpfs (needs root): rerun with --no-tmpfs")
        mounted = True
    try:
        soak = run(args)
        text = table(soak, args.steps)
        print(text, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(asdict(soak) | {"table": text}, indent=2))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(out)])
    ok = soak.restarts[-1]["exit"] == 0 and all(f.survived for f in soak.faults)
    ok = ok and bool((soak.summary.get("data") or {}).get("ok"))
    ok = ok and not any(c["left"] for c in soak.orphan_checks)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
