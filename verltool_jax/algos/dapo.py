"""DAPO helpers: dynamic sampling and the overlong-response penalty (host side, numpy).

* Dynamic sampling: a group whose rewards are all equal has zero advantage for every
  sample (no learning signal), so it is dropped; the trainer keeps sampling until it
  has enough informative groups.
* Overlong penalty (soft length punishment), for a response of L tokens with maximum
  L_max and buffer L_cache:
      0                                       if L <= L_max - L_cache
      (L_max - L_cache - L) / L_cache * f     if L_max - L_cache < L <= L_max
      -f                                      if L > L_max
  (f = ``penalty_factor``), added to the task reward.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def informative_groups(
    rewards: Sequence[float] | np.ndarray, group_ids: Sequence[Hashable], atol: float = 0.0
) -> np.ndarray:
    """Boolean keep-mask [N]: True for samples whose group's rewards are not all equal.

    Groups of one sample are dropped too (no baseline). ``atol``: rewards within it of
    the group's first reward count as equal.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 1 or len(rewards) != len(group_ids):
        raise ValueError(
            f"rewards must be 1-D with one entry per group id; got shape "
            f"{rewards.shape} and {len(group_ids)} group ids"
        )
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    keep = np.zeros(len(rewards), dtype=bool)
    for idx in members.values():
        r = rewards[idx]
        if len(idx) > 1 and np.any(np.abs(r - r[0]) > atol):
            keep[idx] = True
    return keep


def overlong_penalty(
    response_lengths: Sequence[int] | np.ndarray,
    max_length: int,
    cache_length: int,
    penalty_factor: float = 1.0,
) -> np.ndarray:
    """The DAPO soft overlong penalty (module docstring) per response, float32 [N], <= 0."""
    if cache_length <= 0 or cache_length > max_length:
        raise ValueError(
            f"algo.overlong_buffer_len must be in (0, max_response_length="
            f"{max_length}], got {cache_length}"
        )
    if penalty_factor < 0:
        raise ValueError(f"algo.overlong_penalty_factor must be >= 0, got {penalty_factor}")
    L = np.asarray(response_lengths, dtype=np.float64)
    start = max_length - cache_length
    ramp = (start - L) / cache_length * penalty_factor
    out = np.where(L <= start, 0.0, np.where(L <= max_length, ramp, -penalty_factor))
    return out.astype(np.float32)
