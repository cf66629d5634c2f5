"""Background tasks of the manager's lifecycle: a crash is said, a shutdown's cancellation is not,
and a cancellation is never swallowed."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from pykcm.app import manager as manager_module
from pykcm.app.clientbuilder import _refused_within, _Token
from pykcm.app.manager import Manager
from pykcm.app.options import Options
from pykcm.client.config import ClientConfig


class Server:
    """The secure server, not listening: only the refresh task is under test."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class TLS:
    """DynamicServingTLS's surface for _start_server; run() crashes (`crash`) or waits for cancellation."""

    context = None

    def __init__(self, crash: bool) -> None:
        self.crash = crash

    async def run(self, _fetch: object) -> None:
        if self.crash:
            raise KeyError("boom")
        await asyncio.Event().wait()


async def serving(tls: TLS, monkeypatch: pytest.MonkeyPatch) -> Manager:
    monkeypatch.setattr(manager_module, "SecureServer", Server)
    config = ClientConfig(host="https://127.0.0.1:1", ssl_context=None)
    manager = Manager(Options(authentication_skip_lookup=True), config, [])
    await manager._start_server(tls)  # type: ignore[arg-type]
    return manager


async def test_a_crash_of_the_serving_tls_refresh_is_said_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm"):
        manager = await serving(TLS(crash=True), monkeypatch)
        assert manager._tls_refresh is not None
        await asyncio.gather(manager._tls_refresh, return_exceptions=True)
        await asyncio.sleep(0)  # the done-callbacks run
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["Serving certificate reloading stopped unexpectedly"]
    assert errors[0].kv["err"].startswith("KeyError: 'boom' (at test_lifecycle_tasks.py:")  # type: ignore[attr-defined]


async def test_the_serving_tls_refresh_cancelled_at_shutdown_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pykcm"):
        manager = await serving(TLS(crash=False), monkeypatch)
        assert manager._tls_refresh is not None
        await asyncio.sleep(0.01)
        manager._tls_refresh.cancel()  # as Manager.run's finally does
        await asyncio.gather(manager._tls_refresh, return_exceptions=True)
        await asyncio.sleep(0)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_cancellation_as_the_token_is_refused_is_not_swallowed() -> None:
    """Python 3.11's wait_for returns the inner result when the cancellation and the inner wait's end
    fall in one loop iteration: the renewer would then run on at shutdown."""
    token = _Token("t", expires=time.monotonic() + 3600)
    waiting = asyncio.create_task(_refused_within(token, 10))
    await asyncio.sleep(0.01)  # waiting on the refusal
    token.refused.set()  # a 401 arrives ...
    waiting.cancel()  # ... as the shutdown cancels the renewer
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_the_wait_says_whether_the_token_was_refused() -> None:
    token = _Token("t", expires=time.monotonic() + 3600)
    assert await _refused_within(token, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, token.refused.set)
    assert await _refused_within(token, 5) is True
