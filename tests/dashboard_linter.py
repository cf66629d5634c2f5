"""Grafana's dashboard-linter, built from a pinned Go module of ours (tests/dashboard-linter/).

A cold build downloads about 300 MB of modules and compiles some 950 packages (Loki's LogQL
parser and its dependencies): 9 to 16 minutes on 2 busy cores. So the session builds it in the
background (tests/background_builds.py) and the linter's test (marker `late`) runs last.
"""

from __future__ import annotations

from pathlib import Path

from pykcm.testenv.gobuild import Log, ensure_go_install

LINTER_MODULE = "github.com/grafana/dashboard-linter"
LINTER_VERSION = "v0.0.0-20241216132922-9479ff4bfa35"  # v0.2.0's rules, without its v2-schema reader
LINTER_GOMOD = Path(__file__).parent / "dashboard-linter"
LINTER_BUILD_TIMEOUT = 30 * 60


def build_linter(log: Log) -> Path:
    """The linter's binary, built now unless cached (waits for a build already under way)."""
    return ensure_go_install(LINTER_MODULE, LINTER_VERSION, log=log, module_dir=LINTER_GOMOD)
