"""``python -m verltool_jax.eval --config configs/<file>.py[:arg] --checkpoint DIR``

Evaluates a trained policy on the config's held-out prompts (greedy, one trajectory
each, through the real tool server and sampler) and prints accuracy and reward (for the
retrieval-QA task also EM, F1, searches and gold-passage retrieval per data set).
``--checkpoint``: a run directory (its latest orbax checkpoint), an orbax checkpoint
directory, or an HF checkpoint directory. ``--report out.html`` writes the trajectories.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from verltool_jax.cli import ConfigError, parse_command_line


def _load_policy(trainer, checkpoint: Path):
    """Install the checkpoint's params in ``trainer.model``; returns a description."""
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.train.checkpoint import Checkpointer
    if (checkpoint / "config.json").is_file() and any(checkpoint.glob("*.safetensors")):
        trainer.model = load_hf(checkpoint, dtype=trainer.config.model.dtype)
        return f"HF checkpoint {checkpoint}"
    ckpt_dir = checkpoint / "checkpoints" if (checkpoint / "checkpoints").is_dir() else checkpoint
    ck = Checkpointer(ckpt_dir)
    if ck.latest_step() is None:
        raise ValueError(f"--checkpoint {checkpoint}: no orbax checkpoint or HF checkpoint there")
    state, _ = ck.restore(trainer._new_state(trainer.model))
    ck.close()
    trainer.model = state.model()
    return f"orbax checkpoint {ckpt_dir} step {int(state.step)}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cl = parse_command_line(argv, flags={"checkpoint": None, "report": ""})
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from verltool_jax.rewards.compute import RewardPool
    from verltool_jax.tools_client import ToolClient
    from verltool_jax.train import build
    from verltool_jax.train.evaluate import evaluate
    from verltool_jax.train.trainer import Trainer
    checkpoint = Path(cl.flags["checkpoint"])
    if not checkpoint.exists():
        print(f"error: --checkpoint {checkpoint} does not exist", file=sys.stderr)
        return 2
    if (checkpoint / "checkpoints").is_dir() and (checkpoint / "init_model").is_dir():
        # A run directory: use its own tokenizer, task data and model files.
        cl.config.trainer.out_dir = str(checkpoint)
    tr = Trainer(cl.config)
    tr.setup()
    what = _load_policy(tr, checkpoint)
    if not tr.eval_items:
        print("error: the config has no held-out prompts (data.eval_files or a task)",
              file=sys.stderr)
        return 2
    sampler = build.make_sampler(cl.config, tr.model_dir, tr.tokenizer)
    pool = RewardPool.from_config(cl.config.reward)
    try:
        from flax import nnx
        sampler.update_weights(nnx.state(tr.model, nnx.Param), 0)

        async def go():
            with build.tool_server_url(cl.config) as url:
                async with ToolClient(url) as client:
                    return await evaluate(sampler, tr.eval_items, client, tr.tokenizer,
                                          tr.rollout_cfg, pool)
        metrics, trajs = asyncio.run(go())
    finally:
        sampler.close()
        pool.close()
        tr.writer.close()
    print(f"[eval] {what}: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                             for k, v in metrics.items()}))
    task = cl.config.get("task")
    if task is not None and task.get("name") == "search_qa":
        from verltool_jax.reporting.search_metrics import (format_search_metrics,
                                                           search_qa_metrics)
        print("[eval] retrieval QA by data set:\n"
              + format_search_metrics(search_qa_metrics(trajs, tokenizer=tr.tokenizer)))
    if cl.flags.get("report"):
        from verltool_jax.reporting.html_report import write_trajectory_report
        write_trajectory_report(trajs, cl.flags["report"], title=f"eval: {what}",
                                tokenizer=tr.tokenizer)
        print(f"[eval] trajectories: {cl.flags['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
