"""The manager's start, before anything runs: the wait for the apiserver."""

from __future__ import annotations

import asyncio
import time

import pytest

from pykcm.app.manager import Manager, ManagerError
from pykcm.app.options import Options
from pykcm.client.config import ClientConfig
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
