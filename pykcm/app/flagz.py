"""The flags of `pykcm run` with their values as pflag prints them, for /flagz (pykcm/serving/zpages.py)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

from pykcm.app import featuregates
from pykcm.util.durations import go_duration, parse_duration

# pflag's StringSlice flags print as [a,b]; its durations as Go's Duration.String().
LIST_FLAGS = frozenset({"controllers", "authorization-always-allow-paths", "tls-cipher-suites"})
DURATION_FLAGS = frozenset({
    "namespace-sync-period", "min-resync-period", "controller-shutdown-timeout", "leader-elect-lease-duration",
    "leader-elect-renew-deadline", "leader-elect-retry-period",
})


def flag_values(params: Iterable[Any], values: Mapping[str, Any]) -> dict[str, str]:
    """Every option of a click command (`ctx.command.params`), by its long name without dashes, and
    its value in `values` (`ctx.params`): defaults included, as KCM lists them."""
    flags: dict[str, str] = {}
    for param in params:
        # Typer may vendor click: no isinstance. A hidden option is a spelling of another (--version=raw).
        if getattr(param, "param_type_name", "") == "option" and not getattr(param, "hidden", False):
            name = max(param.opts, key=len).lstrip("-")
            flags[name] = pflag_text(name, values.get(param.name))
    return flags


def pflag_text(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"  # a float32 as pflag prints it: 20, 0.5
    text = value.value if isinstance(value, enum.Enum) else str(value)
    if name in LIST_FLAGS:
        return "[" + ",".join(part.strip() for part in text.split(",") if part.strip()) + "]"
    if name in DURATION_FLAGS:
        return go_duration(parse_duration(text))  # already validated by the command
    if name == "feature-gates":
        return featuregates.flag_text(text)  # component-base's colonSeparatedMultimapStringString
    return text
