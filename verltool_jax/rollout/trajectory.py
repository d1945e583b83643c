"""The record of one finished (or failed) trajectory, as the trainer consumes it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

# Trajectory.token_stats keys: the trainer's logprob of each sampled token (at the
# sampling temperature, under the sampler's truncation when the trainer scores so), the
# entropy of the trainer's distribution it was drawn from, and the off-policy weight the
# train step gives it (0: masked; only with algo.old_logprobs="recompute" and a correction)
TRAINER_LOGPROB, ENTROPY, IS_WEIGHT = "trainer_logprob", "entropy", "is_weight"
TOKEN_STAT_KEYS = (TRAINER_LOGPROB, ENTROPY, IS_WEIGHT)


@dataclass
class TrajectoryImage:
    """One image of a trajectory: its patches (``models.image_inputs.ImageInput``) and where its
    placeholder run starts in ``prompt_ids + response_ids`` (``offset``; ``image.num_tokens``
    placeholders from there). ``source`` is ``"prompt"`` or ``"observation"``; ``turn`` the
    model turn after which an observation image arrived (0 for prompt images)."""

    image: Any
    offset: int
    source: str = "prompt"
    turn: int = 0


@dataclass
class Trajectory:
    """One agent trajectory: the prompt, then the response (model turns + observations).

    ``response_ids``, ``loss_mask``, ``logprobs`` and ``versions`` have the same length.
    ``loss_mask[i]`` is 1 for tokens the policy sampled and 0 for observation tokens;
    ``logprobs[i]`` is the sampler's logprob (0.0 for observation tokens);
    ``versions[i]`` is the policy version that sampled token i (-1 for observations).
    ``token_stats`` holds more per-token lists of that length, recorded by the trainer's
    token pass (``train/token_stats.py``) on the steps that measure parity: the
    ``TOKEN_STAT_KEYS`` above, None at observation tokens; empty when not recorded.
    """

    trajectory_id: str
    group_id: str  # all samples of one prompt share it
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    token_stats: dict[str, list[float | None]] = field(default_factory=dict)
    num_turns: int = 0
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    termination: str = ""  # "eos" | "done" | "max_turns" | "budget" | "error"
    tool_latencies: list[float] = field(default_factory=list)
    gen_latencies: list[float] = field(default_factory=list)  # sampler wall time per turn
    gen_tokens: list[int] = field(default_factory=list)  # tokens sampled per turn
    obs_truncated: int = 0  # observations cut to max_obs_tokens
    extras: list[dict] = field(default_factory=list)  # observations' payloads (image, reward, ...)
    actions: list[str] = field(default_factory=list)  # for reports: each turn's action text
    observations: list[str] = field(default_factory=list)
    reward: float | None = None
    reward_info: dict = field(default_factory=dict)
    data: dict[str, Any] = field(
        default_factory=dict
    )  # the data row (ground truth, data_source, ...)
    images: list[TrajectoryImage] = field(default_factory=list)  # every image the policy saw
    image_token_id: int | None = None  # the placeholder id of ``images`` (VL policies)
    wall_time_s: float = 0.0
    error: str | None = None

    def check(self) -> None:
        """Raise ValueError if the per-token lists disagree in length or an image's placeholder
        run is not where the record says."""
        n = len(self.response_ids)
        lists = {k: getattr(self, k) for k in ("loss_mask", "logprobs", "versions")}
        lists.update({f"token_stats[{k!r}]": v for k, v in self.token_stats.items()})
        for name, values in lists.items():
            if len(values) != n:
                raise ValueError(
                    f"Trajectory.{name} has length {len(values)}, response_ids has {n}"
                )
        if self.images:
            from verltool_jax.models.image_inputs import placeholder_runs

            ids = self.prompt_ids + self.response_ids
            tok = self.image_token_id
            if tok is None:
                raise ValueError(
                    f"trajectory {self.trajectory_id} has {len(self.images)} image(s) but no "
                    "image_token_id; set Trajectory.image_token_id to the policy's placeholder id"
                )
            want = [(im.offset, im.image.num_tokens) for im in self.images]
            if placeholder_runs(ids, tok) != want:
                raise ValueError(
                    f"trajectory {self.trajectory_id}: image placeholder runs "
                    f"{placeholder_runs(ids, tok)} differ from the images' "
                    f"(offset, tokens) {want}"
                )

    # fields a JSON record leaves out: image patches and observation payloads
    JSON_SKIPS = ("images", "extras")

    def to_json(self) -> dict:
        """Every field but ``images`` and ``extras`` as plain JSON values (numpy arrays and
        scalars converted); :meth:`from_json` rebuilds the trajectory."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.JSON_SKIPS}
        return json.loads(json.dumps(d, default=_json_value))

    @classmethod
    def from_json(cls, d: dict) -> Trajectory:
        """The trajectory :meth:`to_json` recorded (without images and extras)."""
        return cls(**d)

    @property
    def min_version(self) -> int:
        """Oldest policy version that sampled any token (-1 if none were sampled)."""
        sampled = [v for v, m in zip(self.versions, self.loss_mask) if m]
        return min(sampled) if sampled else -1


def _json_value(x: Any) -> Any:
    """numpy arrays and scalars as lists and numbers; anything else as its string."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def dump_trajectories(path: Any, trajs: Sequence[Trajectory]) -> None:
    """Write ``trajs`` (``Trajectory.to_json``: every field but images and extras) as JSON
    lines to ``path`` (a ``pathlib.Path``; its folder is made); ``load_trajectories``
    reads them back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for t in trajs:
            f.write(json.dumps(t.to_json()) + "\n")


def load_trajectories(path: Any) -> list[Trajectory]:
    """The trajectories ``dump_trajectories`` wrote to ``path``."""
    with open(path) as f:
        return [Trajectory.from_json(json.loads(line)) for line in f if line.strip()]


def trajectory_field(t: Any, key: str, default: Any = None) -> Any:
    """Field ``key`` of ``t``, a :class:`Trajectory` or its JSON form (a dict, as
    ``dump_trajectories`` writes it and reports read it back), else ``default``."""
    if isinstance(t, Mapping):
        return t.get(key, default)
    return getattr(t, key, default)
