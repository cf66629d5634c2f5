"""Where the secure port listens (pykcm.serving.listen through pykcm.serving.http): the wildcard
addresses on both IP families as Go's net.Listen, a given address alone, and a kernel without IPv6."""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

import pytest

from pykcm.app import eventloop
from pykcm.serving import listen
from pykcm.serving.http import HTTPServer
from pykcm.util.hostport import join_host_port
from tests.unit.test_fence import LOOPS
from tests.unit.test_serving_http import App, get, read_response


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


IPV6 = _ipv6_loopback()
NEEDS_IPV6 = pytest.mark.skipif(not IPV6, reason="no IPv6 loopback (::1) on this machine")
CLIENTS = ["127.0.0.1", pytest.param("::1", marks=NEEDS_IPV6)]


def answers(host: str | None, clients: list[str], use_uvloop: bool) -> list[bool]:
    """Whether a server started on `host` (port 0) answers a request from each client address."""

    async def scenario() -> list[bool]:
        srv = HTTPServer(App())
        port = await srv.start(host, 0)
        answered = []
        try:
            for client in clients:
                try:
                    reader, writer = await asyncio.open_connection(client, port)
                except OSError:  # refused
                    answered.append(False)
                    continue
                writer.write(get("/", "Connection: close"))
                answered.append((await read_response(reader))[2] == b"GET /")
                writer.close()
        finally:
            await srv.stop()
        return answered

    return eventloop.run(scenario(), use_uvloop=use_uvloop)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_an_unspecified_address_listens_on_both_ip_families(host: str, client: str, loop: str) -> None:
    # As KCM: Go's net.Listen("tcp") on 0.0.0.0 or :: is one IPv6 socket with IPV6_V6ONLY=0, where
    # asyncio's own create_server("::") would be IPv6-only and create_server("0.0.0.0") IPv4-only.
    assert answers(host, [client], loop == "uvloop") == [True]


@pytest.mark.parametrize(("host", "address"), [("0.0.0.0", "[::]:"), ("127.0.0.1", "127.0.0.1:")])
async def test_the_listening_address_is_the_sockets(host: str, address: str) -> None:
    srv = HTTPServer(App())
    port = await srv.start(host, 0)
    try:
        assert join_host_port(*srv.sockname) == f"{address}{port}"  # KCM logs "Serving securely on [::]:10257"
    finally:
        await srv.stop()


@NEEDS_IPV6
@pytest.mark.parametrize("loop", LOOPS)
def test_a_given_address_listens_on_it_alone(loop: str) -> None:
    assert answers("127.0.0.1", ["127.0.0.1", "::1"], loop == "uvloop") == [True, False]
    assert answers("::1", ["127.0.0.1", "::1"], loop == "uvloop") == [False, True]


@pytest.fixture
def no_ipv6(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without IPv6 (booted with ipv6.disable=1): socket(AF_INET6) fails."""

    class NoIPv6(socket.socket):
        def __init__(self, family: int = -1, *args: Any, **kwargs: Any) -> None:
            if family == socket.AF_INET6:
                raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
            super().__init__(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", NoIPv6)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.usefixtures("no_ipv6")
def test_without_ipv6_the_ipv4_wildcard_still_listens(loop: str) -> None:
    # 0.0.0.0 and "" fall back to an IPv4 socket, as Go's net.Listen does there.
    for host in ("0.0.0.0", ""):
        assert answers(host, ["127.0.0.1"], loop == "uvloop") == [True], host


@pytest.mark.usefixtures("no_ipv6")
def test_without_ipv6_the_ipv6_wildcard_fails_to_listen() -> None:
    """asyncio's create_server("::") skips the family it cannot make a socket of; that is an error, not a
    server with no socket (uvloop makes its own sockets, out of this patch's reach)."""
    with pytest.raises(OSError) as err:
        answers("::", [], use_uvloop=False)
    assert err.value.errno == errno.EAFNOSUPPORT


async def test_python_313s_no_address_error_is_the_missing_family() -> None:
    """3.13's create_server raises "could not bind on any address" (no errno) where 3.12 returned a
    server without sockets: both are "address family not supported", as Go's."""
    loop = asyncio.get_running_loop()

    async def as_on_python_313(*_: object, **__: object) -> asyncio.AbstractServer:
        raise OSError("could not bind on any address out of [('::', 0, 0, 0)]")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(listen, "dual_stack_socket", lambda port: None)
        patch.setattr(loop, "create_server", as_on_python_313)
        with pytest.raises(OSError) as err:
            await listen.create_server(loop, asyncio.Protocol, "::", 0)
    assert err.value.errno == errno.EAFNOSUPPORT
    assert listen.listen_failure("::", 10257, err.value) == (
        "failed to listen on [::]:10257: address family not supported by protocol")


async def test_python_313s_no_address_error_for_an_address_not_here_says_so() -> None:
    """3.13 also skips an address that is not on this host (EADDRNOTAVAIL) with the same errno-less
    error: that is Go's "cannot assign requested address", not a missing family."""
    loop = asyncio.get_running_loop()

    async def as_on_python_313(*_: object, **__: object) -> asyncio.AbstractServer:
        raise OSError("could not bind on any address out of [('192.0.2.1', 0)]")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "create_server", as_on_python_313)
        with pytest.raises(OSError) as err:
            await listen.create_server(loop, asyncio.Protocol, "192.0.2.1", 0)  # TEST-NET-1: bound, never reached
    assert listen.listen_failure("192.0.2.1", 10257, err.value) == (
        "failed to listen on 192.0.2.1:10257: cannot assign requested address")
