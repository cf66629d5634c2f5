"""A test-only controller plugin that stalls pykcm's event loop on request, to prove end to end
that a *wedged* loop costs the lease while a merely *busy* one keeps it (tests/integration/
test_faults_leader.py).

A ConfigMap labelled `test.pykcm.io/loop-stall: "true"` with data `mode`, `seconds` and `lease`
(the Lease this pykcm elects on, so that only the process under test stalls) is acted on once, in
the controller's sync, on the event loop itself:

- `wedge`: one blocking sleep of `seconds`: the loop runs nothing else (a stuck C call, a CPU-bound
  bug); its heartbeat stops.
- `busy`: blocking slices of BUSY_SLICE seconds with a yield between them, for `seconds` in all:
  the loop lags by up to a slice (less than the heartbeat bound) but keeps running.

Then it logs "Loop stall done". It is registered as a plugin without pip: `install_loop_stall(dir)`
writes a dist-info with its entry point into `dir`, which goes on the child's PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pykcm.client.resources import CONFIGMAPS
from pykcm.controller import Controller, ControllerContext
from pykcm.controller.registry import ENTRY_POINT_GROUP

STALL_LABEL = "test.pykcm.io/loop-stall"
BUSY_SLICE = 1.5  # seconds the loop is blocked at a time when busy: under the heartbeat bound
NAME = "loop-stall-controller"


class LoopStallController(Controller):
    name = NAME
    aliases = ("loop-stall",)
    enabled_by_default = False

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        self.configmaps = self.informers.informer(CONFIGMAPS)
        self.configmaps.add_event_handler(on_add=self.enqueue)
        self.done: set[str] = set()

    async def sync(self, key: str) -> None:
        configmap = self.configmaps.indexer.get(key)
        if key in self.done or configmap is None:
            return
        if configmap["metadata"].get("labels", {}).get(STALL_LABEL) != "true":
            return
        data = configmap.get("data") or {}
        if data.get("lease") != self.options.leader_elect_resource_name:
            return
        self.done.add(key)
        mode, seconds = data["mode"], float(data["seconds"])
        self.log.info("Loop stall starts", mode=mode, seconds=seconds)
        if mode == "wedge":
            time.sleep(seconds)  # blocking the loop is the point
        else:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(min(BUSY_SLICE, max(deadline - time.monotonic(), 0)))
                await asyncio.sleep(0.05)
        self.log.info("Loop stall done", mode=mode, seconds=seconds)


def install_loop_stall(directory: Path) -> Path:
    """Register LoopStallController for processes with `directory` on their PYTHONPATH."""
    dist = directory / "pykcm_test_loop_stall-0.0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pykcm-test-loop-stall\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{NAME} = tests.loop_stall:LoopStallController\n")
    return directory


def stall_configmap(lease: str, mode: str, seconds: float) -> dict:
    """Stalls the loop of the pykcm electing on `lease` (see the module docstring)."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{lease}-{mode}", "labels": {STALL_LABEL: "true"}},
        "data": {"mode": mode, "seconds": f"{seconds:g}", "lease": lease},
    }
