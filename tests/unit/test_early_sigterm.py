"""SIGTERM during the start, before the event loop's handlers exist, as a container's PID 1 gets it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import checkout_env, free_port
from tests.unit.test_client_config import write_kubeconfig

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for a PID namespace")


def _namespaced_init(unshare: subprocess.Popen[bytes]) -> int:
    """The host PID of the process unshare forked: PID 1 of its new namespace."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if found := children.read_text().split():
            return int(found[0])
        time.sleep(0.05)
    raise AssertionError("unshare forked nothing")


def test_pid_1_ends_on_sigterm_while_it_waits_for_its_credentials(tmp_path: Path) -> None:
    """The kernel drops a signal with no handler sent to a PID namespace's init: without one installed
    from the start, a pod deleted as it started ran on until its grace period ended."""
    plugin = tmp_path / "slow-plugin"
    started = tmp_path / "plugin-started"
    plugin.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 30\n")
    plugin.chmod(0o755)
    kubeconfig = write_kubeconfig(tmp_path, {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                      "command": str(plugin), "interactiveMode": "Never"}})
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--", sys.executable, "-m", "pykcm.app.cli", "run",
         "--kubeconfig", kubeconfig, "--secure-port", str(free_port()), "--no-leader-elect"],
        env=checkout_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        init = _namespaced_init(unshare)
        deadline = time.monotonic() + 20
        while not started.exists():  # pykcm waits for its credentials: the start, before any loop
            assert time.monotonic() < deadline, "the exec plugin never started"
            time.sleep(0.05)
        os.kill(init, signal.SIGTERM)
        assert unshare.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if unshare.poll() is None:
            unshare.kill()
            unshare.wait()
