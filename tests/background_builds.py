"""Builds a test session starts at once, in background threads at the lowest CPU priority, for
the tests marked `late("<build>")`: those run last in their group (tests/conftest.py), and
meanwhile each build uses the cycles the other tests leave idle while they wait on clusters. A
late test calls the same build itself and waits for the one under way (every build step holds a
lock) or, if the background one failed, builds in the foreground and reports the error there.

- `dashboard-linter`: Grafana's linter (tests/dashboard_linter.py), 9 to 16 minutes cold.
- `e2e-test`: the upstream e2e.test binary, 5 to 9 minutes cold.
- `kind-node-image`: what the kind node image is assembled from (the Debian root, CoreDNS,
  kubeadm and the other Go builds, kind itself), 10 to 20 minutes cold on 2 busy cores; the
  assembly itself needs the kind engine, so the first kind test does it (under a minute).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pykcm.testenv.e2e import E2E_BINARY, e2e_cache_dir, ensure_e2e_test
from pykcm.testenv.errors import BuildError
from pykcm.testenv.gobuild import cache_dir, find_go, go_install_path, is_executable
from pykcm.testenv.kind import nodeimage
from pykcm.testenv.progress import Log
from tests.dashboard_linter import LINTER_GOMOD, LINTER_MODULE, LINTER_VERSION, build_linter


@dataclass(frozen=True)
class BackgroundBuild:
    what: str
    needed: Callable[[], bool]  # False when built already, or when the test will say why it cannot be
    build: Callable[[Log], object]


def _go_found() -> bool:
    try:
        find_go()
    except BuildError:
        return False
    return True


def _build_kind_inputs(log: Log) -> None:
    nodeimage.build_inputs(log)
    nodeimage.ensure_kind(log)


BUILDS = {
    "dashboard-linter": BackgroundBuild(
        "Grafana's dashboard-linter",
        lambda: _go_found() and not is_executable(
            go_install_path(LINTER_MODULE, LINTER_VERSION, module_dir=LINTER_GOMOD)),
        build_linter,
    ),
    "e2e-test": BackgroundBuild(
        "the upstream e2e.test",
        lambda: _go_found() and not is_executable(e2e_cache_dir() / E2E_BINARY),
        ensure_e2e_test,
    ),
    "kind-node-image": BackgroundBuild(
        "the kind node image's inputs (those cached are only checked)",
        lambda: _go_found() and not nodeimage.missing_prerequisites(),
        _build_kind_inputs,
    ),
}


def start_background_build(name: str) -> str | None:
    """Start build `name` in a low-priority thread; returns a line saying so, or None when there
    is nothing to do."""
    build = BUILDS[name]
    if not build.needed():
        return None
    log_path = cache_dir() / "tools" / f"{name}-background.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def run() -> None:
        # Linux keeps a nice value per thread, and the processes it starts inherit it.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        with log_path.open("a") as out:
            try:
                build.build(lambda message: print(message, file=out, flush=True))
            except Exception as err:  # the late test builds again in the foreground and reports it
                print(f"background build failed: {err}", file=out, flush=True)

    threading.Thread(target=run, name=f"{name}-build", daemon=True).start()
    return f"building {build.what} in the background at nice 19 (log: {log_path})"
