"""Controllers and what they share: the contract with the runtime and the plugin registry, and
KCM's controller helpers (``pkg/controller``): expectations, controller references, pod control,
pod and selector utilities, the stale-cache check.

A controller plugin needs only what this package exports: ``Controller``, ``ControllerContext``,
``RequeueAfter``, and, to declare its own log lines, ``LogLines``, ``Line``, ``handle_error`` and
the ``KEY`` slot.
"""

from pykcm.controller.base import KEY, Controller, ControllerContext, Line, LogLines, RequeueAfter, handle_error
from pykcm.controller.registry import ENTRY_POINT_GROUP, PluginError, discover_controllers

__all__ = [
    "ENTRY_POINT_GROUP",
    "KEY",
    "Controller",
    "ControllerContext",
    "Line",
    "LogLines",
    "PluginError",
    "RequeueAfter",
    "discover_controllers",
    "handle_error",
]
