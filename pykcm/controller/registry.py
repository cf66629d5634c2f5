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
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as err:
            raise PluginError(f"controller plugin {ep.name!r} ({ep.value}) failed to load: {err}") from None
        if not (isinstance(cls, type) and issubclass(cls, Controller)):
            raise PluginError(f"controller plugin {ep.name!r} ({ep.value}) is not a pykcm.controller.Controller")
        if cls.name in found and found[cls.name] is not cls:
            raise PluginError(f"two plugins register controller {cls.name!r}")
        found[cls.name] = cls
    return found
