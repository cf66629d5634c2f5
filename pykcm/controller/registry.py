"""The plugin registry: controllers are found through the `pykcm.controllers` entry-point group,
built-ins and third-party alike."""

from __future__ import annotations

from importlib.metadata import entry_points

from pykcm.controller.base import Controller

ENTRY_POINT_GROUP = "pykcm.controllers"


class PluginError(Exception):
    pass


def discover_controllers() -> dict[str, type[Controller]]:
    """Every controller class registered under the `pykcm.controllers` entry-point group."""
    found: dict[str, type[Controller]] = {}
    owners: dict[str, str] = {}  # every name and alias -> the controller it names
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        plugin = f"controller plugin {ep.name!r} ({ep.value})"
        try:
            cls = ep.load()
        except Exception as err:
            raise PluginError(f"{plugin} failed to load: {err}") from None
        if not (isinstance(cls, type) and issubclass(cls, Controller)):
            raise PluginError(f"{plugin} is not a pykcm.controller.Controller")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"{plugin} has no controller name (the class attribute `name`)")
        if found.get(name, cls) is not cls:
            raise PluginError(f"two plugins register controller {name!r}")
        # An alias taken twice would let install order decide which controller --controllers means.
        for word in (name, *cls.aliases):
            if owners.setdefault(word, name) != name:
                raise PluginError(f"{plugin}: {word!r} already names controller {owners[word]!r}")
        found[name] = cls
    return found
