"""The secure port's listening socket: on an unspecified address, one socket for both IP families, as KCM's.

asyncio's create_server() binds "::" with IPV6_V6ONLY set and "0.0.0.0" to IPv4 alone, so either
would answer on one family only. Go's net.Listen("tcp", ...) on an unspecified address opens one
AF_INET6 socket with IPV6_V6ONLY=0 wherever IPv4-mapped addresses work (favoriteAddrFamily in
net/ipsock_posix.go): KCM's default --bind-address=0.0.0.0, and "::", answer on 127.0.0.1 and ::1
alike; so does a network namespace with IPv6 turned off by sysctl (IPv4 comes in mapped). Where the
kernel has no IPv6 at all (ipv6.disable=1), asyncio's own binding is used: 0.0.0.0 listens on IPv4,
as Go's does there, and "::" fails, as Go's does.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import socket
from collections.abc import Callable

from pykcm.util.hostport import join_host_port

# The socket or the bind says IPv6 (or IPv4-mapped IPv6) is not there: not an error, a fallback.
_NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL})


def is_unspecified(host: str | None) -> bool:
    """Whether `host` means every interface: empty, 0.0.0.0, :: (any spelling), as Go's IP.IsUnspecified."""
    if not host:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: asyncio resolves it, as before
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def dual_stack_socket(port: int) -> socket.socket | None:
    """A bound, non-blocking TCP socket on [::]:port that takes IPv4 too (for create_server's `sock`);
    None where IPv6 or IPv4-mapped addresses are not available. A port in use raises, as it does now."""
    if not socket.has_ipv6:
        return None
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as err:
        if err.errno in _NO_IPV6:
            return None
        raise
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as create_server(reuse_address=True)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        except OSError:  # a kernel that refuses IPv4-mapped addresses (OpenBSD's): one family per socket
            sock.close()
            return None
        try:
            sock.bind(("::", port))
        except OSError as err:
            if err.errno in _NO_IPV6:
                sock.close()
                return None
            raise
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def create_server(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.Protocol], host: str | None, port: int
) -> asyncio.AbstractServer:
    """loop.create_server() on host:port; an unspecified host listens dual-stack where the system can."""
    sock = dual_stack_socket(port) if is_unspecified(host) else None
    if sock is None:  # a given address, or no IPv6 here: "" then is IPv4's wildcard, as Go's fallback is
        try:
            server = await loop.create_server(factory, host or "0.0.0.0", port, reuse_address=True)
        except OSError as err:
            if err.errno is None:  # Python 3.13's "could not bind on any address": it does not say why
                raise _why_nothing_bound(host or "0.0.0.0", port) from None
            raise
        if not server.sockets:  # asyncio (to 3.12) skips a family it cannot make a socket of: "::" without IPv6
            server.close()
            raise _no_family()
        return server
    try:
        return await loop.create_server(factory, sock=sock)
    except BaseException:  # listen() failing: the socket is still ours to close
        sock.close()
        raise


def _no_family() -> OSError:
    return OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))


def _why_nothing_bound(host: str, port: int) -> OSError:
    """Python 3.13's create_server skips a socket whose family is missing or whose address is not on
    this host (EADDRNOTAVAIL), then says neither: the first address, tried again, gives its own
    error, as Go's ("cannot assign requested address" for an address that is not here)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.bind(address)
    except OSError as err:
        if err.errno is not None:
            return OSError(err.errno, os.strerror(err.errno))
    return _no_family()


def listen_failure(host: str, port: int, err: OSError) -> str:
    """KCM's words for a port that cannot be listened on ("failed to listen on 127.0.0.1:10257: address
    already in use"); asyncio's message repeats the address as a Python tuple: the errno's own words suffice."""
    reason = os.strerror(err.errno).lower() if err.errno else err.strerror or str(err)
    return f"failed to listen on {join_host_port(host, port)}: {reason}"
