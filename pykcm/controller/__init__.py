"""Controllers and what they share: the contract with the runtime and the plugin registry, and
KCM's controller helpers (``pkg/controller``): expectations, controller references, pod control,
pod and selector utilities, the stale-cache check.

A controller plugin needs only what this package exports: ``Controller``, ``ControllerContext``,
``RequeueAfter``, and, to declare its own log lines, ``LogLines``, ``Line``, ``handle_error`` and
the ``KEY`` slot.
"""

from pykcm.controller.base import KEY, Controller, ControllerContext, Line, LogLines, RequeueAfter, handle_error
from pykcm.controller.registry import (
    ENTRY_POINT_GROUP,
    BrokenPlugin,
    PluginError,
    Plugins,
    controllers_for,
    discover_controllers,
    find_controllers,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "KEY",
    "BrokenPlugin",
    "Controller",
    "ControllerContext",
    "Line",
    "LogLines",
    "PluginError",
    "Plugins",
    "RequeueAfter",
    "controllers_for",
    "discover_controllers",
    "find_controllers",
    "handle_error",
]
