"""The plugin registry: controllers are found through the `pykcm.controllers` entry-point group,
built-ins and third-party alike.

Each entry point is loaded on its own: one plugin that fails to import (an API it used moved in
an upgrade) is an error only for a run that would enable it, and a warning for any other run."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pykcm.controller.base import Controller
from pykcm.util.errors import described_with_type
from pykcm.util.log import get_logger

ENTRY_POINT_GROUP = "pykcm.controllers"

log = get_logger("controller")


class PluginError(Exception):
    pass


@dataclass(frozen=True)
class BrokenPlugin:
    """An entry point that does not give a usable controller class."""

    entry_point: str  # its name, as --controllers may name it
    distribution: str  # the installed package that declares it
    reason: str  # one line: what is wrong with it
    plugin: str  # the entry point described, as every registry error names it

    @property
    def error(self) -> str:
        return f"{self.plugin} {self.reason}"


@dataclass(frozen=True)
class Plugins:
    controllers: dict[str, type[Controller]]  # controller name -> class
    broken: tuple[BrokenPlugin, ...]


def find_controllers() -> Plugins:
    """Every entry point of the group, each loaded on its own: the controllers and the broken ones.
    Two plugins claiming one name or alias are an error here: which one a name means would depend
    on the order the packages were installed in."""
    found: dict[str, type[Controller]] = {}
    described: dict[str, str] = {}  # controller name -> the plugin that registered it
    owners: dict[str, str] = {}  # every name and alias -> the controller it names
    broken: list[BrokenPlugin] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        plugin = _plugin(ep)
        cls, reason = _load(ep)
        if cls is None:
            broken.append(BrokenPlugin(ep.name, _distribution(ep), reason, plugin))
            continue
        name = cls.name
        if found.get(name, cls) is not cls:
            raise PluginError(f"{plugin} registers controller {name!r}, already registered by {described[name]}")
        # An alias taken twice would let install order decide which controller --controllers means.
        for word in (name, *cls.aliases):
            if owners.setdefault(word, name) != name:
                other = owners[word]
                raise PluginError(f"{plugin}: {word!r} already names controller {other!r} of {described[other]}")
        found[name] = cls
        described.setdefault(name, plugin)
    return Plugins(found, tuple(broken))


def discover_controllers() -> dict[str, type[Controller]]:
    """Every controller class registered under the `pykcm.controllers` entry-point group; the first
    broken plugin is an error (for documentation and tests, which need them all)."""
    plugins = find_controllers()
    if plugins.broken:
        raise PluginError(plugins.broken[0].error)
    return plugins.controllers


def controllers_for(spec: Iterable[str]) -> tuple[dict[str, type[Controller]], list[str]]:
    """The controllers a run with `--controllers spec` chooses from, and `spec` without the entries
    naming a broken plugin (`-name` turned it off; unknown, it would fail --controllers' check). A
    broken plugin the run would enable is an error; any other is logged once and left out."""
    entries = list(spec)
    plugins = find_controllers()
    for bad in plugins.broken:
        if _would_enable(bad.entry_point, entries):
            raise PluginError(bad.error)
    for bad in plugins.broken:
        log.warning("Skipping a controller plugin that failed to load", entryPoint=bad.entry_point,
                    distribution=bad.distribution, err=bad.reason)
    broken = {bad.entry_point for bad in plugins.broken}
    return plugins.controllers, [entry for entry in entries if entry.removeprefix("-") not in broken]


def _would_enable(entry_point: str, entries: list[str]) -> bool:
    """As resolve_controllers reads --controllers, the first entry naming it wins. Whether a broken
    plugin is on by default is unknown, so `*` counts as enabling it; its aliases are unknown too."""
    for entry in entries:
        if entry.removeprefix("-") == entry_point:
            return not entry.startswith("-")
    return "*" in entries


def _load(ep: Any) -> tuple[type[Controller] | None, str]:
    """The entry point's controller class, or None and why it is not one."""
    try:
        cls = ep.load()
    except Exception as err:
        return None, f"failed to load: {described_with_type(err)}"
    if not (isinstance(cls, type) and issubclass(cls, Controller)):
        return None, "is not a pykcm.controller.Controller"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        return None, "has no controller name (the class attribute `name`)"
    if cls.sync is Controller.sync:  # caught here, not when the manager builds it after winning the Lease
        return None, f"has no sync(key) method: {cls.__qualname__} must define `async def sync(self, key)`"
    return cls, ""


def _plugin(ep: Any) -> str:
    dist = _distribution(ep)
    return f"controller plugin {ep.name!r} ({ep.value}{f' in {dist}' if dist else ''})"


def _distribution(ep: Any) -> str:
    """The package that declares the entry point: what to upgrade or uninstall."""
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", "") or "") if dist is not None else ""
