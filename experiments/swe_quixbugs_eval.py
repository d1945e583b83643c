"""The SWE pipeline on the QuixBugs tasks with real sandboxes and scripted policies.

    python experiments/swe_quixbugs_eval.py --quixbugs-dir DIR [--programs gcd,sieve]
        [--policies oracle,noop] [--out outputs/swe_quixbugs] [--concurrency 4]

Prepares the tasks (validated: each one's hidden tests fail before the fix and pass with
it), starts a tool server with ``bash``, ``file_editor`` and ``run_tests`` (sandboxed
workspaces), and runs every task with each policy:

* ``oracle``: applies the known fix through ``file_editor`` (view, str_replace), runs
  the tests, answers -> proves the pipeline can resolve every task (expect 40/40);
* ``noop``: runs the tests and answers without editing (expect 0/40).

Each episode ends with the hidden test run and the SWE reward. Printed per task: reward,
tool calls, wall time and sandbox time (time inside tool calls); then per policy the
eval metrics (:func:`verltool_jax.reporting.eval_metrics.swe_eval_metrics`) and totals.
The same table and metrics come from ``python -m verltool_jax.eval`` for a model
(docs/tasks/swe.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tool_server.client import ToolClient  # noqa: E402
from tool_server.launcher import run_server  # noqa: E402
from verltool_jax.reporting.eval_metrics import format_metrics, format_swe_tasks, swe_eval_metrics  # noqa: E402
from verltool_jax.tasks import swe  # noqa: E402
from verltool_jax.tasks.swe.scripted import POLICIES, run_episode, unique_id  # noqa: E402


async def run_policy(url: str, tasks, policy: str, concurrency: int, timeout_s: float):
    sem = asyncio.Semaphore(concurrency)
    actions = POLICIES[policy]

    async def one(client, task):
        async with sem:
            return await run_episode(client, task, actions(task), unique_id(task, policy))

    async with ToolClient(url, timeout_s=timeout_s) as client:
        return await asyncio.gather(*(one(client, t) for t in tasks))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quixbugs-dir", required=True)
    ap.add_argument("--out", default="", help="task folder (default: a temporary one)")
    ap.add_argument("--programs", default="", help="comma-separated (default: all 40)")
    ap.add_argument("--policies", default="oracle,noop")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument(
        "--test-timeout",
        type=float,
        default=60.0,
        help="tool server --timeout (bounds one test run)",
    )
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"unknown policy {bad}; choose from {sorted(POLICIES)}")
    tmp = None
    out = args.out
    if not out:
        tmp = tempfile.TemporaryDirectory(prefix="swe-quixbugs-")
        out = tmp.name
    t0 = time.perf_counter()
    progs = [p for p in args.programs.split(",") if p] or None
    tasks, rejected = swe.quixbugs_tasks(args.quixbugs_dir, out, progs)
    prep_s = time.perf_counter() - t0
    print(f"prepared {len(tasks)} tasks in {prep_s:.1f}s; rejected {len(rejected)}")
    for r in rejected:
        print(f"  rejected: {r}")
    results = {}
    with run_server(
        tools=["bash", "file_editor", "run_tests"],
        timeout=args.test_timeout,
        max_obs_length=4000,
        workdir=str(Path(out) / "workdir"),
    ) as url:
        for policy in policies:
            t1 = time.perf_counter()
            eps = asyncio.run(
                run_policy(url, tasks, policy, args.concurrency, args.test_timeout + 30)
            )
            wall = time.perf_counter() - t1
            print(
                f"\n== policy {policy}: {len(eps)} tasks in {wall:.1f}s "
                f"(concurrency {args.concurrency})"
            )
            rewards = [e.reward for e in eps]
            print(format_swe_tasks(eps, rewards))
            m = swe_eval_metrics(eps, rewards, wall_s_total=wall)
            resolved = sum(e.reward > 0 for e in eps)
            m.update({"resolved": float(resolved), "tasks": float(len(eps))})
            print(f"resolved {resolved}/{len(eps)}")
            print(format_metrics(m))
            results[policy] = {
                "metrics": m,
                "episodes": [
                    {
                        "task_id": e.task_id,
                        "reward": e.reward,
                        "tool_calls": e.tool_calls,
                        "wall_s": e.wall_s,
                        "sandbox_s": e.sandbox_s,
                        "hidden": e.hidden,
                        "termination": e.termination,
                    }
                    for e in eps
                ],
            }
    if args.json:
        Path(args.json).write_text(
            json.dumps({"prepare_s": prep_s, "rejected": rejected, "results": results}, indent=1)
        )
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
