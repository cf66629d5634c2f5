"""SIGQUIT dumps every thread and task and exits 2, as Go does, even with the loop blocked."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import checkout_env

# A process whose event loop runs an idle task and a task that blocks the loop in a sleep.
CHILD = """
import asyncio, sys, time
from pykcm.app import eventloop, stackdump

async def idle_worker():
    await asyncio.Event().wait()

def blocking_sync():
    print("blocking", flush=True)
    time.sleep(60)

async def main(block):
    stackdump.install(asyncio.get_running_loop())
    idle = asyncio.create_task(idle_worker(), name="controller idle")  # noqa: F841 (kept: tasks are weakly held)
    await asyncio.sleep(0.1)
    if block:
        blocking_sync()
    print("blocking", flush=True)
    await asyncio.sleep(60)

eventloop.run(main(sys.argv[1] == "block"), use_uvloop=sys.argv[2] == "uvloop")
"""


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("block", ["block", "idle"])
def test_sigquit_dumps_threads_and_tasks_and_exits_2(tmp_path: Path, loop: str, block: str) -> None:
    script = tmp_path / "child.py"  # a file, so that the dump can show its source lines
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), block, loop], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=checkout_env())
    try:
        assert child.stdout is not None and child.stdout.readline() == "blocking\n"
        time.sleep(0.2)
        child.send_signal(signal.SIGQUIT)
        _, err = child.communicate(timeout=20)
    finally:
        child.kill()
    assert child.returncode == 2, err
    assert err.startswith("SIGQUIT: quit\n") and "Traceback" not in err, err
    assert "\nthread MainThread:\n" in err
    assert "\ntask 'controller idle':\n" in err and "in idle_worker\n    await asyncio.Event().wait()" in err
    if block == "block":
        assert "in blocking_sync\n    time.sleep(60)" in err, err
