"""Rollout settings (filled from the experiment's ml_collections config)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from verltool_jax.chat.render import DEFAULT_TOOL_PROMPT, TOOL_PROMPTS, ToolChat
from verltool_jax.chat.tool_parsers import FORMATS, stop_strings
from verltool_jax.samplers.base import SamplingParams
from verltool_jax.schema import Checked, at_least, in_unit_interval, spec
from verltool_jax.truncation import TOP_K_OFF, TOP_P_OFF

OBS_TEMPLATE_CHATML = "<|im_end|>\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
OBS_TEMPLATE_RESULT = "<result>\n{obs}\n</result>"
# rollout.tool_format: our tag format (``<python>...</python>`` actions, observations in
# ``obs_template``) or a native tool-call format of ``chat.tool_parsers`` (docs/rollout.md)
TAGS = "tags"
TOOL_FORMATS = (TAGS, *FORMATS)


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
    * ``tool_format``: ``"tags"`` (the above: tag actions, ``obs_template``), or a native
      tool-call format (``"hermes"``, ``"qwen3"``, ``"llama3"``; ``rollout/native.py``):
      the prompt and every tool result are rendered by the chat template with the tools'
      JSON schemas (``tools``), as the gateway renders an agent program's conversation;
      ``action_stop_strings`` and ``obs_template`` are not used then.
    * ``tool_prompt``: native formats, a template that takes no ``tools=``: the tool block
      written into the system message (``chat.render.TOOL_PROMPTS``).
    * ``stop_after_call``: native formats: a turn stops at the end of its first call (the
      parser's stop strings, ``chat.tool_parsers.CALL_STOPS``); False: at the end-of-turn
      token, as a program through the gateway samples, so one reply may hold parallel calls.
    * ``tools``: the tools' OpenAI entries for native formats; not a config key: the run
      reads them from its tool server (``GET /tools``, ``BaseTool.function_schema()``).
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
    tool_format: str = spec(TAGS, choices=TOOL_FORMATS)
    tool_prompt: str = spec(DEFAULT_TOOL_PROMPT, choices=tuple(TOOL_PROMPTS))
    stop_after_call: bool = True
    tools: tuple[dict, ...] = spec((), derived=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        calls = self.call_stop_strings()
        both = sorted(set(calls) & set(self.final_stop_strings))
        if both:
            what = (
                "rollout.action_stop_strings"
                if self.tool_format == TAGS
                else f"the stop strings of rollout.tool_format={self.tool_format!r}"
            )
            raise ValueError(
                f"rollout.final_stop_strings and {what} share {both}: a stop string "
                "either ends the trajectory or calls a tool; remove it from "
                "rollout.final_stop_strings"
            )
        if self.tool_format != TAGS and self.close_action_on_length is not None:
            raise ValueError(
                f"rollout.close_action_on_length={self.close_action_on_length!r} closes a tag "
                f"action; rollout.tool_format={self.tool_format!r} writes calls as JSON: set "
                "rollout.close_action_on_length=None (or rollout.tool_format='tags')"
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
        for key in ("action_stop_strings", "final_stop_strings", "tools"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)

    @property
    def native(self) -> bool:
        """True for a native tool-call format (``tool_format`` is not ``"tags"``)."""
        return self.tool_format != TAGS

    def call_stop_strings(self) -> tuple[str, ...]:
        """The stop strings that end a turn on a tool call: ``action_stop_strings`` with
        tags; the parser's (``chat.tool_parsers.CALL_STOPS``) for a native format with
        ``stop_after_call``, else none (the turn ends at the end-of-turn token)."""
        if not self.native:
            return tuple(self.action_stop_strings)
        return stop_strings(self.tool_format) if self.stop_after_call else ()

    def tool_chat(self) -> ToolChat | None:
        """How native tool calls are rendered (None with tags); needs ``tools``."""
        if not self.native:
            return None
        if not self.tools:
            raise ValueError(
                f"rollout.tool_format={self.tool_format!r} needs the tools' schemas in "
                "RolloutConfig.tools (a run reads them from its tool server's GET /tools): "
                "give tools=[BaseTool.function_schema(), ...]"
            )
        return ToolChat(tuple(self.tools), self.tool_format, self.tool_prompt)

    def sampling_params(self, max_tokens: int, seed: int | None = None) -> SamplingParams:
        """The sampler request of one turn with ``max_tokens`` left."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=self.call_stop_strings() + tuple(self.final_stop_strings),
            seed=seed,
        )
