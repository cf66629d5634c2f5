"""Running out of file descriptors, as KCM does not: the soft RLIMIT_NOFILE is raised to the hard one
at start (as Go's runtime does), and a connection that cannot be taken over for lack of a descriptor
is closed with one line, at most every few seconds, never a traceback."""

from __future__ import annotations

import asyncio
import errno
import logging
import subprocess
import sys

import pytest

from pykcm.serving import http
from pykcm.serving.http import HTTPServer, _Accepted


class NoDescriptorLeft:
    """A socket whose duplicate fails as dup() does past the limit."""

    def dup(self) -> None:
        raise OSError(errno.EMFILE, "Too many open files")


class Transport:
    def __init__(self) -> None:
        self.aborted = False

    def get_extra_info(self, name: str) -> object:
        assert name == "socket"
        return NoDescriptorLeft()

    def abort(self) -> None:
        self.aborted = True


async def test_a_connection_without_a_descriptor_is_closed_with_one_rate_limited_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(http, "_accept_error_logged", -http.ACCEPT_ERROR_EVERY)
    server = HTTPServer(lambda request: None)  # type: ignore[arg-type,return-value]
    transports = [Transport() for _ in range(50)]
    with caplog.at_level(logging.ERROR):
        for transport in transports:
            _Accepted(server).connection_made(transport)  # type: ignore[arg-type]
    assert all(t.aborted for t in transports) and not server._admitting
    lines = [r for r in caplog.records if "Cannot accept a connection" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "Too many open files" in str(getattr(lines[0], "kv", {}))
    monkeypatch.setattr(http, "_accept_error_logged", -http.ACCEPT_ERROR_EVERY)  # the interval has passed
    with caplog.at_level(logging.ERROR):
        _Accepted(server).connection_made(Transport())  # type: ignore[arg-type]
    assert len([r for r in caplog.records if "Cannot accept a connection" in r.getMessage()]) == 2


async def test_an_accept_without_a_descriptor_on_asyncios_loop_is_one_rate_limited_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio's selector loop hands a failed accept() to the loop's exception handler (a traceback
    every second while it lasts); uvloop drops it silently."""
    monkeypatch.setattr(http, "_accept_error_logged", -http.ACCEPT_ERROR_EVERY)
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "_exception_handler", None)
    server = HTTPServer(lambda request: None)  # type: ignore[arg-type,return-value]
    await server.start("127.0.0.1", 0)
    try:
        with caplog.at_level(logging.DEBUG):
            for _ in range(5):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(errno.EMFILE, "Too many open files")})
            loop.call_exception_handler({"message": "something else"})  # still the default handler's
    finally:
        await server.stop()
    lines = [r for r in caplog.records if "Cannot accept a connection" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert not any("out of system resource" in r.getMessage() for r in caplog.records)
    assert any(r.getMessage() == "something else" for r in caplog.records)


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    script = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(200, hard), hard))\n"
        "from pykcm.app.manager import raise_open_files_limit\n"
        "raise_open_files_limit()\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "print(soft == hard)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "True", result.stderr
