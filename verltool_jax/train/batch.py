"""The train batch: a dict of right-padded arrays, and its construction from trajectories.

Layout (B sequences, padded length T; row b = prompt tokens then response tokens):

=================== ========= ===========================================================
key                 shape     meaning
=================== ========= ===========================================================
input_ids           [B,T] i32 prompt + response token ids, right-padded with ``pad_id``
attention_mask      [B,T] i32 1 on real tokens, 0 on padding
loss_mask           [B,T] f32 **target-aligned**: ``loss_mask[b,t] = 1`` iff token
                              ``input_ids[b,t+1]`` was sampled by the policy (a response
                              token with ``Trajectory.loss_mask`` 1); last column is 0
advantages          [B]   f32 per-sequence advantage (the loss broadcasts it by the mask)
old_logprobs        [B,T] f32 target-aligned behaviour logprob of ``input_ids[b,t+1]``
                              (filled from the sampler; the step may recompute it)
sampler_logprobs    [B,T] f32 target-aligned logprob the sampler reported
ref_logprobs        [B,T] f32 optional, target-aligned reference-policy logprob
parity_mask         [B,T] f32 optional, target-aligned: the tokens the version being
                              trained sampled (the step returns the parity sums of
                              them, ``train.parity``)
rewards             [B]   f32 with ``algo.adv_estimator="gae"``: the outcome reward per
                              sequence (``advantages`` are 0; the step computes them)
=================== ========= ===========================================================

With images (vision-language policies; trajectories that carry ``images``), also:

===================== =========== =========================================================
positions             [B,T,3] i32 M-RoPE positions (``vision_language.mrope_positions``)
image_pixels          [B,N,D] f32 each row's patches (its images in placeholder order),
                                  zero-padded to N (a multiple of ``spatial_merge_size**2``)
image_patch_positions [B,N,2] i32 (row, column) of each patch in its image
image_full_groups     [B,G,L] i32 each row's per-frame attention groups (``attention_groups``)
image_window_groups   [B,G,L] i32 each row's window groups; -1 pads
===================== =========== =========================================================

Every image is stored with the row that sees it, so splitting the batch by rows (mini /
micro-batches, data sharding) keeps each row's images with it.

**Shared-prompt layout** (``trainer.shared_prompt``; text-only batches whose rows come in
groups of n consecutive trajectories with the exact same ``prompt_ids``): each group's
prompt but its last token is held once, and each row holds the last prompt token then
its response, so the per-token arrays keep the same target alignment (position 0 of a
row predicts the first response token) over a much shorter T:

=================== ========= ===========================================================
prefix_ids          [G,P] i32 group g's ``prompt_ids[:-1]``, right-padded (G = B / n)
prefix_mask         [G,P] i32 1 on its real tokens
=================== ========= ===========================================================

Row b belongs to group ``b // n``; its token t sits at position ``len(prompt) - 1 + t``
and attends to its group's whole prefix (``Transformer.shared_prefix_hidden``). The
train step splits such a batch into mini/micro-batches of whole groups.

Target alignment means position t of every per-token array refers to the token the
model predicts *at* position t, i.e. ``targets = input_ids[:, 1:]`` (see
:func:`shift_targets`), which is exactly what ``token_logprobs(model, input_ids,
attention_mask, targets)`` returns at position t.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from verltool_jax import metric_names as names
from verltool_jax.algos.advantages import episode_advantages
from verltool_jax.algos.credit import turn_discounted_advantages
from verltool_jax.algos.dapo import informative_groups, overlong_penalty
from verltool_jax.gateway.program import episode_of
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.reporting.learning_signal import signal_metrics
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train.health import trajectory_failed

if TYPE_CHECKING:
    from verltool_jax.algos.config import AlgoConfig
    from verltool_jax.run_config import RunConfig

PAD_MULTIPLE = 16  # sequence lengths are padded to a multiple of this (few jit shapes)

REQUIRED_KEYS = (
    "input_ids",
    "attention_mask",
    "loss_mask",
    "advantages",
    "old_logprobs",
    "sampler_logprobs",
)
IMAGE_KEYS = (
    "positions",
    "image_pixels",
    "image_patch_positions",
    "image_full_groups",
    "image_window_groups",
)
PREFIX_KEYS = ("prefix_ids", "prefix_mask")
OPTIONAL_KEYS = ("ref_logprobs", "rewards", "parity_mask") + IMAGE_KEYS + PREFIX_KEYS
# trainer.shared_prompt="auto" trains shared when the shared layout's padded tokens
# (G*P + B*T) are at most this fraction of the plain layout's (B*T); measured in
# docs/performance.md (benchmarks/train_step.py --shared-prompt)
SHARED_PROMPT_AUTO_MAX_TOKEN_FRACTION = 0.75


def shift_targets(input_ids, pad_id: int = 0):
    """``targets[b,t] = input_ids[b,t+1]``; the last column is ``pad_id`` (always masked)."""
    xp = jnp if not isinstance(input_ids, np.ndarray) else np
    pad = xp.full(input_ids.shape[:-1] + (1,), pad_id, dtype=input_ids.dtype)
    return xp.concatenate([input_ids[..., 1:], pad], axis=-1)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def bucket_length(n: int, multiple: int = 1) -> int:
    """The padded length of a batch whose longest row has ``n`` tokens: ``n`` rounded up to
    ``g = max(multiple, 2**(bit_length(n - 1) - 3))``, i.e. eight buckets per doubling of
    length at most (each jit shape compiles once; a 30-layer model takes tens of seconds per
    shape on CPU), and at most ``g`` padding tokens (under 1/4 of ``n``)."""
    if n < 1:
        raise ValueError(f"bucket_length needs n >= 1, got {n}")
    g = max(multiple, 1 << max(0, (n - 1).bit_length() - 3))
    return _round_up(n, g)


def image_rows(
    ids: np.ndarray, attn: np.ndarray, row_images: Sequence[Sequence], config
) -> dict[str, np.ndarray]:
    """The image keys of the train batch (module docstring) for right-padded ``ids``/``attn``
    and each row's ``ImageInput`` list (``models.image_inputs``). Shapes are bucketed to
    powers of two so few compilations serve every batch."""
    from verltool_jax.models.image_inputs import stack_images
    from verltool_jax.models.vision import _pad_groups, _pow2, image_batch
    from verltool_jax.models.vision_language import mrope_positions

    v = config.vision
    m2 = v.spatial_merge_size**2
    B = ids.shape[0]
    per_row, pos = [], np.zeros(ids.shape + (3,), np.int32)
    for b in range(B):
        pv, grid = stack_images(row_images[b])
        pos[b] = mrope_positions(ids[b : b + 1], attn[b : b + 1], grid, config)[0][0]
        per_row.append(None if pv is None else image_batch(pv, grid, v))
    real = [r for r in per_row if r is not None]
    if not real:
        raise ValueError("image_rows: no row has images")
    N = m2 * _pow2(max(r.pixel_values.shape[0] for r in real) // m2)
    dims = {
        k: (
            _pow2(max(getattr(r, k).shape[0] for r in real)),
            _pow2(max(getattr(r, k).shape[1] for r in real)),
        )
        for k in ("full_groups", "window_groups")
    }
    out = {
        "positions": pos,
        "image_pixels": np.zeros((B, N, v.patch_dim), np.float32),
        "image_patch_positions": np.zeros((B, N, 2), np.int32),
        "image_full_groups": np.full((B,) + dims["full_groups"], -1, np.int32),
        "image_window_groups": np.full((B,) + dims["window_groups"], -1, np.int32),
    }
    for b, r in enumerate(per_row):
        if r is None:
            continue
        n = r.pixel_values.shape[0]
        out["image_pixels"][b, :n] = np.asarray(r.pixel_values)
        out["image_patch_positions"][b, :n] = np.asarray(r.patch_positions)
        out["image_full_groups"][b] = _pad_groups(np.asarray(r.full_groups), *dims["full_groups"])
        out["image_window_groups"][b] = _pad_groups(
            np.asarray(r.window_groups), *dims["window_groups"]
        )
    return out


def row_images_of(batch: dict):
    """``(positions, row_images)`` of a train (micro-)batch with images, else ``(None, None)``;
    ``row_images`` is the per-row ``ImageBatch`` that ``token_logprobs(row_images=)`` takes."""
    if "image_pixels" not in batch:
        return None, None
    from verltool_jax.models.vision import ImageBatch

    return batch["positions"], ImageBatch(
        pixel_values=batch["image_pixels"],
        patch_positions=batch["image_patch_positions"],
        full_groups=batch["image_full_groups"],
        window_groups=batch["image_window_groups"],
    )


def prompt_group_size(trajs: Sequence) -> int:
    """n when ``trajs`` come in consecutive runs of n >= 2 trajectories with identical
    ``prompt_ids`` of at least 2 tokens and no images (the shared-prompt layout applies),
    else 0."""
    if not trajs:
        return 0
    n = 1
    while n < len(trajs) and list(trajs[n].prompt_ids) == list(trajs[0].prompt_ids):
        n += 1
    if n < 2 or len(trajs) % n:
        return 0
    for g in range(0, len(trajs), n):
        head = list(trajs[g].prompt_ids)
        if len(head) < 2:
            return 0
        if g + n < len(trajs) and list(trajs[g + n].prompt_ids) == head:
            return 0  # a longer run: not groups of n
        for tr in trajs[g : g + n]:
            if getattr(tr, "images", None) or list(tr.prompt_ids) != head:
                return 0
    return n


def layout_tokens(trajs: Sequence, group_size: int, pad_to_multiple: int = 1) -> int:
    """Padded tokens the train step runs for ``trajs``: ``B*T`` in the plain layout
    (``group_size`` 0), ``G*P + B*T`` in the shared-prompt one (module docstring)."""
    B = len(trajs)
    if not group_size:
        return B * bucket_length(
            max(len(t.prompt_ids) + len(t.response_ids) for t in trajs), pad_to_multiple
        )
    P = bucket_length(max(len(t.prompt_ids) - 1 for t in trajs), pad_to_multiple)
    T = bucket_length(max(1 + len(t.response_ids) for t in trajs), pad_to_multiple)
    return (B // group_size) * P + B * T


def _fill_rows(rows: Sequence[tuple[Sequence[int], Any]], T: int, pad_id: int) -> dict:
    """The per-token arrays of rows ``(head, trajectory)``: ``head + response_ids``
    right-padded to T, the response targets at ``len(head) - 1 + j``."""
    B = len(rows)
    ids = np.full((B, T), pad_id, np.int32)
    attn = np.zeros((B, T), np.int32)
    lmask = np.zeros((B, T), np.float32)
    slp = np.zeros((B, T), np.float32)
    for b, (head, tr) in enumerate(rows):
        p, r = len(head), len(tr.response_ids)
        ids[b, : p + r] = np.asarray(list(head) + list(tr.response_ids), np.int32)
        attn[b, : p + r] = 1
        # response token j sits at position p + j; it is the target of position p + j - 1
        lmask[b, p - 1 : p - 1 + r] = np.asarray(tr.loss_mask, np.float32)
        slp[b, p - 1 : p - 1 + r] = (
            np.asarray(tr.logprobs, np.float32) * lmask[b, p - 1 : p - 1 + r]
        )
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": lmask,
        "old_logprobs": slp.copy(),
        "sampler_logprobs": slp,
    }


def batch_from_trajectories(
    trajs: Sequence,
    advantages,
    pad_id: int,
    max_len: int,
    pad_to_multiple: int = 1,
    model_config=None,
    group_size: int = 0,
) -> dict[str, np.ndarray]:
    """Build the train batch (module docstring) from ``Trajectory`` records.

    Trajectories with ``images`` add the image keys (``model_config``, the vision-language
    model's ``ModelConfig``, defaults to the one the images were processed for): every image at the placeholder run the sampler
    saw (checked by ``Trajectory.check``), observation image tokens with loss mask 0 as all
    observation tokens.

    T is the longest ``len(prompt_ids) + len(response_ids)`` rounded up to its length
    bucket (``bucket_length`` with granularity at least ``pad_to_multiple``, so batches
    reuse few compiled shapes), capped at ``max_len``.
    A trajectory longer than ``max_len`` is an error (it would lose sampled tokens).
    A response of length 0 gives an all-zero loss-mask row (it contributes nothing).
    ``group_size = n > 0`` builds the shared-prompt layout (module docstring; the rows
    must be groups of n with one prompt, :func:`prompt_group_size`), its P and T bucketed
    the same way. Returns numpy arrays (place them on the mesh with
    ``verltool_jax.sharding.batch_sharding``).
    """
    if len(trajs) == 0:
        raise ValueError("batch_from_trajectories needs at least one trajectory")
    adv = np.asarray(advantages, dtype=np.float32)
    if adv.shape != (len(trajs),):
        raise ValueError(
            f"advantages must have shape ({len(trajs)},) (one per trajectory), got {adv.shape}"
        )
    if pad_to_multiple < 1 or max_len < 2:
        raise ValueError(
            f"need pad_to_multiple >= 1 and max_len >= 2, got {pad_to_multiple}, {max_len}"
        )
    lengths = []
    for tr in trajs:
        tr.check()
        n = len(tr.prompt_ids) + len(tr.response_ids)
        if len(tr.prompt_ids) == 0:
            raise ValueError(f"trajectory {tr.trajectory_id!r} has an empty prompt_ids")
        if n > max_len:
            raise ValueError(
                f"trajectory {tr.trajectory_id!r} has {n} tokens > max_len="
                f"{max_len}; raise max_len or cap the rollout length"
            )
        lengths.append(n)
    if group_size:
        if prompt_group_size(trajs) != group_size:
            raise ValueError(
                f"group_size={group_size}: the trajectories are not groups of "
                f"{group_size} consecutive rows with one prompt (see prompt_group_size)"
            )
        G = len(trajs) // group_size
        P = bucket_length(max(len(t.prompt_ids) - 1 for t in trajs), pad_to_multiple)
        T = bucket_length(max(1 + len(t.response_ids) for t in trajs), pad_to_multiple)
        out = _fill_rows([(t.prompt_ids[-1:], t) for t in trajs], T, pad_id)
        out["prefix_ids"] = np.full((G, P), pad_id, np.int32)
        out["prefix_mask"] = np.zeros((G, P), np.int32)
        for g in range(G):
            head = trajs[g * group_size].prompt_ids[:-1]
            out["prefix_ids"][g, : len(head)] = np.asarray(head, np.int32)
            out["prefix_mask"][g, : len(head)] = 1
        out["advantages"] = adv
        return out
    T = min(bucket_length(max(lengths), pad_to_multiple), max_len)
    out = _fill_rows([(t.prompt_ids, t) for t in trajs], T, pad_id)
    out["advantages"] = adv
    ids, attn = out["input_ids"], out["attention_mask"]
    with_images = [tr for tr in trajs if getattr(tr, "images", None)]
    if with_images:
        model_config = model_config or with_images[0].images[0].image.config
        if model_config is None or not getattr(model_config, "is_vision_language", False):
            bad = next(tr.trajectory_id for tr in trajs if getattr(tr, "images", None))
            raise ValueError(
                f"trajectory {bad!r} carries images but the policy is not a "
                "vision-language model (pass model_config= of a Qwen2.5-VL / "
                "Qwen2-VL policy)"
            )
        out.update(
            image_rows(
                ids,
                attn,
                [[im.image for im in getattr(tr, "images", [])] for tr in trajs],
                model_config,
            )
        )
    return out


def observation_targets(trajs: Sequence, T: int) -> np.ndarray:
    """[B,T] f32 target-aligned mask of the response tokens the policy did *not* sample
    (tool observations, and tags closed on the model's behalf): ``1`` at position
    ``p - 1 + j`` iff response token j of row b has ``Trajectory.loss_mask`` 0. Rows are
    in ``trajs`` order, positions as in :func:`batch_from_trajectories`."""
    out = np.zeros((len(trajs), T), np.float32)
    for b, tr in enumerate(trajs):
        p, r = len(tr.prompt_ids), len(tr.response_ids)
        n = max(0, min(r, T - p + 1))
        out[b, p - 1 : p - 1 + n] = 1.0 - np.asarray(tr.loss_mask[:n], np.float32)
    return out


def include_observations(
    batch: dict, obs_targets: np.ndarray, behaviour_logprobs: np.ndarray | None
) -> dict:
    """The batch with the observation tokens trained on as if sampled (the ablation of
    the observation mask; by default the framework never does this).

    ``loss_mask = max(loss_mask, obs)``; at the observation positions ``old_logprobs``
    and ``sampler_logprobs`` become ``behaviour_logprobs`` (the trainer's own logprobs
    before the update: no sampler ever scored those tokens, so their ratio starts at 1
    and their truncated IS weight is 1). ``behaviour_logprobs=None``: only the loss mask
    changes (for a step that recomputes ``old_logprobs`` and applies no truncated IS, which
    then reads neither). Other positions are unchanged. Returns a new dict.
    """
    obs = np.asarray(obs_targets, np.float32)
    if obs.shape != batch["loss_mask"].shape:
        raise ValueError(
            f"obs_targets has shape {obs.shape}, the batch's loss_mask {batch['loss_mask'].shape}"
        )
    out = dict(batch)
    out["loss_mask"] = np.maximum(batch["loss_mask"], obs)
    if behaviour_logprobs is None:
        return out
    lp = np.asarray(behaviour_logprobs, np.float32)
    for k in ("old_logprobs", "sampler_logprobs"):
        out[k] = np.where(obs > 0, lp, batch[k]).astype(np.float32)
    return out


def check_batch(batch: dict) -> tuple[int, int]:
    """Validate keys and shapes of a train batch; returns ``(B, T)``. ValueError names the key."""
    missing = [k for k in REQUIRED_KEYS if k not in batch]
    if missing:
        raise ValueError(
            f"train batch is missing {missing}; build it with "
            f"batch_from_trajectories (keys: {list(REQUIRED_KEYS)})"
        )
    unknown = sorted(set(batch) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise ValueError(f"train batch has unknown keys {unknown}")
    B, T = batch["input_ids"].shape
    present = [k for k in IMAGE_KEYS if k in batch]
    if present and len(present) != len(IMAGE_KEYS):
        raise ValueError(
            f"train batch has image keys {present} but not all of "
            f"{list(IMAGE_KEYS)}; build it with batch_from_trajectories"
        )
    prefix = [k for k in PREFIX_KEYS if k in batch]
    if prefix:
        if len(prefix) != len(PREFIX_KEYS) or present:
            raise ValueError(
                f"train batch has {prefix}: a shared-prompt batch needs all of "
                f"{list(PREFIX_KEYS)} and no image keys; build it with batch_from_trajectories"
            )
        G = batch["prefix_ids"].shape[0]
        if batch["prefix_ids"].ndim != 2 or G == 0 or B % G:
            raise ValueError(
                f"train batch['prefix_ids'] has shape {tuple(batch['prefix_ids'].shape)}; "
                f"it must be [G, P] with the {B} rows a whole number of groups of G"
            )
    for k in REQUIRED_KEYS + OPTIONAL_KEYS:
        if k not in batch:
            continue
        if k in PREFIX_KEYS:
            want = tuple(batch["prefix_ids"].shape)
        elif k in IMAGE_KEYS:
            want = (B, T, 3) if k == "positions" else (B,) + tuple(batch[k].shape[1:])
        else:
            per_seq = k == "rewards" or (k == "advantages" and batch[k].ndim == 1)
            want = (B,) if per_seq else (B, T)
        if tuple(batch[k].shape) != want:
            raise ValueError(
                f"train batch[{k!r}] has shape {tuple(batch[k].shape)}, expected {want}"
            )
    return B, T


def advantages_for(
    rc: RunConfig, algo: AlgoConfig, trajs: Sequence[Trajectory]
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(advantages, keep-mask, metrics) of a batch, with the DAPO options applied:
    overlong penalty added to the rewards, dynamic sampling keeping informative groups.

    The estimator sees the kept trajectories only (the same values for the group
    estimators, whose groups are kept whole; the REINFORCE++ batch statistics are those
    of the trained batch, as verl filters before computing advantages); dropped ones get
    0. Token counts for the token-weighted estimators are the tokens the loss trains:
    the sampled ones, or the whole response when observations are not masked.

    With ``algo.adv_estimator="gae"`` the first array holds the (penalised) rewards
    themselves: the train step computes the advantages with the critic."""
    rewards = np.array([t.reward for t in trajs], np.float32)
    gids = [t.group_id for t in trajs]
    m = {}
    if algo.overlong_buffer_len > 0:
        pen = overlong_penalty(
            [len(t.response_ids) for t in trajs],
            rc.rollout.max_response_tokens,
            algo.overlong_buffer_len,
            algo.overlong_penalty_factor,
        )
        rewards = rewards + pen
        m[names.OVERLONG_PENALTY] = float(pen.mean())
    keep = np.ones(len(trajs), bool)
    if algo.dynamic_sampling:
        keep = informative_groups(rewards, gids)
        m[names.BATCH_INFORMATIVE_FRAC] = float(keep.mean())
    if rc.rollout.mask_observations:
        counts = np.array([sum(t.loss_mask) for t in trajs], np.float32)
    else:
        counts = np.array([len(t.response_ids) for t in trajs], np.float32)
    adv = np.zeros(len(trajs), np.float32)
    if algo.uses_critic:
        adv[keep] = rewards[keep]
    elif keep.any():
        # a gateway episode split at a template break counts once (its pieces share it)
        eids = [episode_of(t, i) for i, t in enumerate(trajs)]
        adv[keep] = episode_advantages(
            algo.adv_estimator,
            rewards[keep],
            [g for g, k in zip(gids, keep) if k],
            [e for e, k in zip(eids, keep) if k],
            counts[keep],
        )
    return adv, keep, m


@dataclass
class RLBatch:
    """A batch ready for the train step: ``arrays`` (the layout above), the trajectories
    whose rows they are (before the padding rows), and what making it measured."""

    arrays: dict[str, np.ndarray]
    trajectories: list[Trajectory]
    metrics: dict[str, float] = field(default_factory=dict)


def shared_group_size(rc: RunConfig, algo: AlgoConfig, rows: Sequence[Trajectory]) -> int:
    """The group size n of the shared-prompt layout for the batch rows ``rows``, or 0 for
    the plain layout: ``trainer.shared_prompt`` ``off`` never; ``on`` whenever the rows
    are groups with one prompt (:func:`prompt_group_size`) and the settings allow it
    (``run_config.shared_prompt_blocker``); ``auto`` then only when it cuts the padded
    tokens to at most ``SHARED_PROMPT_AUTO_MAX_TOKEN_FRACTION`` of the plain layout's."""
    from verltool_jax.run_config import shared_prompt_blocker

    mode = rc.trainer.shared_prompt
    n = 0 if mode == "off" else prompt_group_size(rows)
    if not n or shared_prompt_blocker(algo, n, rc.rollout.mask_observations):
        return 0
    return n if mode == "on" or shared_layout_pays(rows, n) else 0


def shared_layout_pays(rows: Sequence, group_size: int) -> bool:
    """``trainer.shared_prompt="auto"``'s rule: the shared-prompt layout of ``rows``
    (groups of ``group_size``) has at most ``SHARED_PROMPT_AUTO_MAX_TOKEN_FRACTION`` of
    the plain layout's padded tokens."""
    shared = layout_tokens(rows, group_size, PAD_MULTIPLE)
    return shared <= SHARED_PROMPT_AUTO_MAX_TOKEN_FRACTION * layout_tokens(rows, 0, PAD_MULTIPLE)


def make_batch(
    rc: RunConfig,
    algo: AlgoConfig,
    trajs: Sequence[Trajectory],
    pad_id: int,
    model: Callable[[], Any] | None = None,
) -> RLBatch | None:
    """The RL batch of scored trajectories, or None when nothing is left to train on
    (every group dropped by dynamic sampling). Host-side; runs no train step.

    In order: failed trajectories (rollout error, killed reward) are left out;
    :func:`advantages_for` (DAPO options) keeps the informative groups; the rows are
    padded to a multiple of ``algo.mini_batch_size`` with zero-advantage copies whose loss
    mask is zeroed (they contribute nothing); ``algo.turn_discount < 1`` spreads each
    advantage over the turns (``algos.credit``); ``rollout.mask_observations=False`` (the
    ablation) trains the observation tokens too, with the behaviour logprobs of
    ``model()`` (the policy before the step) when the step reads them. With
    ``algo.adv_estimator="gae"`` the batch carries ``rewards`` and zero ``advantages``
    (the step computes them with the critic). The rows go in the shared-prompt layout
    when :func:`shared_group_size` says so."""
    trajs = [t for t in trajs if not trajectory_failed(t)]
    adv, keep, m = advantages_for(rc, algo, trajs)
    m.update(
        signal_metrics(
            [t.reward or 0.0 for t in trajs],
            [t.group_id for t in trajs],
            [t.reward_info.get("acc", 0.0) for t in trajs],
            None if algo.uses_critic else (adv[keep] if keep.any() else []),
        )
    )
    if not keep.any():
        return None
    use = [t for t, k in zip(trajs, keep) if k]
    adv = adv[keep]
    pad = (-len(use)) % (algo.mini_batch_size or len(use))
    rows = use + use[:pad]
    n = shared_group_size(rc, algo, rows)
    arrays = batch_from_trajectories(
        rows,
        np.concatenate([adv, adv[:pad] * 0]),
        pad_id,
        rc.model.max_seq_len,
        PAD_MULTIPLE,
        group_size=n,
    )
    if algo.uses_critic:  # rewards in, advantages from the critic in the step
        arrays["rewards"] = arrays["advantages"]
        arrays["advantages"] = np.zeros_like(arrays["rewards"])
    elif algo.turn_discount < 1.0:
        # per-turn credit from the sampled tokens' turns (before the observation ablation
        # widens the mask; observation tokens take the weight of the turn before them)
        arrays["advantages"] = np.asarray(
            turn_discounted_advantages(
                jnp.asarray(arrays["advantages"]),
                jnp.asarray(arrays["loss_mask"]),
                algo.turn_discount,
            )
        )
    obs_trained = 0
    if not rc.rollout.mask_observations:
        # Observation tokens with the trainer's own logprobs as their behaviour logprobs
        # (the sampler never scored them), unless the step reads no behaviour logprobs:
        # then no extra forward pass (it cost ~80 s a step on SmolLM2).
        obs = observation_targets(rows, arrays["input_ids"].shape[1])
        if obs.any():
            lp = None
            if algo.reads_behaviour_logprobs:
                if model is None:
                    raise ValueError(
                        "make_batch: rollout.mask_observations=False needs the policy "
                        "(model=) for the observations' behaviour logprobs"
                    )
                ids, attn = arrays["input_ids"], arrays["attention_mask"]
                lp = np.asarray(
                    token_logprobs(
                        model(), ids, attn, shift_targets(ids), temperature=algo.temperature
                    )
                )
            arrays = include_observations(arrays, obs, lp)
            obs_trained = int(obs[: len(use)].sum())
    if pad:
        arrays["loss_mask"][len(use) :] = 0.0
    if not algo.uses_critic:
        m[names.BATCH_ADV_ABS_MEAN] = float(np.abs(adv).mean())
    m.update(
        {
            names.BATCH_SIZE: len(use),
            names.BATCH_SEQ_LEN: int(arrays["input_ids"].shape[1]),
            names.BATCH_OBS_TOKENS: obs_trained,
            names.BATCH_SHARED_PROMPT: float(n > 0),
        }
    )
    return RLBatch(arrays, use, m)
