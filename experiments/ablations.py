"""Named ablations, each a sweep (``experiments/sweep.py``) over one config family.

    python experiments/ablations.py staleness                       # the math family on SmolLM2
    python experiments/ablations.py staleness --config configs/tiny_math.py \\
        --config.trainer.steps=8                                    # minutes on a CPU
    python experiments/ablations.py all --dry-run                   # every command
    python experiments/ablations.py loss --report-only              # table + plot again
    python experiments/ablations.py staleness --arms staleness0,staleness4   # a subset

Ablations (the first arm of each is its baseline; every arm runs every seed):

* ``staleness``: ``rollout.max_staleness`` 0 (each group sampled by the current policy)
  / 1 / 2 / 4 with the asynchronous rollout -- accuracy, throughput, dropped groups,
  mean staleness;
* ``loss``: policy loss and advantages -- GRPO (symmetric PPO clip 0.2), Dr.GRPO
  (``drgrpo`` advantages, ``seq-mean-token-sum-norm``), RLOO, DAPO (clip-higher 0.28 +
  dynamic sampling + overlong penalty over the last quarter of the response budget),
  GSPO (sequence ratio, clip 3e-4 / 4e-4, ``seq-mean-token-mean``, as verl's GSPO recipe),
  REINFORCE++ and REINFORCE++-baseline (batch-whitened advantages) and CISPO (clipped
  IS weight, no lower bound and eps_high 0.2, as verl's CISPO recipe), PPO with a
  critic (``ppo_gae``: GAE advantages, the clipped value loss);
* ``offpolicy``: behaviour logprobs from the sampler, or recomputed by the trainer before
  the update with truncated IS against the sampler (cap 2) or without (with the
  sampler's logprobs the IS weight is 1 on every token, so that arm needs no IS pair);
  then, all recomputed, the IS weight of the sequence (product, cap 2), of its
  geometric mean (cap 2), and IcePop's token mask (ratio outside [0.5, 5]: weight 0);
* ``masking``: ``rollout.mask_observations`` on / off (off trains on the tool's output
  tokens, the mistake the framework prevents by default); both arms recompute behaviour
  logprobs and turn truncated IS off, since the sampler has no logprobs for tool tokens;
* ``turns``: the tool-call budget ``rollout.max_turns`` 1 / 2 / 4;
* ``kl``: no KL term / k1 / k3 (``algo.kl_coef`` 0.01 against the initial policy);
* ``credit``: per-turn credit, ``algo.turn_discount`` 1 (every turn gets the whole
  advantage) / 0.8 / 0.5, on a family whose answers take several tool calls: search a
  code, then multiply it in python (the tiny model learns it in minutes):
  ``python experiments/ablations.py credit --config configs/tiny_math.py:lookup``.

Any ``--config.a.b=v`` given on the command line is shared by every arm (before the
arm's own overrides, so an arm's setting wins). Runs go to
``runs/sweeps/<ablation>/<arm>/seed<k>``; a finished run is not run again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweep import Arm, Sweep, add_common_args, main_for, parse_seeds

DEFAULT_CONFIG = "configs/vt_math.py:smol"


def _o(**kv) -> tuple[str, ...]:
    """``_o(algo__kl_coef=0.01)`` -> ``("--config.algo.kl_coef=0.01",)``."""
    return tuple(f"--config.{k.replace('__', '.')}={v}" for k, v in kv.items())


def staleness_arms(cfg) -> list[Arm]:
    return [
        Arm(
            f"staleness{s}",
            _o(rollout__mode="async", rollout__max_staleness=s),
            note="on-policy: each group sampled by the current policy" if s == 0 else "",
        )
        for s in (0, 1, 2, 4)
    ]


def loss_arms(cfg) -> list[Arm]:
    plain = dict(
        algo__dynamic_sampling="false",
        algo__overlong_buffer_len=0,
        algo__loss_agg_mode="token-mean",
        algo__clip_ratio_low=0.2,
        algo__clip_ratio_high=0.2,
    )
    overlong = max(1, int(cfg.rollout.max_response_tokens) // 4)
    return [
        Arm("grpo", _o(algo__adv_estimator="grpo", algo__policy_loss="ppo", **plain)),
        Arm(
            "drgrpo",
            _o(
                algo__adv_estimator="drgrpo",
                algo__policy_loss="ppo",
                **dict(plain, algo__loss_agg_mode="seq-mean-token-sum-norm"),
            ),
        ),
        Arm("rloo", _o(algo__adv_estimator="rloo", algo__policy_loss="ppo", **plain)),
        Arm(
            "dapo",
            _o(
                algo__adv_estimator="grpo",
                algo__policy_loss="ppo",
                **dict(
                    plain,
                    algo__clip_ratio_high=0.28,
                    algo__dynamic_sampling="true",
                    algo__overlong_buffer_len=overlong,
                ),
            ),
            note=f"overlong buffer {overlong} tokens",
        ),
        Arm(
            "gspo",
            _o(
                algo__adv_estimator="grpo",
                algo__policy_loss="gspo",
                **dict(
                    plain,
                    algo__clip_ratio_low=3e-4,
                    algo__clip_ratio_high=4e-4,
                    algo__loss_agg_mode="seq-mean-token-mean",
                ),
            ),
        ),
        Arm(
            "reinforce_pp",
            _o(algo__adv_estimator="reinforce_plus_plus", algo__policy_loss="ppo", **plain),
            note="no groups: rewards whitened over the batch's tokens",
        ),
        Arm(
            "reinforce_pp_baseline",
            _o(
                algo__adv_estimator="reinforce_plus_plus_baseline",
                algo__policy_loss="ppo",
                **plain,
            ),
            note="group mean subtracted, then whitened over the batch's tokens",
        ),
        Arm(
            "cispo",
            _o(
                algo__adv_estimator="grpo",
                algo__policy_loss="cispo",
                **dict(plain, algo__clip_ratio_low=10.0, algo__clip_ratio_high=0.2),
            ),
            note="IS weight clipped at 1.2, no lower bound",
        ),
        Arm(
            "ppo_gae",
            _o(algo__adv_estimator="gae", algo__policy_loss="ppo", **plain),
            note="PPO with a critic: GAE (gamma = lambda = 1), clipped value loss",
        ),
    ]


def credit_arms(cfg) -> list[Arm]:
    return [
        Arm(
            "flat" if g == 1.0 else f"turn{g}",
            _o(algo__turn_discount=g),
            note="every turn gets the sequence advantage" if g == 1.0 else "",
        )
        for g in (1.0, 0.8, 0.5)
    ]


def offpolicy_arms(cfg) -> list[Arm]:
    """Three arms, not the 2 x 2 grid: with the sampler's logprobs as the behaviour policy
    the truncated IS weight is ``exp(old - sampler) = 1`` on every token (``old`` *is* the
    sampler's), so "sampler, IS on" and "sampler, IS off" are the same computation. IS
    corrects only recomputed behaviour logprobs, where it weighs each token by how much
    more likely the trainer finds it than the sampler did."""
    return [
        Arm(
            "sampler",
            _o(algo__old_logprobs="sampler", algo__tis_cap=0.0),
            note="the sampler's logprobs are the behaviour policy (no IS needed)",
        ),
        Arm(
            "recompute_tis",
            _o(algo__old_logprobs="recompute", algo__tis_cap=2.0),
            note="the trainer's logprobs before the update, IS against the sampler capped at 2",
        ),
        Arm(
            "recompute",
            _o(algo__old_logprobs="recompute", algo__tis_cap=0.0),
            note="the trainer's logprobs before the update, no correction",
        ),
        # sequence-level corrections (algos.offpolicy); compare with recompute_tis:
        # --arms recompute_tis,seq_tis,icepop,geo_tis
        Arm(
            "seq_tis",
            _o(algo__old_logprobs="recompute", algo__tis_cap=2.0, algo__tis_level="sequence"),
            note="IS weight the sequence's ratio product, capped at 2",
        ),
        Arm(
            "icepop",
            _o(
                algo__old_logprobs="recompute",
                algo__tis_cap=5.0,
                algo__is_mask="token",
                algo__is_mask_low=0.5,
                algo__is_mask_high=5.0,
            ),
            note="masked IS per token (IcePop): weight the ratio inside [0.5, 5], else 0",
        ),
        Arm(
            "geo_tis",
            _o(algo__old_logprobs="recompute", algo__tis_cap=2.0, algo__tis_level="geometric"),
            note="IS weight the geometric mean of the sequence's token ratios, capped at 2",
        ),
    ]


def masking_arms(cfg) -> list[Arm]:
    same = dict(algo__old_logprobs="recompute", algo__tis_cap=0.0)
    return [
        Arm("masked", _o(rollout__mask_observations="true", **same)),
        Arm(
            "unmasked",
            _o(rollout__mask_observations="false", **same),
            note="trains on tool-output tokens",
        ),
    ]


def turns_arms(cfg) -> list[Arm]:
    return [Arm(f"turns{t}", _o(rollout__max_turns=t)) for t in (1, 2, 4)]


def kl_arms(cfg) -> list[Arm]:
    return [
        Arm("nokl", _o(algo__kl_coef=0.0)),
        Arm("k1", _o(algo__kl_coef=0.01, algo__kl_estimator="k1")),
        Arm("k3", _o(algo__kl_coef=0.01, algo__kl_estimator="k3")),
    ]


# name -> (the question it answers, arms of a loaded config)
ABLATIONS: dict[str, tuple[str, Callable]] = {
    "staleness": (
        "How much policy lag (max_staleness) can async rollout take before "
        "accuracy suffers, and what throughput does it buy?",
        staleness_arms,
    ),
    "loss": (
        "Which policy loss / advantage estimator learns best here: GRPO, Dr.GRPO, "
        "RLOO, DAPO, GSPO, REINFORCE++ (with or without the group baseline) or CISPO?",
        loss_arms,
    ),
    "offpolicy": (
        "Which behaviour logprobs should the PPO ratio use: the sampler's, or the "
        "trainer's recomputed ones with or without truncated IS against the "
        "sampler, and at which level (token, sequence, geometric mean, IcePop mask)?",
        offpolicy_arms,
    ),
    "masking": ("What does training on tool-output tokens (no observation mask) do?", masking_arms),
    "turns": ("How does the tool-call budget (max_turns 1/2/4) change accuracy?", turns_arms),
    "kl": ("Does a KL term (k1 / k3) against the initial policy help or hurt?", kl_arms),
    "credit": (
        "Does discounting the advantage of earlier turns (algo.turn_discount) help a "
        "multi-turn agent?",
        credit_arms,
    ),
}


def build_sweep(
    name: str,
    config: str,
    seeds: Sequence[int],
    shared: Sequence[str],
    root: str = "runs/sweeps",
    only: Sequence[str] | None = None,
) -> Sweep:
    """The :class:`Sweep` of ablation ``name`` over ``config`` (loaded with the shared
    overrides, so arms derived from it, e.g. DAPO's overlong buffer, see the final sizes).
    ``only``: run just these arms (in the ablation's order; the first kept is the baseline)."""
    from verltool_jax.cli.command_line import parse_command_line

    if name not in ABLATIONS:
        raise ValueError(f"unknown ablation {name!r}; choose from {sorted(ABLATIONS)} or 'all'")
    question, arms_for = ABLATIONS[name]
    cfg = parse_command_line(["--config", config, *shared]).config
    arms = arms_for(cfg)
    if only:
        unknown = sorted(set(only) - {a.name for a in arms})
        if unknown:
            raise ValueError(
                f"ablation {name!r} has no arm(s) {unknown}; its arms: {[a.name for a in arms]}"
            )
        arms = [a for a in arms if a.name in set(only)]
    return Sweep(name, config, tuple(arms), tuple(seeds), tuple(shared), root, question)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ablation", choices=sorted(ABLATIONS) + ["all"])
    add_common_args(ap, DEFAULT_CONFIG)
    ap.add_argument(
        "--arms",
        default="",
        help="comma-separated arm names to run (default: all of the ablation's)",
    )
    args, shared = ap.parse_known_args(argv)
    bad = [s for s in shared if not s.startswith("--config.")]
    if bad:
        ap.error(f"unknown arguments {bad}; shared overrides look like --config.a.b=v")
    names = sorted(ABLATIONS) if args.ablation == "all" else [args.ablation]
    rc = 0
    for name in names:
        only = [a for a in args.arms.split(",") if a.strip()] if args.arms else None
        sweep = build_sweep(name, args.config, parse_seeds(args.seeds), shared, args.root, only)
        rc |= main_for(sweep, args.dry_run, args.report_only)
    return rc


if __name__ == "__main__":
    sys.exit(main())
