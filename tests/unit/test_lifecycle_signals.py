"""A second SIGTERM or SIGINT while pykcm stops exits 1 at once, as KCM's SetupSignalContext does
(k8s.io/apiserver pkg/server/signal.go: `os.Exit(1) // second signal. Exit directly.`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tests.support import CHECKOUT

# The manager stops slowly (a drain): the second signal arrives meanwhile and must cut it short.
CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    from pykcm.app import cli, eventloop
    from pykcm.util import log

    class Manager:
        async def run(self, stop):
            os.kill(os.getpid(), signal.SIGTERM)
            await stop.wait()
            os.kill(os.getpid(), int(sys.argv[1]))
            await asyncio.sleep(30)
            print("drained", flush=True)

    log.setup()
    eventloop.run(cli._serve(Manager()), False)
    print("returned", flush=True)
""")


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_1_at_once(second: signal.Signals) -> None:
    child = subprocess.run([sys.executable, "-c", CHILD, str(int(second))], cwd=CHECKOUT,
                           capture_output=True, text=True, timeout=20)
    assert child.returncode == 1, child.stderr
    assert child.stdout == ""  # neither the drain nor the run finished
    assert child.stderr.count('"Received signal, shutting down" signal="SIGTERM"') == 1
    assert "Traceback" not in child.stderr
