"""Plugins by entry point: tools, tasks and rewards that installed packages provide.

A package declares what it provides as entry points in its ``pyproject.toml``::

    [project.entry-points."verltool_jax.tools"]
    letter_count = "vtj_letter_count.tool:LetterCountTool"

and each registry (the tool server's ``tool_server.registry``, ``verltool_jax.tasks``,
``verltool_jax.rewards``) asks :func:`discover` for its group when it first needs a name.
This module is the one discovery mechanism they share; it lives in the tool server's kit
because the tool server never imports ``verltool_jax`` (``verltool_jax`` may use the kit).

The rule, the same for every group: a problem with a name is recorded against that name
only. The problems are: two packages declare the name, the name is a built-in's, the
entry point fails to import, or it loads something of the wrong kind. Using that name
raises :class:`PluginError` naming the package, the entry point and the fix; the
listings show the problem; every other name (built-in or plugin) works as before. So a
broken tool plugin never takes the tool server down for the other tools.

Entry points are read with :func:`importlib.metadata.entry_points`, so a package counts
as installed when its ``*.dist-info`` folder is on ``sys.path`` (a venv, ``pip install
--user``, or ``pip install -t DIR`` with ``DIR`` on ``PYTHONPATH``). An entry point is
imported only when its name is used or listed.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("tool_server.plugins")

BUILTIN = "built-in"  # the source of a name that ships with verltool-jax


class PluginError(ValueError):
    """A plugin name that cannot be used: a clash, a failed import or a wrong object.
    The message names the package and the entry point. A ``ValueError`` so that config
    validation reports it with the other problems of a config."""


@dataclass(frozen=True)
class Plugin:
    """One entry point of one installed package."""

    group: str  # e.g. "verltool_jax.tools"
    name: str  # the entry point's name: the tool / task / reward name
    value: str  # "module:attr" or "module"
    package: str  # the distribution's name, as pip knows it
    version: str

    @property
    def source(self) -> str:
        """``"package NAME VERSION"``: what the listings print as the name's source."""
        return f"package {self.package} {self.version}".rstrip()

    def describe(self) -> str:
        return f"entry point {self.name} = {self.value!r} of package {self.package!r}"


# check(name, loaded_object) -> None if the object is the right kind, else what is wrong
Check = Callable[[str, object], "str | None"]


@dataclass
class PluginGroup:
    """The plugins of one entry-point group, as found at discovery.

    ``plugins``: the usable names (no clash yet found); ``problems``: name -> message for
    the names that cannot be used (filled at discovery for clashes, at load for failed
    imports and wrong objects); ``claimants``: every package that declared each name."""

    group: str
    kind: str  # "tool", "task", "reward": used in messages
    check: Check
    plugins: dict[str, Plugin] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    claimants: dict[str, list[Plugin]] = field(default_factory=dict)
    _entry_points: dict[str, importlib.metadata.EntryPoint] = field(default_factory=dict)
    _loaded: dict[str, object] = field(default_factory=dict)

    def names(self) -> list[str]:
        """Every name some package declares (usable or not), sorted."""
        return sorted(self.claimants)

    def source(self, name: str) -> str:
        """Where ``name`` comes from, for the listings (all claimants on a clash)."""
        return ", ".join(p.source for p in self.claimants.get(name, ()))

    def load(self, name: str) -> object:
        """The object entry point ``name`` points at (imported once, then cached).

        :class:`PluginError` for a name with a problem (recorded, so later calls fail
        the same way without importing again); ``KeyError`` for a name no package has."""
        if name in self.problems:
            raise PluginError(self.problems[name])
        if name in self._loaded:
            return self._loaded[name]
        plugin = self.plugins[name]  # KeyError: not a plugin name
        try:
            obj = self._entry_points[name].load()
        except Exception as e:  # any import-time failure of third-party code
            return self._fail(
                name,
                f"{self.kind} plugin {name!r} failed to import: {plugin.describe()} raised "
                f"{type(e).__name__}: {e}. Fix or upgrade the package, or uninstall it "
                f"(pip uninstall {plugin.package})",
            )
        wrong = self.check(name, obj)
        if wrong:
            return self._fail(
                name,
                f"{self.kind} plugin {name!r} is not usable: {plugin.describe()} {wrong}. "
                f"Report it to the package's authors, or uninstall it "
                f"(pip uninstall {plugin.package})",
            )
        self._loaded[name] = obj
        return obj

    def load_all(self) -> dict[str, object]:
        """Every usable plugin, loaded; those that fail are logged (a warning naming the
        package) and left out, their problem recorded for :meth:`load` and the listings."""
        out = {}
        for name in sorted(self.plugins):
            try:
                out[name] = self.load(name)
            except PluginError as e:
                log.warning("%s", e)
        for name in sorted(set(self.problems) - set(self.plugins)):
            log.warning("%s", self.problems[name])
        return out

    def _fail(self, name: str, message: str) -> object:
        self.problems[name] = message
        raise PluginError(message)


def discover(group: str, kind: str, builtin_names: Iterable[str], check: Check) -> PluginGroup:
    """The entry points of ``group`` in every installed package.

    A name declared by two packages, or equal to one of ``builtin_names``, goes into
    ``problems`` with a message naming every package and entry point involved (nothing is
    imported here). The same distribution found twice on ``sys.path`` counts once."""
    found = PluginGroup(group=group, kind=kind, check=check)
    seen: set[tuple[str, str, str]] = set()
    for ep in importlib.metadata.entry_points(group=group):
        dist = ep.dist
        package = dist.metadata["Name"] if dist is not None else "<unknown package>"
        version = dist.version if dist is not None else ""
        key = (package.lower().replace("_", "-"), ep.name, ep.value)
        if key in seen:
            continue
        seen.add(key)
        plugin = Plugin(group, ep.name, ep.value, package, version)
        found.claimants.setdefault(ep.name, []).append(plugin)
        found._entry_points.setdefault(ep.name, ep)
    builtin = set(builtin_names)
    for name, claimants in found.claimants.items():
        claimants.sort(key=lambda p: p.package.lower())  # messages in a stable order
        if name in builtin:
            found.problems[name] = (
                f"{kind} name {name!r} is both built in and declared by "
                + "; ".join(p.describe() for p in claimants)
                + f" (group {group}). Rename the plugin's entry point, or uninstall "
                + ", ".join(p.package for p in claimants)
            )
        elif len(claimants) > 1:
            found.problems[name] = (
                f"{kind} name {name!r} is declared by more than one package: "
                + "; ".join(p.describe() for p in claimants)
                + f" (group {group}). Uninstall all but one of them"
            )
        else:
            found.plugins[name] = claimants[0]
    return found
