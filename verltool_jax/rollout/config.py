"""Rollout settings (filled from the experiment's ml_collections config)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from verltool_jax.samplers.base import SamplingParams
from verltool_jax.schema import Checked, at_least, in_unit_interval, spec
from verltool_jax.truncation import TOP_K_OFF, TOP_P_OFF

OBS_TEMPLATE_CHATML = "<|im_end|>\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
OBS_TEMPLATE_RESULT = "<result>\n{obs}\n</result>"


def _stop_strings_ok(v: Any) -> bool:
    return not isinstance(v, str) and all(isinstance(s, str) and s for s in v)


@dataclass(frozen=True)
class RolloutConfig(Checked):
    """How one trajectory is rolled out.

    * ``max_turns``: how many tool calls a trajectory may make. After the last allowed
      observation the model gets one more turn; if that turn again ends on an action,
      the trajectory ends with ``termination="max_turns"`` (the action is not run).
    * ``max_response_tokens``: budget of the whole response (model + observation tokens).
    * ``max_action_tokens``: cap of one model turn (None: the remaining budget).
    * ``max_obs_tokens``: an observation longer than this (in tokens, before the template)
      is truncated, keeping the ``obs_truncate_side`` ("head" or "tail") and inserting
      ``obs_truncate_marker``.
    * ``action_stop_strings``: a turn that ends on one of these is an action.
    * ``final_stop_strings``: a turn that ends on one of these is the final answer: the
      sampler stops there (as on EOS) and the trajectory ends with ``"eos"``, e.g.
      ``("</solution>",)``. Without it a model that closed its answer may run on to the
      token budget (repeating the answer, or opening another action).
    * ``obs_template``: wraps the observation; must contain ``{obs}`` once.
    * ``close_action_on_length``: if set (e.g. ``"</search>"``), a turn cut by
      ``max_action_tokens`` gets this closing text appended (loss mask 0) and counts as
      an action. For experiments with untrained models; off (None) by default.
    * ``max_concurrency``: how many trajectories run at once (None: unbounded).
    * ``seed``: if set, turn t of trajectory ``tid`` is sampled with a seed derived from
      ``(seed, tid, t)`` (reproducible, yet different across the samples of a group).
    """

    SECTION: ClassVar[str] = "rollout"

    max_turns: int = spec(4, check=at_least(0))
    max_response_tokens: int = spec(1024, check=at_least(1))
    max_action_tokens: int | None = spec(None, check=at_least(1, "None: the remaining budget"))
    max_obs_tokens: int = spec(256, check=at_least(1))
    obs_truncate_side: str = spec("tail", choices=("head", "tail"))
    obs_truncate_marker: str = "...[truncated]..."
    action_stop_strings: tuple[str, ...] = spec(
        ("</python>", "</search>", "</sql>", "</tool_call>"),
        check=(_stop_strings_ok, "a tuple of non-empty strings, e.g. ('</python>',)"),
    )
    final_stop_strings: tuple[str, ...] = spec(
        (),
        check=(_stop_strings_ok, "a tuple of non-empty strings, e.g. ('</solution>',), or ()"),
    )
    temperature: float = spec(1.0, check=at_least(0))
    top_p: float = spec(TOP_P_OFF, check=in_unit_interval())
    top_k: int = spec(TOP_K_OFF, check=(lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"))
    obs_template: str = spec(
        OBS_TEMPLATE_RESULT,
        check=(lambda v: v.count("{obs}") == 1, "a string containing {obs} once"),
    )
    close_action_on_length: str | None = None
    max_concurrency: int | None = spec(None, check=at_least(1, "None: unbounded"))
    seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        both = sorted(set(self.action_stop_strings) & set(self.final_stop_strings))
        if both:
            raise ValueError(
                f"rollout.final_stop_strings and rollout.action_stop_strings share {both}: "
                "a stop string either ends the trajectory or calls a tool; remove it from "
                "one of them"
            )
        # The sampling knobs together, with the sampler's own checks.
        SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> RolloutConfig:
        """Build from a dict / ConfigDict; unknown keys are an error naming them."""
        d = dict(d.items()) if not isinstance(d, dict) else dict(d)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown rollout config keys {unknown}; known: {sorted(known)}")
        for key in ("action_stop_strings", "final_stop_strings"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)

    def sampling_params(self, max_tokens: int, seed: int | None = None) -> SamplingParams:
        """The sampler request of one turn with ``max_tokens`` left."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=tuple(self.action_stop_strings) + tuple(self.final_stop_strings),
            seed=seed,
        )
