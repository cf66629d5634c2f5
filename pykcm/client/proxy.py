"""Which proxy a connection to an API server goes through, and the CONNECT tunnel through it.

proxy_for() picks the proxy as client-go does; open_tunnel() is what Go's net/http Transport does
with it: connect to the proxy (with TLS for an https:// proxy), ask it to CONNECT host:port, and
on a 2xx answer speak TLS to the API server over that same connection. An http:// server is
tunnelled the same way, plain HTTP inside (net/http would send the proxy absolute-form requests
instead). socks5 proxies, which client-go also takes, are refused by parse_proxy().
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pykcm.client.httpconnection import MAX_HEAD
from pykcm.client.tlsverify import verifying_context
from pykcm.util.hostport import join_host_port
from pykcm.util.log import one_line

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ENV = {"https": ("HTTPS_PROXY", "https_proxy"), "http": ("HTTP_PROXY", "http_proxy")}

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


class ProxyRefused(ConnectionRefusedError):
    """The proxy did not open the tunnel: nothing reached the API server, so callers (and the
    retry rules, which send nothing again after a refused connection) treat it as one."""


@dataclass(frozen=True)
class Proxy:
    """A parsed proxy URL: where to connect and what the CONNECT request carries."""

    tls: bool  # https://: TLS to the proxy, then TLS to the API server inside it
    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization header, from the URL's user info

    @property
    def address(self) -> str:
        return join_host_port(self.host, self.port)


def parse_proxy(url: str) -> Proxy:
    """http://[user:pass@]host[:port] or https://...; anything else is a ValueError in one line
    that never shows the credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ValueError(f"invalid proxy URL: {err}") from None
    shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"  # never the credentials
    if parts.scheme in ("socks5", "socks5h"):
        raise ValueError(f"proxy {shown}: socks5 proxies are not supported, only http:// and https://")
    if parts.scheme not in _DEFAULT_PORTS:
        raise ValueError(f"proxy {shown}: unsupported scheme {parts.scheme!r}, must be http or https")
    if not parts.hostname:
        raise ValueError(f"proxy {shown}: no host")
    authorization = None
    if "@" in parts.netloc:  # Go's proxyAuth: Basic user:password, both URL-decoded, even if empty
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        credentials = f"{unquote(user)}:{unquote(password)}".encode()
        authorization = "Basic " + base64.b64encode(credentials).decode("ascii")
    return Proxy(parts.scheme == "https", parts.hostname, port or _DEFAULT_PORTS[parts.scheme], authorization)


# -- which proxy --------------------------------------------------------------------------------------


def proxy_for(server_url: str, proxy_url: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The proxy URL for requests to `server_url`, or None to connect directly.

    As client-go: the kubeconfig cluster's `proxy-url` (`proxy_url`) is used for every request,
    whatever the environment and the server (clientcmd makes it rest.Config.Proxy, an
    http.ProxyURL). Without it, Go's http.ProxyFromEnvironment (client-go's default, in
    transport/cache.go), with golang.org/x/net/http/httpproxy's rules: HTTPS_PROXY for an https
    server, HTTP_PROXY for an http one, the upper-case name first and the lower-case one if that
    is unset or empty; a value without a scheme and host (`proxy:3128`) means http://. NO_PROXY
    (or no_proxy) lists, comma-separated, what is reached directly: `*` (everything), a domain
    (itself and its subdomains; `.example.com` or `*.example.com` only the subdomains), an IP
    address or a CIDR, a domain or address with `:port` (that port only). `localhost` and
    loopback addresses are never proxied. Go's CGI guard (HTTP_PROXY ignored when REQUEST_METHOD
    is set) is left out: a controller manager is no CGI script.
    """
    if proxy_url:
        return proxy_url
    parts = urlsplit(server_url)
    names = _ENV.get(parts.scheme)
    proxy = _first(environ, names) if names else ""
    if not proxy:
        return None
    port = str(parts.port or _DEFAULT_PORTS[parts.scheme])
    if not _use_proxy(_ascii(parts.hostname or ""), port, _first(environ, ("NO_PROXY", "no_proxy"))):
        return None
    return _with_scheme(proxy)


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    return next((environ[name] for name in names if environ.get(name)), "")


def _with_scheme(value: str) -> str | None:
    """Go's parseProxy: a value that is not a URL with a scheme and a host is tried as http://value;
    one that does not parse either way is ignored, as Go ignores it."""
    try:
        parts = urlsplit(value)
        if parts.scheme and parts.netloc:
            return value
    except ValueError:
        pass
    try:
        urlsplit("http://" + value).port  # noqa: B018 - raises for a bad address or port
    except ValueError:
        return None
    return "http://" + value


def _use_proxy(host: str, port: str, no_proxy: str) -> bool:
    """httpproxy's useProxy: False for localhost, a loopback address, or a NO_PROXY match."""
    if host == "localhost":
        return False
    ip = _ip(host)
    if ip is not None and ip.is_loopback:
        return False
    for entry in no_proxy.split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return False
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                pass
            else:
                if ip is not None and ip in network:
                    return False
                continue
        entry_host, entry_port = _split_host_port(entry) or (entry, "")
        if entry_port and entry_port != port:
            continue
        entry_ip = _ip(entry_host)
        if entry_ip is not None:
            if entry_ip == ip:
                return False
            continue
        if not entry_host or ip is not None:  # a domain never matches an address
            continue
        if entry_host.startswith("*."):
            entry_host = entry_host[1:]
        exact = not entry_host.startswith(".")  # example.com: itself too; .example.com: subdomains only
        suffix = _ascii("." + entry_host if exact else entry_host)
        if host.endswith(suffix) or (exact and host == suffix[1:]):
            return False
    return True


def _ip(text: str) -> _IP | None:
    """An address, an IPv4-mapped IPv6 one as its IPv4 address (Go's net.IP compares them equal)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped or ip


def _split_host_port(text: str) -> tuple[str, str] | None:
    """Go's net.SplitHostPort: host:port or [v6]:port; None when there is no port to split off."""
    colon = text.rfind(":")
    if colon < 0:
        return None
    if text.startswith("["):
        end = text.find("]")
        if end + 1 != colon or "[" in text[1:] or "]" in text[end + 1 :]:
            return None
        return text[1:end], text[colon + 1 :]
    host = text[:colon]
    if ":" in host or "[" in text or "]" in text:
        return None
    return host, text[colon + 1 :]


def _ascii(name: str) -> str:
    """A domain as IDNA ASCII, as httpproxy compares them; left as it is if it will not convert."""
    if name.isascii():
        return name
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        return name


# -- the tunnel ---------------------------------------------------------------------------------------


async def open_tunnel(
    loop: asyncio.AbstractEventLoop,
    proxy: Proxy,
    host: str,
    port: int,
    protocol: asyncio.Protocol,
    ssl_context: ssl.SSLContext | None,
    server_name: str | None = None,
) -> None:
    """Connect `protocol` to host:port through `proxy`'s CONNECT tunnel, over TLS with
    `ssl_context` (checked against `server_name`, else `host`) unless it is None; the protocol's
    connection_made() is given the transport to use. ProxyRefused when the proxy does not open
    the tunnel; the caller's timeout covers the connect, the CONNECT exchange and the handshake."""
    target = join_host_port(host, port)
    reply = _ConnectReply(loop, proxy.address, target)
    # An https:// proxy is spoken to with the API server's TLS settings (its CA, client certificate
    # and tls-server-name), as net/http's addTLS does with the transport's TLSClientConfig.
    outer = ({"ssl": ssl_context or default_tls_context(), "server_hostname": server_name or proxy.host}
             if proxy.tls else {})
    transport, _ = await loop.create_connection(lambda: reply, proxy.host, proxy.port, **outer)
    try:
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
        if proxy.authorization:
            head += f"Proxy-Authorization: {proxy.authorization}\r\n"
        transport.write(f"{head}\r\n".encode("latin-1"))
        status_line = await reply.head
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1.") or not (rest[:3].isascii() and rest[:3].isdigit()):
            raise ProxyRefused(f"proxy {proxy.address} did not answer CONNECT to {target} in HTTP: {status_line!r}")
        if not 200 <= int(rest[:3]) < 300:
            raise ProxyRefused(f"proxy {proxy.address} refused CONNECT to {target}: {status_line}")
        # Bytes past the answer's head are dropped, as Go does: a server speaks only when spoken to.
        if ssl_context is None:
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
        else:  # start_tls() does not call connection_made(): the protocol is told of its transport here
            tls = await loop.start_tls(transport, protocol, ssl_context, server_hostname=server_name or host)
            protocol.connection_made(tls)
    except BaseException:
        reply.head.cancel()  # a failure the abort below reports has no one to hear it
        transport.abort()
        raise


@functools.cache
def default_tls_context() -> ssl.SSLContext:
    """The system's trust for an https:// proxy in front of an http:// server: built once, as loading
    the CA bundle blocks the loop for tens of milliseconds (a context serves any number of connections)."""
    return verifying_context()


class _ConnectReply(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT up to the end of its head; `head` is its status line."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proxy: str, target: str) -> None:
        self.head: asyncio.Future[str] = loop.create_future()
        self._proxy, self._target = proxy, target
        self._buf = b""

    def data_received(self, data: bytes) -> None:
        if self.head.done():
            return
        self._buf += data
        lines = self._buf.replace(b"\r\n", b"\n")  # Go's ReadResponse takes bare LFs too
        if b"\n\n" in lines:
            status_line = lines.partition(b"\n")[0].decode("latin-1")
            self.head.set_result(" ".join(status_line.split())[:200])
        elif len(self._buf) > MAX_HEAD:
            self._fail(f"sent over {MAX_HEAD} bytes answering")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self._fail("closed the connection before answering", f": {one_line(exc)}" if exc else "")

    def _fail(self, what: str, reason: str = "") -> None:
        self.head.set_exception(ProxyRefused(f"proxy {self._proxy} {what} CONNECT to {self._target}{reason}"))
