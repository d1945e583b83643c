"""The wire protocol (VerlTool-compatible): request validation and the response shape.

Request (``POST /get_observation``)::

    {"trajectory_ids": [str, ...], "actions": [str, ...],
     "extra_fields": [{...} | null, ...]?, "finish": [bool, ...]?, "is_last_step": [bool, ...]?}

Response: ``{"observations": [...], "dones": [bool, ...], "valids": [bool, ...]}``, same
length and order as the request.

An entry of ``extra_fields`` may carry :data:`RESUMED_FIELD` (our trainer's, on the first
call of a trajectory resumed from a checkpoint): ``{"tool_calls": n, "actions": [the n
earlier actions]}``; the server then checks the trajectory's tool state
(``Dispatcher.step``) and the tools never see the key. A bad request raises :class:`ProtocolError` whose
message names the field and the fix; the server answers it with HTTP 400/422.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tool_server.kit.base import Observation

RESUMED_FIELD = "verltool_resumed"


def check_resumed(value: Any, index: int) -> None:
    """Raise :class:`ProtocolError` unless ``value`` (``extra_fields[index][RESUMED_FIELD]``)
    is ``{"tool_calls": n >= 0, "actions": [n strings]}``."""
    n = value.get("tool_calls") if isinstance(value, dict) else None
    actions = value.get("actions") if isinstance(value, dict) else None
    if (
        isinstance(n, bool)
        or not isinstance(n, int)
        or n < 0
        or not isinstance(actions, list)
        or len(actions) != n
        or not all(isinstance(a, str) for a in actions)
    ):
        raise ProtocolError(
            f"extra_fields[{index}].{RESUMED_FIELD} must be {{'tool_calls': n, 'actions': "
            f"[n earlier action strings]}}, got {str(value)[:200]}",
            field="extra_fields",
        )


class ProtocolError(ValueError):
    """A malformed request. ``status`` is the HTTP status (400 bad JSON, 422 bad fields)."""

    def __init__(self, message: str, status: int = 422, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


@dataclass
class ObservationRequest:
    """A validated request: parallel lists of equal length ``n``."""

    trajectory_ids: list[str]
    actions: list[str]
    extra_fields: list[dict]
    finish: list[bool]
    is_last_step: list[bool]

    def __len__(self) -> int:
        return len(self.trajectory_ids)


def _list_field(body: dict, name: str) -> list | None:
    """The list ``body[name]``; None when it is absent or null."""
    if name not in body or body[name] is None:
        return None
    value = body[name]
    if not isinstance(value, list):
        raise ProtocolError(
            f"field '{name}' must be a list, got {type(value).__name__}", field=name
        )
    return value


def _required_list_field(body: dict, name: str) -> list:
    value = _list_field(body, name)
    if value is None:
        raise ProtocolError(
            f"missing field '{name}': send a list with one entry per trajectory", field=name
        )
    return value


def parse_request(body: Any, max_batch: int | None = None) -> ObservationRequest:
    """Validate a decoded JSON body into an :class:`ObservationRequest`.

    Trajectory ids (at least one, as VerlTool's server requires) may be strings or
    integers (turned into strings); actions must be strings; ``extra_fields`` entries
    objects or null; ``finish``/``is_last_step`` booleans (0/1 accepted). Optional lists
    default to ``{}``/``False``. More than ``max_batch`` actions is a 422 naming the limit.
    """
    if not isinstance(body, dict):
        raise ProtocolError(
            f"the request body must be a JSON object, got {type(body).__name__}", status=400
        )
    tids = _required_list_field(body, "trajectory_ids")
    actions = _required_list_field(body, "actions")
    n = len(tids)
    if n == 0:
        raise ProtocolError(
            "field 'trajectory_ids' is empty: send at least one trajectory "
            "id (and one action per id)",
            field="trajectory_ids",
        )
    if max_batch is not None and n > max_batch:
        raise ProtocolError(
            f"the request has {n} actions, over this server's limit of "
            f"{max_batch} per request (--max-batch); split it into smaller "
            "requests",
            field="trajectory_ids",
        )
    out_tids = []
    for i, t in enumerate(tids):
        if isinstance(t, bool) or not isinstance(t, (str, int)):
            raise ProtocolError(
                f"trajectory_ids[{i}] must be a string, got {type(t).__name__}",
                field="trajectory_ids",
            )
        out_tids.append(str(t))
    if len(actions) != n:
        raise ProtocolError(
            f"field 'actions' has {len(actions)} entries but 'trajectory_ids' "
            f"has {n}; send one action per trajectory id",
            field="actions",
        )
    for i, a in enumerate(actions):
        if not isinstance(a, str):
            raise ProtocolError(
                f"actions[{i}] must be a string, got {type(a).__name__}", field="actions"
            )
    extra = _list_field(body, "extra_fields")
    if extra is None:
        extra = [{} for _ in range(n)]
    else:
        if len(extra) != n:
            raise ProtocolError(
                f"field 'extra_fields' has {len(extra)} entries but 'trajectory_ids' has {n}",
                field="extra_fields",
            )
        for i, e in enumerate(extra):
            if e is None:
                extra[i] = {}
            elif not isinstance(e, dict):
                raise ProtocolError(
                    f"extra_fields[{i}] must be an object or null, got {type(e).__name__}",
                    field="extra_fields",
                )
            elif RESUMED_FIELD in e:
                check_resumed(e[RESUMED_FIELD], i)
    flags = {}
    for name in ("finish", "is_last_step"):
        values = _list_field(body, name)
        if values is None:
            flags[name] = [False] * n
            continue
        if len(values) != n:
            raise ProtocolError(
                f"field '{name}' has {len(values)} entries but 'trajectory_ids' has {n}", field=name
            )
        for i, v in enumerate(values):
            if not (isinstance(v, bool) or v in (0, 1)) or v is None:
                raise ProtocolError(f"{name}[{i}] must be true or false, got {v!r}", field=name)
        flags[name] = [bool(v) for v in values]
    return ObservationRequest(
        out_tids, list(actions), extra, flags["finish"], flags["is_last_step"]
    )


def make_response(observations: list[Observation], dones: list[bool], valids: list[bool]) -> dict:
    """The response object: three parallel lists."""
    return {"observations": observations, "dones": dones, "valids": valids}
