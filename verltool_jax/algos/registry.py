"""A name -> function table, so configs select algorithms by string.

One mechanism shared by the advantage, policy-loss, KL and aggregation tables:
``reg = Registry("advantage estimator"); @reg.register("grpo") def ...; reg.get("grpo")``.
An unknown name raises ``ValueError`` naming the kind, the bad name and the choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions registered under one or more names (aliases allowed)."""

    def __init__(self, kind: str, config_field: str = ""):
        self.kind = kind
        self.config_field = config_field
        self._table: dict[str, F] = {}

    def register(self, *names: str) -> Callable[[F], F]:
        """Decorator registering ``fn`` under every name in ``names``."""

        def deco(fn: F) -> F:
            for name in names:
                if name in self._table:
                    raise ValueError(f"{self.kind} {name!r} is registered twice")
                self._table[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        """The function registered as ``name``; ValueError listing the choices if none."""
        try:
            return self._table[name]
        except (KeyError, TypeError):
            where = f" (config field {self.config_field})" if self.config_field else ""
            raise ValueError(
                f"unknown {self.kind} {name!r}{where}; choose one of {sorted(self._table)}"
            ) from None

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plugin whose package is gone; no error if absent)."""
        self._table.pop(name, None)

    def names(self) -> Iterable[str]:
        return sorted(self._table)

    def __contains__(self, name: str) -> bool:
        return name in self._table
