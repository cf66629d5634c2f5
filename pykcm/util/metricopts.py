"""What component-base's metric options add to a Prometheus definition, for pykcm's families that
KCM also has: the stability level at the head of the HELP, and Go's bucket helper.

component-base (metrics/opts.go, annotateStabilityLevel) registers every family with its HELP as
`[LEVEL] text`, the level taken from the definition; Prometheus' metadata API and Grafana's metric
browser show it, and it tells a user whether a family may change. pykcm's own families (`pykcm_*`,
and prometheus_client's `process_*` and `python_*` on /metrics, as Go's own collectors there) have
no level and no prefix.
"""

from __future__ import annotations

from typing import Literal

Stability = Literal["ALPHA", "BETA", "STABLE"]
ALPHA: Stability = "ALPHA"
BETA: Stability = "BETA"
STABLE: Stability = "STABLE"


def kcm_help(level: Stability, text: str) -> str:
    """A family's HELP as KCM prints it: its Go definition's level, then its Help."""
    return f"[{level}] {text}"


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """Prometheus Go client's ExponentialBuckets, by repeated multiplication as it does: the same
    floats to the last bit (9.999999999999999e-06, not 1e-05), so the `le` labels match KCM's."""
    buckets = []
    for _ in range(count):
        buckets.append(start)
        start *= factor
    return tuple(buckets)
