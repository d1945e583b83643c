"""Retries with exponential backoff."""

from __future__ import annotations


def backoff_delay(
    attempt: int, base_s: float, cap_s: float = 30.0, retry_after_s: float | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (0 for the first retry).

    ``delay = min(cap_s, max(base_s * 2**attempt, retry_after_s or 0))``: doubling from
    ``base_s``, never shorter than a server's ``Retry-After``, never longer than ``cap_s``.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    delay = base_s * (2.0**attempt)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    return min(cap_s, delay)


def is_retryable_status(status: int) -> bool:
    """429 (rate limited) and 5xx (server errors) are worth retrying; other codes are not."""
    return status == 429 or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header given in seconds (HTTP dates are ignored)."""
    if not value:
        return None
    try:
        secs = float(value)
    except ValueError:
        return None
    return secs if secs >= 0 else None
