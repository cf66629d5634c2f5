"""Health checks and the /healthz, /livez, /readyz responses, as k8s.io/apiserver's healthz package.

A check is a name and a function returning None (healthy) or a reason. The reason goes to the
log only: the endpoints are open to anonymous callers, so they say `reason withheld`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pykcm.util.log import get_logger

if TYPE_CHECKING:
    from pykcm.controller import Controller

log = get_logger("healthz")

# A controller is reported stuck when one sync has run this long (namespace deletions requeue
# rather than block, so even they stay far below it)...
STUCK_SYNC_AFTER = 10 * 60.0
# ...or when keys wait in its queue but no worker has finished anything for this long.
NO_PROGRESS_AFTER = 5 * 60.0


@dataclass(frozen=True)
class HealthCheck:
    name: str
    check: Callable[[], str | None]


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


def controller_check(controller: Controller, clock: Callable[[], float] = time.monotonic) -> HealthCheck:
    """The per-controller check, named by the controller's canonical name.

    KCM's checks here are plain pings; pykcm also reports a controller whose workers are wedged.
    """
    def check() -> str | None:
        return stuck_reason(
            clock(),
            controller.queue.processing_start_times(),
            queued=len(controller.queue),
            last_progress=controller.last_progress,
        )

    return HealthCheck(controller.name, check)


def stuck_reason(now: float, sync_starts: Sequence[float], queued: int, last_progress: float) -> str | None:
    """Why a controller looks stuck, or None: a sync running too long, or queued keys but no progress."""
    if sync_starts and now - min(sync_starts) > STUCK_SYNC_AFTER:
        return f"a sync has been running for {now - min(sync_starts):.0f}s"
    if queued and now - last_progress > NO_PROGRESS_AFTER:
        return f"{queued} keys queued but no sync finished for {now - last_progress:.0f}s"
    return None
