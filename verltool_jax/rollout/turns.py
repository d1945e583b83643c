"""The per-trajectory state machine shared by the asynchronous loop and the sync baseline.

A :class:`TrajectoryBuilder` owns one :class:`Trajectory` and knows, turn by turn, what
to ask the sampler, whether a finished turn is an action for the tool server, how to
append the observation, and when to stop. The two schedulers (one asyncio task per
trajectory in ``agent_loop``; batch-by-batch in ``sync_baseline``) only decide *when*
each step runs, so both produce the same records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from tool_server.client import ToolResult
from verltool_jax.models.image_inputs import ImageInputError, check_placeholders
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.native import NativeTurns
from verltool_jax.rollout.observation import ObservationFormatter, encode, truncate_tokens
from verltool_jax.rollout.trajectory import Trajectory, TrajectoryImage
from verltool_jax.samplers.base import Completion, SamplingParams


def derive_seed(seed: int, trajectory_id: str, turn: int) -> int:
    """A 31-bit seed from ``(seed, trajectory_id, turn)`` (stable across processes)."""
    h = hashlib.sha256(f"{seed}:{trajectory_id}:{turn}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def row_extra_field(row: dict) -> dict:
    """What the tool server gets as a trajectory's ``extra_field``: the data row's
    ``extra_fields`` / ``extra_field`` if given, else its ``extra_info`` (verl layout,
    e.g. ``{"db_path": ...}`` for the sql tool)."""
    for key in ("extra_fields", "extra_field", "extra_info"):
        if isinstance(row.get(key), dict):
            return dict(row[key])
    return {}


class TrajectoryBuilder:
    """Build one trajectory token by token (token-in, token-out).

    Sampled ids are appended as sampled (loss mask 1, the sampler's logprobs, the
    version that sampled each token: ``Completion.versions()``); observation ids are tokenized on their own and
    appended with loss mask 0, logprob 0.0 and version -1.

    Images (vision-language policies: the formatter has an ``image_processor``): ``prompt_images`` are the
    prompt's, whose placeholder runs ``prompt_ids`` already hold; an observation's images
    (``extra["image"]`` / ``extra["images"]``) are processed and their placeholder ids put
    before the observation text, all with loss mask 0. Every image is recorded in
    ``Trajectory.images`` with the offset of its run, and sent to the sampler with the ids.
    An image the policy cannot take (undecodable, over the pixel budget, or the policy is
    text-only) is replaced by a note in the observation saying why.

    With a native tool-call format (``cfg.tool_format``; ``rollout/native.py``) a turn's
    calls are parsed from the reply and run one by one (``pending_action`` holds the next),
    and the observation tokens are the chat template's tool turn and next generation
    prompt, as the gateway renders them.
    """

    def __init__(
        self,
        trajectory_id: str,
        group_id: str,
        prompt_ids: list[int],
        cfg: RolloutConfig,
        tokenizer: Any,
        formatter: ObservationFormatter,
        data: dict | None = None,
        prompt_images: Sequence[Any] = (),
    ) -> None:
        if not prompt_ids:
            raise ValueError(
                f"trajectory {trajectory_id}: prompt_ids is empty; give the tokenized prompt"
            )
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.formatter = formatter
        self.image_processor = image_processor = formatter.image_processor
        self.traj = Trajectory(
            trajectory_id=trajectory_id,
            group_id=group_id,
            prompt_ids=list(prompt_ids),
            data=dict(data or {}),
        )
        if image_processor is not None:
            self.traj.image_token_id = image_processor.config.image_token_id
        if prompt_images:
            if image_processor is None:
                raise ImageInputError(
                    f"trajectory {trajectory_id}: the prompt has "
                    f"{len(prompt_images)} image(s) but the policy is a "
                    "text-only model; use a vision-language model "
                    "(Qwen2.5-VL) or drop the images"
                )
            starts = check_placeholders(
                prompt_ids,
                prompt_images,
                image_processor.config.image_token_id,
                f"trajectory {trajectory_id} prompt",
            )
            self.traj.images = [
                TrajectoryImage(im, s, "prompt", 0) for im, s in zip(prompt_images, starts)
            ]
        self._close_ids = (
            encode(tokenizer, cfg.close_action_on_length) if cfg.close_action_on_length else []
        )
        self.native: NativeTurns | None = None
        chat = cfg.tool_chat()
        if chat is not None:
            if image_processor is not None:
                raise ValueError(
                    f"rollout.tool_format={cfg.tool_format!r} is not supported for "
                    "vision-language policies yet; use rollout.tool_format='tags'"
                )
            self.native = NativeTurns.start(
                chat, tokenizer, self.traj.data, self.traj.prompt_ids, f"trajectory {trajectory_id}"
            )
        self.pending_action: str | None = None
        # extra fields of the next tool call only (a trajectory resumed from a checkpoint)
        self.resumed: dict | None = None

    # --- state ------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return bool(self.traj.termination)

    @property
    def remaining(self) -> int:
        return self.cfg.max_response_tokens - len(self.traj.response_ids)

    @property
    def is_last_tool_turn(self) -> bool:
        return self.traj.tool_calls + 1 >= self.cfg.max_turns

    @property
    def extra_field(self) -> dict:
        """What the tool server gets as this trajectory's ``extra_field``
        (:func:`row_extra_field` of its data row)."""
        return row_extra_field(self.traj.data)

    def _end(self, reason: str) -> None:
        if not self.traj.termination:
            self.traj.termination = reason

    def _append(
        self, ids: list[int], mask: int, logprobs: list[float], version: int | list[int]
    ) -> None:
        """Append ``ids``; ``version`` is one version for all, or one per token (a turn a
        partial rollout continued across a weight sync)."""
        t = self.traj
        t.response_ids.extend(ids)
        t.loss_mask.extend([mask] * len(ids))
        t.logprobs.extend(logprobs)
        t.versions.extend(
            version[: len(ids)] if isinstance(version, list) else [version] * len(ids)
        )

    def _placeholder_cut(self, token_ids) -> int | None:
        """Index of the first image / video placeholder in sampled ``token_ids`` (VL policies)."""
        if self.image_processor is None:
            return None
        c = self.image_processor.config
        bad = {c.image_token_id} | ({c.video_token_id} if c.video_token_id is not None else set())
        return next((i for i, tok in enumerate(token_ids) if int(tok) in bad), None)

    def sampler_images(self) -> list:
        """The ``ImageInput`` of every image so far, in placeholder order (what the sampler
        needs with ``prompt_ids + response_ids``)."""
        return [im.image for im in self.traj.images]

    def _observation_images(self, res: ToolResult) -> tuple[list, list[str]]:
        """``(ImageInput list, notes)`` for the images an observation carries; an image the
        policy cannot take becomes a note instead."""
        ex = res.extra or {}
        refs = ([ex["image"]] if ex.get("image") is not None else []) + list(ex.get("images") or [])
        if not refs:
            return [], []
        if self.image_processor is None:
            return [], [
                f"[the tool returned {len(refs)} image(s), but this policy is a "
                "text-only model and cannot see them]"
            ]
        out, notes = [], []
        for ref in refs:
            try:
                out.append(self.image_processor(ref))
            except ImageInputError as e:
                notes.append(f"[the returned image cannot be shown: {e}]")
        return out, notes

    # --- one turn ---------------------------------------------------------------------
    def request(self) -> tuple[list[int], SamplingParams] | None:
        """The next sampler request ``(token ids so far, params)``, or None if finished."""
        if self.finished:
            return None
        if self.remaining <= 0:
            self._end("budget")
            return None
        n = self.remaining
        if self.cfg.max_action_tokens is not None:
            n = min(n, self.cfg.max_action_tokens)
        seed = (
            derive_seed(self.cfg.seed, self.traj.trajectory_id, self.traj.num_turns)
            if self.cfg.seed is not None
            else None
        )
        return self.traj.prompt_ids + self.traj.response_ids, self.cfg.sampling_params(n, seed)

    def apply_completion(self, comp: Completion, latency_s: float = 0.0) -> str | None:
        """Append a model turn; return the action text to run, or None if it ended.

        A turn is an action if it stopped on one of ``action_stop_strings`` (or was cut by
        ``max_action_tokens`` with ``close_action_on_length`` set). Otherwise it ended on
        EOS (``"eos"``) or on the token budget (``"budget"``).
        """
        if len(comp.token_ids) != len(comp.logprobs):
            raise ValueError(
                f"sampler returned {len(comp.token_ids)} tokens but {len(comp.logprobs)} logprobs"
            )
        versions = comp.versions()  # per token: a partial rollout may span a weight sync
        t = self.traj
        t.num_turns += 1
        t.gen_latencies.append(float(latency_s))
        t.gen_tokens.append(len(comp.token_ids))
        cut = self._placeholder_cut(comp.token_ids)
        if cut is not None:
            # A sampled image / video placeholder has no image behind it: keep the tokens
            # before it and end the trajectory (its record stays what the sampler saw).
            self._append(
                list(comp.token_ids[:cut]), 1, [float(x) for x in comp.logprobs[:cut]], versions
            )
            self.fail(
                f"the policy sampled the image placeholder token "
                f"{comp.token_ids[cut]} (turn {t.num_turns}); the turn was cut there"
            )
            return None
        self._append(list(comp.token_ids), 1, [float(x) for x in comp.logprobs], versions)
        if self.native is not None:
            return self._native_reply(comp)
        is_action = (
            comp.finish_reason == "stop"
            and comp.stop_string is not None
            and comp.stop_string in self.cfg.action_stop_strings
        )
        forced = (
            not is_action
            and comp.finish_reason == "length"
            and bool(self._close_ids)
            and self.remaining >= len(self._close_ids)
        )
        if not (is_action or forced):
            self._end("eos" if comp.finish_reason == "stop" else "budget")
            return None
        if t.tool_calls >= self.cfg.max_turns:
            self._end("max_turns")
            return None
        if forced:
            # Cut mid-action by the per-turn cap: close the tag (not sampled: mask 0).
            self._append(self._close_ids, 0, [0.0] * len(self._close_ids), -1)
        # Decoding is used only for the text sent to the tool, never for training ids.
        text = self.tokenizer.decode(comp.token_ids, skip_special_tokens=False)
        if forced:
            text += self.cfg.close_action_on_length
        t.actions.append(text)
        self.pending_action = text
        return text

    def apply_observation(self, res: ToolResult) -> None:
        """Append the tool's answer to the pending action (loss mask 0)."""
        t = self.traj
        self.pending_action = None
        t.tool_calls += 1
        if not res.valid:
            t.invalid_tool_calls += 1
        t.tool_latencies.append(float(res.latency_s))
        t.observations.append(res.observation)
        if res.extra:
            t.extras.append({"turn": t.num_turns, **res.extra})
        images, notes = self._observation_images(res)
        text = "\n".join([res.observation] + notes) if notes else res.observation
        if notes:
            t.observations[-1] = text
        if self.native is not None:
            self.native.done |= bool(res.done)
            self._native_result(text)
            return
        proc = self.image_processor  # None only for a text-only policy, which gets no images
        blocks = [proc.placeholder_ids(im) for im in images] if proc is not None else []
        ids, truncated = self.formatter(text)
        t.obs_truncated += int(truncated)
        n_prefix = len(self.formatter.prefix_ids)
        ids = ids[:n_prefix] + [i for b in blocks for i in b] + ids[n_prefix:]
        if len(ids) > self.remaining:
            self._end("budget")  # the observation does not fit: stop before it
            return
        start = len(t.prompt_ids) + len(t.response_ids) + n_prefix
        for im, b in zip(images, blocks):
            t.images.append(TrajectoryImage(im, start + 1, "observation", t.num_turns))
            start += len(b)
        self._append(ids, 0, [0.0] * len(ids), -1)
        if res.done:
            self._end("done")

    # --- native tool calls (rollout/native.py) ------------------------------------------
    def _native_reply(self, comp: Completion) -> str | None:
        """After a sampled reply: its first action for the tool server, or None (it was
        the final answer, or every call was answered here; then the tool turn is in)."""
        assert self.native is not None
        t = self.traj
        calls = self.native.reply(comp, self.cfg.max_turns - t.tool_calls)
        if not calls:
            self._end("eos" if comp.finish_reason == "stop" else "budget")
            return None
        if t.tool_calls >= self.cfg.max_turns:
            self._end("max_turns")
            return None
        return self._native_next()

    def _native_next(self) -> str | None:
        """Answer this turn's calls that need no tool server, up to the next one that
        does (its action, now ``pending_action``); when all are answered, append the tool
        turn and return None."""
        nat = self.native
        assert nat is not None
        while (c := nat.next_call) is not None:
            if c.action is not None:
                self.traj.actions.append(c.action)
                self.pending_action = c.action
                return c.action
            text = f"Error: {c.error}"
            if c.counted:
                self.traj.tool_calls += 1
                self.traj.invalid_tool_calls += 1
                self.traj.actions.append(text)
                self.traj.observations.append(text)
            nat.answer(text)
        t = self.traj
        new = nat.tool_turn(t.prompt_ids + t.response_ids)
        if new is None:
            self.fail(
                f"the chat template rewrote earlier turns (rollout.tool_format="
                f"{self.cfg.tool_format!r}); the built-in loop keeps one sequence per "
                "trajectory: use rollout.producer='gateway' with this template"
            )
        elif len(new) > self.remaining:
            self._end("budget")  # the tool turn does not fit: stop before it
        else:
            self._append(new, 0, [0.0] * len(new), -1)
            if nat.done:
                self._end("done")
        return None

    def _native_result(self, text: str) -> None:
        """The tool server's answer to the pending call, cut to ``max_obs_tokens``."""
        assert self.native is not None
        f = self.formatter
        body = encode(self.tokenizer, text)
        if len(body) > f.max_obs_tokens:
            cut = truncate_tokens(body, f.max_obs_tokens, f.side, f.marker_ids)
            text = self.tokenizer.decode(cut, skip_special_tokens=False)
            self.traj.obs_truncated += 1
        self.native.answer(text)
        self._native_next()

    async def generate(self, sampler: Any, ids: list[int], params: SamplingParams) -> Any:
        """``sampler.generate`` for this trajectory's request, with its images if it has any."""
        imgs = self.sampler_images()
        if imgs:
            return await sampler.generate(
                ids, params, request_id=self.traj.trajectory_id, images=imgs
            )
        return await sampler.generate(ids, params, request_id=self.traj.trajectory_id)

    def fail(self, message: str) -> None:
        """End this trajectory with ``termination="error"`` (the batch goes on)."""
        self.traj.termination = "error"
        self.traj.error = message
        self.pending_action = None
