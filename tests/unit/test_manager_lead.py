"""The manager's leading term (Manager._lead) with a fake elector: how it ends, and what it says."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from pykcm.app.manager import Manager, ManagerError
from pykcm.app.options import Options
from pykcm.client.config import ClientConfig
from pykcm.client.resources import CONFIGMAPS


class Elector:
    """Renews until told to stop (True), or loses the lease after `lose_after` seconds (False)."""

    def __init__(self, lose_after: float | None) -> None:
        self.lose_after = lose_after
        self.released = False
        self.lock = SimpleNamespace(describe=lambda: "kube-system/pykcm")

    async def renew(self, stop: asyncio.Event) -> bool:
        if self.lose_after is None:
            await stop.wait()
            return True
        await asyncio.sleep(self.lose_after)
        return False

    async def release(self) -> bool:
        self.released = True
        return True


def manager_draining_for(seconds: float) -> Manager:
    manager = Manager(Options(), ClientConfig(host="https://127.0.0.1:1", ssl_context=None), [])

    async def run_controllers(stop: asyncio.Event) -> None:
        await stop.wait()
        await asyncio.sleep(seconds)  # the in-flight syncs finishing

    manager._run_controllers = run_controllers  # type: ignore[method-assign]
    return manager


async def test_a_signal_drains_and_releases_the_lease() -> None:
    elector, stop = Elector(lose_after=None), asyncio.Event()
    stop.set()
    await manager_draining_for(0.05)._lead(elector, stop)  # type: ignore[arg-type]
    assert elector.released


async def test_a_lease_lost_while_draining_is_said_and_not_released() -> None:
    # The renewal fails 0.05 s into a 0.2 s drain: no release (another may lead), exit as lost.
    elector, stop = Elector(lose_after=0.05), asyncio.Event()
    stop.set()
    with pytest.raises(ManagerError, match="leaderelection lost"):
        await manager_draining_for(0.2)._lead(elector, stop)  # type: ignore[arg-type]
    assert not elector.released


async def cancelled_while_draining(everything: bool) -> Elector:
    """A second signal during the drain: the Runner cancels every task (`everything`), or only ours."""
    elector, stop = Elector(lose_after=None), asyncio.Event()
    stop.set()
    leading = asyncio.create_task(manager_draining_for(5.0)._lead(elector, stop))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    for task in asyncio.all_tasks() if everything else {leading}:
        if task is not asyncio.current_task():
            task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leading
    return elector


@pytest.mark.parametrize("everything", [True, False])
async def test_a_second_signal_exits_unreleased_and_is_not_a_lost_lease(
    everything: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm"):
        elector = await cancelled_while_draining(everything)
    assert not elector.released  # no time for it: the standby waits out the lease
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    said = [r.getMessage() for r in caplog.records if "leader lease" in r.getMessage()]
    assert said == ["Exiting now without releasing the leader lease"]


def test_the_watch_list_gate_is_kcms_feature_gate_not_client_gos_environment_variable(monkeypatch) -> None:
    # KCM takes client-go's gates into its --feature-gates: the variable does nothing there.
    monkeypatch.setenv("KUBE_FEATURE_WatchListClient", "false")
    config = ClientConfig(host="https://127.0.0.1:1", ssl_context=None)
    assert Manager(Options(), config, []).factory.informer(CONFIGMAPS).reflector.watch_list is True
    off = Options(feature_gates={"WatchListClient": False})
    assert Manager(off, config, []).factory.informer(CONFIGMAPS).reflector.watch_list is False


class CrashingElector(Elector):
    """A bug in the renewal: renew() raises after `crash_after` seconds instead of answering."""

    def __init__(self, crash_after: float) -> None:
        super().__init__(lose_after=None)
        self.crash_after = crash_after

    async def renew(self, stop: asyncio.Event) -> bool:
        await asyncio.sleep(self.crash_after)
        raise KeyError("boom: unexpected bug in renewal")


@pytest.mark.parametrize("draining", [False, True])
async def test_a_crashed_renewal_is_said_with_its_type_before_the_lost_lease(
    draining: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Leading, or 0.05 s into a 0.2 s drain: either way the cause is logged, not only "lost".
    elector, stop = CrashingElector(crash_after=0.05), asyncio.Event()
    if draining:
        stop.set()
    with caplog.at_level(logging.INFO, logger="pykcm"), pytest.raises(ManagerError, match="leaderelection lost"):
        await manager_draining_for(0.2)._lead(elector, stop)  # type: ignore[arg-type]
    assert not elector.released
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["Lease renewal crashed", "leaderelection lost/stopped"]
    crash = errors[0].kv  # type: ignore[attr-defined]
    assert crash["lock"] == "kube-system/pykcm"
    assert crash["err"].startswith("KeyError: 'boom: unexpected bug in renewal' (at test_manager_lead.py:")


async def test_a_lost_lease_says_no_crash(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm"), pytest.raises(ManagerError):
        await manager_draining_for(0.0)._lead(Elector(lose_after=0.01), asyncio.Event())  # type: ignore[arg-type]
    [lost] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert lost.getMessage() == "leaderelection lost/stopped" and lost.kv == {"lock": "kube-system/pykcm"}  # type: ignore[attr-defined]
