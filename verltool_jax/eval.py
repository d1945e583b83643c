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


def load_policy(run, checkpoint: Path):
    """The checkpoint's model (built on ``run``'s model structure); (model, description)."""
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.train.checkpoint import Checkpointer
    from verltool_jax.train.optimizer import make_optimizer
    from verltool_jax.train.state import TrainState
    rc = run.config
    if (checkpoint / "config.json").is_file() and any(checkpoint.glob("*.safetensors")):
        return load_hf(checkpoint, dtype=rc.model.dtype), f"HF checkpoint {checkpoint}"
    ckpt_dir = checkpoint / "checkpoints" if (checkpoint / "checkpoints").is_dir() else checkpoint
    ck = Checkpointer(ckpt_dir)
    if ck.latest_step() is None:
        raise ValueError(f"--checkpoint {checkpoint}: no orbax checkpoint or HF checkpoint there")
    template = TrainState.create(run.model, make_optimizer(rc.optimizer_for_run()),
                                 seed=rc.trainer.seed, with_reference=rc.algo.kl_coef > 0)
    state, _ = ck.restore(template)
    ck.close()
    return state.model(), f"orbax checkpoint {ckpt_dir} step {int(state.step)}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cl = parse_command_line(argv, flags={"checkpoint": None, "report": ""})
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from flax import nnx

    from verltool_jax.tools_client import ToolClient
    from verltool_jax.train.build import build_run
    from verltool_jax.train.evaluate import evaluate
    checkpoint = Path(cl.flags["checkpoint"])
    if not checkpoint.exists():
        print(f"error: --checkpoint {checkpoint} does not exist", file=sys.stderr)
        return 2
    out_dir = None
    if (checkpoint / "checkpoints").is_dir() and (checkpoint / "init_model").is_dir():
        out_dir = checkpoint      # a run directory: its own tokenizer, task data, model files
    with build_run(cl.config, out_dir=out_dir, write_metrics=False) as run:
        if not run.eval_items:
            print("error: the config has no held-out prompts (data.eval_files or a task)",
                  file=sys.stderr)
            return 2
        model, what = load_policy(run, checkpoint)
        sampler = run.open_sampler()
        sampler.update_weights(nnx.state(model, nnx.Param), 0)

        async def go():
            async with ToolClient(run.tool_url) as client:
                return await evaluate(sampler, run.eval_items, client, run.tokenizer,
                                      run.config.rollout.rollout_config(), run.reward_pool,
                                      image_processor=run.image_processor)
        metrics, trajs = asyncio.run(go())
        print(f"[eval] {what}: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                                 for k, v in metrics.items()}))
        if run.config.task is not None and run.config.task.name == "search_qa":
            from verltool_jax.reporting.search_metrics import (format_search_metrics,
                                                               search_qa_metrics)
            print("[eval] retrieval QA by data set:\n"
                  + format_search_metrics(search_qa_metrics(trajs, tokenizer=run.tokenizer)))
        if cl.flags.get("report"):
            from verltool_jax.reporting.html_report import write_trajectory_report
            write_trajectory_report(trajs, cl.flags["report"], title=f"eval: {what}",
                                    tokenizer=run.tokenizer)
            print(f"[eval] trajectories: {cl.flags['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
