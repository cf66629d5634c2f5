"""Grafana's dashboard-linter, built from a pinned Go module of ours (tests/dashboard-linter/).

A cold build downloads about 300 MB of modules and compiles some 950 packages (Loki's LogQL
parser and its dependencies): 9 to 16 minutes on 2 busy cores. So the session starts it at once in
a background thread at the lowest CPU priority, where it uses the cycles the integration tests
leave idle while they wait on clusters, and the linter's test (marker `late`) runs last.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pykcm.testenv.gobuild import BuildError, Log, cache_dir, ensure_go_install, find_go, go_install_path, is_executable

LINTER_MODULE = "github.com/grafana/dashboard-linter"
LINTER_VERSION = "v0.0.0-20241216132922-9479ff4bfa35"  # v0.2.0's rules, without its v2-schema reader
LINTER_GOMOD = Path(__file__).parent / "dashboard-linter"
LINTER_BUILD_TIMEOUT = 30 * 60
_LOG = cache_dir() / "tools" / "dashboard-linter-background.log"


def build_linter(log: Log) -> Path:
    """The linter's binary, built now unless cached (waits for a build already under way)."""
    return ensure_go_install(LINTER_MODULE, LINTER_VERSION, log=log, module_dir=LINTER_GOMOD)


def start_background_build() -> str | None:
    """Start building the linter in a low-priority thread; returns a line saying so, or None when
    there is nothing to do (built already; no Go toolchain: the test says why itself)."""
    if is_executable(go_install_path(LINTER_MODULE, LINTER_VERSION, module_dir=LINTER_GOMOD)):
        return None
    try:
        find_go()
    except BuildError:
        return None
    _LOG.parent.mkdir(parents=True, exist_ok=True)

    def build() -> None:
        # Linux keeps a nice value per thread, and the go processes it starts inherit it.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        with _LOG.open("a") as out:
            try:
                build_linter(lambda message: print(message, file=out, flush=True))
            except Exception as err:  # the test builds again in the foreground and reports it
                print(f"background build failed: {err}", file=out, flush=True)

    threading.Thread(target=build, name="dashboard-linter-build", daemon=True).start()
    return f"building Grafana's dashboard-linter in the background at nice 19 (log: {_LOG})"
