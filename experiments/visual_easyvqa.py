"""easy-VQA with a tiny Qwen2.5-VL policy and the live image tool: SFT warm start on zoom-then-
answer demonstrations, then GRPO with the Pixel-Reasoner reward; held-out accuracy and
image-tool calls per question before and after, and an HTML report of every image the policy
saw (prompt images and the tool's crops).

    PYTHONPATH=. python experiments/visual_easyvqa.py --out runs/visual_easyvqa

The pieces are the library's: the tiny model (``models.tiny.build_tiny_vl_hf``), prompts with
images (``data.images``), the rollout with image observations (``rollout.agent_loop``), the
JAX sampler's vision prefill, the train batch with per-row images, the RL train step and the
SFT loss. Demonstrations are rolled out by a scripted teacher through the same rollout and
tool server, so their ids and images are exactly what the policy later sees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import numpy as np

MAX_LEN = 384  # prompt + response tokens (images included)


class Teacher:
    """Writes the task's demonstration turns (``tasks.easy_vqa.demonstration_actions``) for
    the prompt it is asked about; logprobs 0 (never used: SFT trains on the ids)."""

    def __init__(self, tokenizer, actions_by_prompt: dict):
        self.tok, self.actions = tokenizer, actions_by_prompt
        self.version = 0

    async def generate(self, ids, params, request_id=None, images=None):
        from verltool_jax.samplers.base import Completion

        group = request_id.rsplit("-", 1)[0]
        k = len(images or []) - 1  # one more image per tool call so far
        text = self.actions[group][min(k, len(self.actions[group]) - 1)]
        toks = self.tok.encode(text, add_special_tokens=False)
        if text.endswith("</tool_call>"):
            return Completion(toks, [0.0] * len(toks), "stop", "</tool_call>")
        return Completion(toks + [self.tok.eos_token_id], [0.0] * (len(toks) + 1), "stop")


def prompt_items(rows, tok, proc, prefix):
    from verltool_jax.data.images import multimodal_prompt
    from verltool_jax.rollout.agent_loop import PromptItem

    out = []
    for i, r in enumerate(rows):
        ids, imgs = multimodal_prompt(tok, r["prompt"], r["images"], proc, f"{prefix} row {i}")
        out.append(PromptItem(ids, r, f"{prefix}{i}", imgs))
    return out


def evaluate(items, sampler, url, tok, cfg, proc):
    """Greedy accuracy and image-tool calls per question over ``items``."""
    import dataclasses

    from tool_server.client import ToolClient
    from verltool_jax.rewards.visual_reward import visual_answer_reward
    from verltool_jax.rollout.agent_loop import run_rollout
    from verltool_jax.rollout.response_text import model_text

    gcfg = dataclasses.replace(cfg, temperature=0.0)

    async def go():
        async with ToolClient(url) as c:
            return await run_rollout(items, 1, sampler, c, tok, gcfg, image_processor=proc)

    trajs = [g[0] for g in asyncio.run(go())]
    correct = [
        visual_answer_reward(
            model_text(t.response_ids, t.loss_mask, tok), t.data["reward_model"]["ground_truth"], {}
        ).correct
        for t in trajs
    ]
    calls = [t.tool_calls - t.invalid_tool_calls for t in trajs]
    from verltool_jax.tasks.easy_vqa import answer_kind

    golds = [str(t.data["reward_model"]["ground_truth"]) for t in trajs]
    kinds = [answer_kind(g) for g in golds]
    by_kind = {
        k: float(np.mean([c for c, kk in zip(correct, kinds) if kk == k]))
        for k in sorted(set(kinds))
    }
    return {
        "accuracy": float(np.mean(correct)),
        "tool_calls_per_question": float(np.mean(calls)),
        "tool_use_rate": float(np.mean([c > 0 for c in calls])),
        "accuracy_by_kind": by_kind,
        # a policy blind to the image: the most frequent gold answer, always
        "majority_answer_accuracy": max(golds.count(g) for g in set(golds)) / len(golds),
    }, trajs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/visual_easyvqa")
    ap.add_argument("--num-train", type=int, default=1500)
    ap.add_argument("--num-eval", type=int, default=100)
    ap.add_argument("--num-demos", type=int, default=600)
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--sft-batch", type=int, default=16)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--rl-steps", type=int, default=10)
    ap.add_argument("--rl-prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rl-lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64, help="language model width (4 heads)")
    ap.add_argument("--vision-hidden", type=int, default=32)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument(
        "--summarize",
        nargs="+",
        metavar="RUN_DIR",
        help="do not train: write a table and a plot of these finished runs "
        "(seeds of one setting are averaged) into --out",
    )
    args = ap.parse_args()
    if args.summarize:
        summarize([Path(d) for d in args.summarize], Path(args.out))
        return

    import jax
    from transformers import AutoTokenizer

    from tool_server.client import ToolClient
    from tool_server.launcher import run_server
    from verltool_jax.algos.advantages import compute_advantages
    from verltool_jax.algos.config import AlgoConfig
    from verltool_jax.algos.optimizer import OptimConfig, make_optimizer
    from verltool_jax.models import load_hf
    from verltool_jax.models.image_inputs import ImageProcessor
    from verltool_jax.models.tiny import build_tiny_vl_hf, mrope_sections
    from verltool_jax.reporting.html_report import write_trajectory_report
    from verltool_jax.rewards.visual_reward import add_curiosity_terms, visual_answer_reward
    from verltool_jax.rollout.agent_loop import run_rollout
    from verltool_jax.rollout.config import RolloutConfig
    from verltool_jax.rollout.response_text import model_text
    from verltool_jax.samplers.jax_sampler import JAXSampler
    from verltool_jax.tasks.easy_vqa import (
        SYSTEM_PROMPT,
        all_answers,
        answer_action,
        demonstration_actions,
        generate,
        zoom_action,
    )
    from verltool_jax.train.batch import batch_from_trajectories
    from verltool_jax.train.sft import make_sft_step, sft_trajectory_batch
    from verltool_jax.train.state import TrainState
    from verltool_jax.train.step import make_train_step

    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, evals, demos = generate(args.num_train, args.num_eval, args.num_demos, args.seed)
    corpus = (
        [r["prompt"][1]["content"].replace("<image>", "") for r in train] * 3
        + [SYSTEM_PROMPT, zoom_action()] * 200
        + [answer_action(a) for a in all_answers()] * 50
    )
    model_dir = build_tiny_vl_hf(
        out / "init_model",
        vocab_size=512,
        corpus=corpus,
        seed=args.seed,
        hidden_size=args.hidden,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=2 * args.hidden,
        mrope_section=mrope_sections(args.hidden // 4),
        vision_depth=args.vision_depth,
        vision_hidden=args.vision_hidden,
        patch_size=8,
        window_size=32,
    )
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = load_hf(model_dir)
    proc = ImageProcessor(model.config, max_pixels=128 * 128, min_pixels=16 * 16)
    cfg = RolloutConfig(
        max_turns=3,
        max_response_tokens=240,
        max_action_tokens=96,
        seed=args.seed,
        max_concurrency=64,
    )
    eval_items = prompt_items(evals, tok, proc, "eval")
    log = {"args": vars(args)}

    def say(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    with run_server(tools=["image"], timeout=10) as url:

        def rollout(items, n, policy):
            async def go():
                async with ToolClient(url) as c:
                    return await run_rollout(items, n, policy, c, tok, cfg, image_processor=proc)

            return asyncio.run(go())

        sampler = JAXSampler(model, tok, max_model_len=MAX_LEN, max_batch_size=64)
        log["before"], _ = evaluate(eval_items, sampler, url, tok, cfg, proc)
        say(f"before: {log['before']}")

        # --- SFT on demonstrations rolled out by the teacher -------------------------------
        demo_items = prompt_items(demos, tok, proc, "demo")
        teacher = Teacher(tok, {it.group_id: demonstration_actions(it.data) for it in demo_items})
        demo_trajs = [g[0] for g in rollout(demo_items, 1, teacher)]
        bad = [t.trajectory_id for t in demo_trajs if t.error or t.tool_calls != 1]
        if bad:
            t = next(t for t in demo_trajs if t.trajectory_id == bad[0])
            raise RuntimeError(
                f"demonstrations failed: {bad[:5]}: {t.error} {t.termination} "
                f"{t.actions} {t.observations}"
            )
        say(
            f"{len(demo_trajs)} demonstrations, {sum(len(t.images) for t in demo_trajs)} images, "
            f"mean length {np.mean([len(t.prompt_ids) + len(t.response_ids) for t in demo_trajs]):.0f}"
        )
        opt = make_optimizer(
            OptimConfig(
                lr=args.sft_lr, warmup_steps=20, total_steps=args.sft_steps, max_grad_norm=1.0
            )
        )
        state = TrainState.create(model, opt, seed=args.seed)
        sft_step = make_sft_step(state.graphdef, opt)
        rng = random.Random(args.seed)
        for i in range(args.sft_steps):
            b = sft_trajectory_batch(
                rng.sample(demo_trajs, args.sft_batch), tok.pad_token_id, MAX_LEN, 64
            )
            state, m = sft_step(state, b)
            if (i + 1) % max(1, args.sft_steps // 10) == 0:
                say(f"sft {i + 1}/{args.sft_steps} loss {float(m['sft_loss']):.3f}")
        sampler.update_weights(state.params, 1)
        log["after_sft"], _ = evaluate(eval_items, sampler, url, tok, cfg, proc)
        say(f"after SFT: {log['after_sft']}")

        # --- GRPO with the image tool live ----------------------------------------------------
        ropt = make_optimizer(OptimConfig(lr=args.rl_lr, max_grad_norm=1.0))
        state = TrainState.create(state.model(), ropt, seed=args.seed)
        algo = AlgoConfig(
            mini_batch_size=args.rl_prompts * args.n,
            micro_batch_size=args.rl_prompts * args.n // 2,
            policy_loss="ppo",
            loss_agg_mode="token-mean",
        )
        step = make_train_step(algo, state.graphdef, ropt)
        train_items = prompt_items(train, tok, proc, "train")
        rl_log = []
        for s in range(args.rl_steps):
            batch_items = rng.sample(train_items, args.rl_prompts)
            groups = rollout(batch_items, args.n, sampler)
            trajs = [t for g in groups for t in g]
            for t in trajs:
                c = visual_answer_reward(
                    model_text(t.response_ids, t.loss_mask, tok),
                    t.data["reward_model"]["ground_truth"],
                    {},
                ).correct
                t.reward, t.reward_info = float(c), {"correct": c}
            add_curiosity_terms(groups)  # the Pixel-Reasoner group terms
            adv = compute_advantages("grpo", [t.reward for t in trajs], [t.group_id for t in trajs])
            b = batch_from_trajectories(trajs, adv, tok.pad_token_id, MAX_LEN, 64)
            state, m = step(state, b)
            sampler.update_weights(state.params, s + 2)
            acc = float(np.mean([t.reward_info["correct"] for t in trajs]))
            use = float(np.mean([t.tool_calls > 0 for t in trajs]))
            rl_log.append(
                {
                    "step": s + 1,
                    "train_accuracy": acc,
                    "tool_use_rate": use,
                    "train_reward": float(np.mean([t.reward for t in trajs])),
                    "loss": float(m["loss"]),
                }
            )
            say(
                f"rl {s + 1}/{args.rl_steps} train-acc {acc:.3f} tool-use {use:.2f} "
                f"loss {float(m['loss']):.4f}"
            )
        log["rl"] = rl_log
        log["after_rl"], final = evaluate(eval_items, sampler, url, tok, cfg, proc)
        say(f"after RL: {log['after_rl']}")
        for t in final:
            t.reward = float(
                visual_answer_reward(
                    model_text(t.response_ids, t.loss_mask, tok),
                    t.data["reward_model"]["ground_truth"],
                    {},
                ).score
            )
        write_trajectory_report(final[:30], out / "report.html", tokenizer=tok)
        sampler.close()
    log["wall_s"] = time.perf_counter() - t_start
    log["devices"] = str(jax.devices())
    (out / "results.json").write_text(json.dumps(log, indent=2))
    print(json.dumps({k: log[k] for k in ("before", "after_sft", "after_rl", "wall_s")}, indent=2))


def setting_name(a: dict) -> str:
    """An arm's name from a run's arguments (everything that is not the seed or paths;
    runs from before the size options had the default sizes)."""
    return (
        f"width {a.get('hidden', 64)} / vision {a.get('vision_hidden', 32)}: SFT "
        f"{a['sft_steps']} steps on {a['num_demos']} demos, RL {a['rl_steps']} steps x "
        f"{a['rl_prompts']} prompts x n={a['n']}, lr {a['rl_lr']:g}"
    )


def summarize(run_dirs: list[Path], out: Path) -> None:
    """``results.md`` (per setting: held-out accuracy and image-tool calls per question
    before training, after SFT and after RL, mean and seed spread; train accuracy over the
    first and the last 10 RL steps) and ``results.png`` (train accuracy per RL step, 5-step
    trailing mean: each seed faint, the seeds' mean bold; held-out accuracy at the three
    stages) of finished runs' ``results.json``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from verltool_jax.reporting.plots import seed_mean_curve, trailing_mean

    arms: dict[str, list[dict]] = {}
    for d in run_dirs:
        r = json.loads((d / "results.json").read_text())
        arms.setdefault(setting_name(r["args"]), []).append(dict(r, dir=str(d)))

    def cell(vals, digits=3):
        m = float(np.mean(vals))
        return f"{m:.{digits}f}" + (f" ± {float(np.std(vals)):.{digits}f}" if len(vals) > 1 else "")

    lines = [
        "| setting | seeds | stage | held-out accuracy | tool calls / question | tool-use rate |",
        "|---|---|---|---|---|---|",
    ]
    for arm, runs in arms.items():
        seeds = ", ".join(str(r["args"]["seed"]) for r in runs)
        for stage, key in (
            ("before", "before"),
            ("after SFT", "after_sft"),
            ("after RL", "after_rl"),
        ):
            lines.append(
                f"| {arm} | {seeds} | {stage} | "
                f"{cell([r[key]['accuracy'] for r in runs])} | "
                f"{cell([r[key]['tool_calls_per_question'] for r in runs])} | "
                f"{cell([r[key]['tool_use_rate'] for r in runs])} |"
            )
    lines += [
        "",
        "| setting | train accuracy, first 10 RL steps | last 10 RL steps | "
        "wall time per run (s) |",
        "|---|---|---|---|",
    ]
    for arm, runs in arms.items():
        first = [float(np.mean([x["train_accuracy"] for x in r["rl"][:10]])) for r in runs]
        last = [float(np.mean([x["train_accuracy"] for x in r["rl"][-10:]])) for r in runs]
        lines.append(
            f"| {arm} | {cell(first)} | {cell(last)} | {cell([r['wall_s'] for r in runs], 0)} |"
        )
    kinds = sorted(
        {k for rs in arms.values() for r in rs for k in r["after_rl"].get("accuracy_by_kind", {})}
    )
    if kinds:
        lines += [
            "",
            "| setting | stage | "
            + " | ".join(kinds)
            + " | a blind policy (the most frequent answer, always) |",
            "|---|---|" + "---|" * (len(kinds) + 1),
        ]
        for arm, runs in arms.items():
            runs = [r for r in runs if "accuracy_by_kind" in r["after_rl"]]
            for stage, key in (("after SFT", "after_sft"), ("after RL", "after_rl")):
                if runs:
                    lines.append(
                        f"| {arm} | {stage} | "
                        + " | ".join(
                            cell([r[key]["accuracy_by_kind"].get(k, 0.0) for r in runs])
                            for k in kinds
                        )
                        + " | "
                        + cell([r[key]["majority_answer_accuracy"] for r in runs])
                        + " |"
                    )
    lines += ["", "Runs: " + ", ".join(f"`{r['dir']}`" for rs in arms.values() for r in rs)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    stages = ("before", "after_sft", "after_rl")
    for i, (arm, runs) in enumerate(arms.items()):
        c = colours[i % len(colours)]
        curves = [
            (
                [x["step"] for x in r["rl"]],
                [x["step"] for x in r["rl"]],
                [x["train_accuracy"] for x in r["rl"]],
            )
            for r in runs
        ]
        for st, _, ys in curves:
            ax.plot(st, trailing_mean(ys, 5), color=c, alpha=0.3, linewidth=0.8)
        st, _, ys = seed_mean_curve(curves)
        ax.plot(st, trailing_mean(ys, 5), color=c, linewidth=2, label=arm)
        for r in runs:
            bx.plot(
                range(3),
                [r[k]["accuracy"] for k in stages],
                color=c,
                alpha=0.3,
                marker="o",
                markersize=3,
            )
        bx.plot(
            range(3),
            [float(np.mean([r[k]["accuracy"] for r in runs])) for k in stages],
            color=c,
            linewidth=2,
            marker="o",
            label=arm,
        )
    blind = [
        r["after_rl"]["majority_answer_accuracy"]
        for rs in arms.values()
        for r in rs
        if "majority_answer_accuracy" in r["after_rl"]
    ]
    if blind:
        bx.axhline(
            float(np.mean(blind)),
            color="gray",
            linestyle="--",
            linewidth=1,
            label="a blind policy (the most frequent answer)",
        )
    bx.legend(fontsize=7)
    ax.set_xlabel("RL step")
    ax.set_ylabel("train accuracy (5-step trailing mean)")
    bx.set_xticks(range(3), ["before", "after SFT", "after RL"])
    bx.set_ylabel("held-out accuracy (greedy)")
    for a in (ax, bx):
        a.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("easy-VQA, tiny Qwen2.5-VL with the image tool (seeds faint, mean bold)")
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=100)
    plt.close(fig)
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
