"""Health checks and the /healthz, /livez, /readyz responses, as k8s.io/apiserver's healthz package.

A check is a name and a function returning None (healthy) or a reason. The reason goes to the
log only: the endpoints are open to anonymous callers, so they say `reason withheld`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

from pykcm.util.log import get_logger
from pykcm.util.metricopts import ALPHA, STABLE, kcm_help
from pykcm.util.process import process_start_time

log = get_logger("healthz")
disable_created_metrics()

# /metrics/slis: component-base's SLI registry, served apart from /metrics, with what every
# aggregated health endpoint's checks returned (their STABLE families, and the start time, which
# component-base registers there as its own ALPHA family where /metrics has Go's, unprefixed).
SLI_REGISTRY = CollectorRegistry()
healthcheck = Gauge(
    "kubernetes_healthcheck", kcm_help(STABLE, "This metric records the result of a single healthcheck."),
    ["name", "type"], registry=SLI_REGISTRY,
)
healthchecks_total = Counter(
    "kubernetes_healthchecks_total", kcm_help(STABLE, "This metric records the results of all healthcheck."),
    ["name", "type", "status"], registry=SLI_REGISTRY,
)
Gauge("process_start_time_seconds", kcm_help(ALPHA, "Start time of the process since unix epoch in seconds."),
      registry=SLI_REGISTRY).set(process_start_time())


def reset_slis() -> None:
    """DELETE /metrics/slis, as KCM's handler with reset."""
    healthcheck.clear()
    healthchecks_total.clear()

LIVEZ, HEALTHZ, READYZ = "livez", "healthz", "readyz"
ENDPOINTS = frozenset({LIVEZ, HEALTHZ, READYZ})


@dataclass(frozen=True)
class HealthCheck:
    name: str
    check: Callable[[], str | None]
    endpoints: frozenset[str] = ENDPOINTS  # where it is reported


def checks_for(endpoint: str, checks: Iterable[HealthCheck]) -> list[HealthCheck]:
    return [c for c in checks if endpoint in c.endpoints]


PING = HealthCheck("ping", lambda: None)


@dataclass(frozen=True)
class HealthResponse:
    status: int
    body: str


def evaluate(endpoint: str, checks: Sequence[HealthCheck], exclude: Iterable[str], verbose: bool) -> HealthResponse:
    """Run `checks` for `/<endpoint>`; the output format is the apiserver healthz handler's.

    Success prints `ok` (or, verbose, one `[+]name ok` line per check and `<endpoint> check
    passed`); any failure is HTTP 500 and always verbose.
    """
    checks = checks or [PING]  # as InstallPathHandler does when nothing is registered
    excluded = set(exclude)
    lines: list[str] = []
    failed: list[str] = []
    for check in checks:
        if check.name in excluded:
            excluded.discard(check.name)
            lines.append(f"[+]{check.name} excluded: ok")
            continue
        reason = run_check(check)
        healthcheck.labels(check.name, endpoint).set(reason is None)
        healthchecks_total.labels(check.name, endpoint, "success" if reason is None else "error").inc()
        if reason is None:
            lines.append(f"[+]{check.name} ok")
        else:
            lines.append(f"[-]{check.name} failed: reason withheld")
            failed.append(check.name)
            log.v(2).info("Health check failed", endpoint=endpoint, check=check.name, reason=reason)
    if excluded:
        names = ",".join(f'"{name}"' for name in sorted(excluded))
        lines.append(f"warn: some health checks cannot be excluded: no matches for {names}")
    if failed:
        return HealthResponse(500, "\n".join(lines) + f"\n{endpoint} check failed\n")
    if not verbose:
        return HealthResponse(200, "ok")
    return HealthResponse(200, "\n".join(lines) + f"\n{endpoint} check passed\n")


def run_check(check: HealthCheck) -> str | None:
    try:
        return check.check()
    except Exception as err:  # a broken check is a failed check, never a broken endpoint
        return f"check raised {type(err).__name__}: {err}"


def controller_checks(
    name: str, cannot_start: Callable[[], str | None], stuck: Callable[[], str | None]
) -> list[HealthCheck]:
    """One check per endpoint for a controller, named by its canonical name.

    /livez is what a liveness probe should restart on, and is KCM's /healthz: a ping per
    controller (with leader election beside it). /healthz adds a controller that cannot start
    (its informers fail to sync). /readyz adds a controller that looks stuck.
    """
    return [
        HealthCheck(name, lambda: None, frozenset({LIVEZ})),
        HealthCheck(name, cannot_start, frozenset({HEALTHZ})),
        HealthCheck(name, lambda: cannot_start() or stuck(), frozenset({READYZ})),
    ]
