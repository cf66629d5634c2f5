"""Command-line values turned into validated options: Go durations, the --controllers list."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class OptionsError(ValueError):
    """A flag value the user must fix; the message is one line."""


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration: `15s`, `5m`, `1h30m`, `-1.5h`, `0`; returns seconds."""
    value = text.strip()
    sign = 1.0
    if value[:1] in "+-" and value:
        sign = -1.0 if value[0] == "-" else 1.0
        value = value[1:]
    if value == "0":
        return 0.0
    if not value:
        raise OptionsError(f"invalid duration {text!r}")
    total, pos = 0.0, 0
    for match in _DURATION_PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(value):
        raise OptionsError(f"invalid duration {text!r} (use Go syntax such as 15s, 5m, 1h30m)")
    return sign * total


def format_duration(seconds: float) -> str:
    """The inverse, for help texts and logs: 300 -> `5m0s`, 43200 -> `12h0m0s`."""
    whole = int(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


@dataclass(frozen=True)
class ControllerInfo:
    """What the --controllers parser needs to know about one registered controller."""

    name: str
    aliases: tuple[str, ...] = ()
    enabled_by_default: bool = True


def resolve_controllers(spec: Iterable[str], known: Iterable[ControllerInfo]) -> list[str]:
    """Evaluate KCM's --controllers list: per controller the first matching entry wins.

    `name` enables, `-name` disables, `*` means "on if on by default". Aliases are accepted;
    unknown names are an error. Returns canonical names in registration order.
    """
    controllers = list(known)
    canonical: dict[str, str] = {}
    for info in controllers:
        for alias in (info.name, *info.aliases):
            canonical[alias] = info.name
    entries = [e.strip() for e in spec if e.strip()]
    for entry in entries:
        name = entry.removeprefix("-")
        if name != "*" and name not in canonical:
            raise OptionsError(f'"{name}" is not in the list of known controllers: {", ".join(sorted(canonical))}')
        if entry == "-*":
            raise OptionsError('"-*" is not allowed in --controllers')
    enabled = []
    for info in controllers:
        for entry in entries:
            name = entry.removeprefix("-")
            if name == "*":
                if info.enabled_by_default:
                    enabled.append(info.name)
                break
            if canonical[name] == info.name:
                if not entry.startswith("-"):
                    enabled.append(info.name)
                break
    return enabled


@dataclass
class Options:
    kubeconfig: str | None = None
    master: str | None = None
    controllers: list[str] = field(default_factory=lambda: ["*"])
    concurrent_replicaset_syncs: int = 5
    concurrent_namespace_syncs: int = 10
    namespace_sync_period: float = 300.0
    kube_api_qps: float = 20.0
    kube_api_burst: int = 30
    min_resync_period: float = 12 * 3600.0
    local: bool = False

    def validate(self) -> None:
        for name in ("concurrent_replicaset_syncs", "concurrent_namespace_syncs", "kube_api_burst"):
            if getattr(self, name) < 1:
                raise OptionsError(f"--{name.replace('_', '-')} must be at least 1")
        if self.kube_api_qps <= 0:
            raise OptionsError("--kube-api-qps must be greater than 0")
        if self.namespace_sync_period <= 0 or self.min_resync_period < 0:
            raise OptionsError("--namespace-sync-period must be positive and --min-resync-period not negative")
        if self.local and (self.kubeconfig or self.master):
            raise OptionsError("--local starts its own control plane; do not combine it with --kubeconfig/--master")

