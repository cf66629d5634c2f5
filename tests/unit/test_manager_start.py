"""The manager's start, before anything runs (the wait for the apiserver), and the lines KCM says as
it starts and stops."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest

from pykcm.app.manager import Manager, ManagerError
from pykcm.app.options import Options
from pykcm.client.config import ClientConfig
from pykcm.controller import discover_controllers
from tests.support import free_port


def unreachable(host: str = "") -> Manager:
    config = ClientConfig(host=host or f"http://127.0.0.1:{free_port()}", ssl_context=None)
    return Manager(Options(secure_port=0, leader_elect=False), config, [])


async def test_a_signal_while_the_apiserver_is_awaited_stops_at_once() -> None:
    """As KCM: a SIGTERM then ends the start, not 10 s later as an apiserver error."""
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    start = time.monotonic()
    await asyncio.wait_for(unreachable().run(stop), 5)  # returns: no ManagerError
    assert time.monotonic() - start < 2


async def test_the_apiserver_error_does_not_show_a_password(monkeypatch: pytest.MonkeyPatch) -> None:
    from pykcm.app import manager as manager_module

    monkeypatch.setattr(manager_module, "APISERVER_HEALTH_TIMEOUT", 0.5)
    mgr = unreachable(f"http://admin:S3CRET@127.0.0.1:{free_port()}")
    with pytest.raises(ManagerError) as err:
        await mgr.run(asyncio.Event())
    assert "S3CRET" not in str(err.value) and "admin:***@127.0.0.1" in str(err.value)
    assert "S3CRET" not in mgr.client._transport.host_label


@pytest.mark.parametrize("flag", ["client_ca_file", "tls_cert_file"])
async def test_a_missing_serving_file_is_said_before_the_apiserver_is_awaited(flag: str, tmp_path) -> None:
    """As KCM, which reads them from its flags first: at once, not after the apiserver answers."""
    files = {"client_ca_file": str(tmp_path / "nope")} if flag == "client_ca_file" else {
        "tls_cert_file": str(tmp_path / "nope.crt"), "tls_private_key_file": str(tmp_path / "nope.key")}
    config = ClientConfig(host=f"http://127.0.0.1:{free_port()}", ssl_context=None)
    mgr = Manager(Options(secure_port=free_port(), leader_elect=False, **files), config, [])
    start = time.monotonic()
    with pytest.raises(ManagerError, match="No such file or directory"):
        await asyncio.wait_for(mgr.run(asyncio.Event()), 5)
    assert time.monotonic() - start < 2


async def test_the_first_line_is_kcms_starting_with_pykcms_version(caplog: pytest.LogCaptureFixture) -> None:
    from pykcm import __version__

    stop = asyncio.Event()
    stop.set()
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await asyncio.wait_for(unreachable().run(stop), 5)
    first = caplog.records[0]
    assert first.getMessage() == "Starting" and first.kv == {"version": f"v{__version__}"}  # type: ignore[attr-defined]


async def test_each_registered_controller_turned_off_is_said_as_kcm_does(caplog: pytest.LogCaptureFixture) -> None:
    registered = discover_controllers()
    config = ClientConfig(host=f"http://127.0.0.1:{free_port()}", ssl_context=None)
    mgr = Manager(Options(), config, [registered["replicaset-controller"]])
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await mgr._build_controllers()
    await mgr.client.close()
    disabled = [r.kv for r in caplog.records if r.getMessage() == "Warning: controller is disabled"]  # type: ignore[attr-defined]
    assert disabled == [{"controller": "namespace-controller"}, {"controller": "serviceaccount-controller"}]


async def test_each_controllers_events_are_logged_at_its_kcm_broadcasters_level() -> None:
    """KCM's ReplicaSet controller logs its Events at V(3); its namespace and service account
    controllers have no broadcaster (they record none), so none is logged for them."""
    config = ClientConfig(host=f"http://127.0.0.1:{free_port()}", ssl_context=None)
    mgr = Manager(Options(), config, list(discover_controllers().values()))
    await mgr._build_controllers()
    await mgr.client.close()
    levels = {c.name: c.events.log_verbosity for c in mgr.controllers}
    assert levels == {"replicaset-controller": 3, "namespace-controller": None, "serviceaccount-controller": None}
    # Each broadcaster is made in its controller's constructor, whose logger is named after it.
    assert {c.name: c.events._log.named_as for c in mgr.controllers} == {c.name: c.name for c in mgr.controllers}


class DrainingController:
    """What _shutdown touches of a controller: its name, queue and events."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue = SimpleNamespace(shutdown=lambda: None, in_flight=lambda: [])
        self.events = SimpleNamespace(close=self._close)

    async def _close(self, timeout: float) -> None:
        return None


async def shut_down(drains: dict[str, bool], timeout: float, caplog: pytest.LogCaptureFixture) -> list[tuple]:
    """_shutdown with one task per controller, each draining at once or never; the lines it says."""
    mgr = unreachable()
    mgr.controllers = [DrainingController(name) for name in drains]  # type: ignore[list-item]
    started = asyncio.Event()
    started.set()
    mgr.runners = [SimpleNamespace(started=started) for _ in drains]  # type: ignore[misc]
    tasks = [asyncio.create_task(asyncio.sleep(0) if drains[name] else asyncio.Event().wait()) for name in drains]
    mgr._drain_timeout = timeout
    with caplog.at_level(logging.INFO, logger="pykcm"):
        await mgr._shutdown(tasks)
    await mgr.client.close()
    return [(r.getMessage(), r.kv) for r in caplog.records]  # type: ignore[attr-defined]


async def test_a_drained_shutdown_says_all_controllers_terminated(caplog: pytest.LogCaptureFixture) -> None:
    said = await shut_down({"a-controller": True, "b-controller": True}, 1.0, caplog)
    assert ("All controllers terminated", {}) in said
    assert not [msg for msg, _ in said if msg == "Controller shutdown timeout reached"]


async def test_a_stop_without_a_drain_says_no_controller_terminated(caplog: pytest.LogCaptureFixture) -> None:
    # A lost lease, a second signal or --controller-shutdown-timeout=0: the controllers are cut short.
    said = await shut_down({"a-controller": False}, 0.0, caplog)
    ends = ("All controllers terminated", "Controller shutdown timeout reached")
    assert [msg for msg, _ in said if msg in ends] == []
    assert said[-1][0] == "Stopped"


async def test_a_drain_past_the_timeout_says_which_controllers_still_ran(caplog: pytest.LogCaptureFixture) -> None:
    said = await shut_down({"z-controller": False, "a-controller": True, "m-controller": False}, 0.01, caplog)
    assert ("Controller shutdown timeout reached",
            {"timeout": "10ms", "runningControllers": ["m-controller", "z-controller"]}) in said
    assert not [msg for msg, _ in said if msg == "All controllers terminated"]  # KCM returns without it
    assert said[-1][0] == "Stopped"
