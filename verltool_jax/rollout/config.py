"""Rollout settings (filled from the experiment's ml_collections config)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from verltool_jax.samplers.base import SamplingParams

OBS_TEMPLATE_CHATML = "<|im_end|>\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
OBS_TEMPLATE_RESULT = "<result>\n{obs}\n</result>"


@dataclass(frozen=True)
class RolloutConfig:
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

    max_turns: int = 4
    max_response_tokens: int = 1024
    max_action_tokens: int | None = None
    max_obs_tokens: int = 256
    obs_truncate_side: str = "tail"
    obs_truncate_marker: str = "...[truncated]..."
    action_stop_strings: tuple[str, ...] = ("</python>", "</search>", "</sql>", "</tool_call>")
    final_stop_strings: tuple[str, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    obs_template: str = OBS_TEMPLATE_RESULT
    close_action_on_length: str | None = None
    max_concurrency: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"RolloutConfig.{name} {why}")

        if self.max_turns < 0:
            bad("max_turns", f"must be >= 0, got {self.max_turns}")
        if self.max_response_tokens < 1:
            bad("max_response_tokens", f"must be >= 1, got {self.max_response_tokens}")
        if self.max_action_tokens is not None and self.max_action_tokens < 1:
            bad("max_action_tokens", f"must be >= 1 or None, got {self.max_action_tokens}")
        if self.max_obs_tokens < 1:
            bad("max_obs_tokens", f"must be >= 1, got {self.max_obs_tokens}")
        if self.obs_truncate_side not in ("head", "tail"):
            bad("obs_truncate_side", f"must be 'head' or 'tail', got {self.obs_truncate_side!r}")
        if isinstance(self.action_stop_strings, str) or not all(
            isinstance(s, str) and s for s in self.action_stop_strings
        ):
            bad("action_stop_strings", "must be a tuple of non-empty strings, e.g. ('</python>',)")
        if isinstance(self.final_stop_strings, str) or not all(
            isinstance(s, str) and s for s in self.final_stop_strings
        ):
            bad(
                "final_stop_strings",
                "must be a tuple of non-empty strings, e.g. ('</solution>',), or () for none",
            )
        both = sorted(set(self.action_stop_strings) & set(self.final_stop_strings))
        if both:
            bad(
                "final_stop_strings",
                f"and action_stop_strings share {both}: a stop string "
                "either ends the trajectory or calls a tool; remove it from one of them",
            )
        if self.obs_template.count("{obs}") != 1:
            bad("obs_template", f"must contain '{{obs}}' exactly once, got {self.obs_template!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            bad("max_concurrency", f"must be >= 1 or None, got {self.max_concurrency}")
        # Validate the sampling knobs early with the sampler's own checks.
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
