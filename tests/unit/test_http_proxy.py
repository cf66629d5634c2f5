"""Proxies and tls-server-name for the HTTP/1.1 client (pykcm.client.http): which proxy an API
server's requests go through (pykcm.client.proxy.proxy_for, Go's ProxyFromEnvironment rules), and
the CONNECT tunnel through it, against an in-process proxy in front of an in-process TLS server
on loopback whose certificate names only apiserver.test, never 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pykcm.app import eventloop
from pykcm.client import retry
from pykcm.client.config import load_config, tls_context
from pykcm.client.http import ConnectionPool, Timeout
from pykcm.client.proxy import ProxyRefused, default_tls_context, proxy_for
from pykcm.client.rest import RestClient
from pykcm.testenv.certs import ensure_pki
from pykcm.util.log import one_line
from tests.support import loopback_server
from tests.unit.test_fence import LOOPS
from tests.unit.test_http import QUICK, Handler, ok, raw_server, read_request

SERVER_NAME = "apiserver.test"
PROXY = "http://proxy.corp:3128"
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path  # for SERVER_NAME only, signed by the CA
    key: Path

    def server(self, sni: list[str | None] | None = None) -> ssl.SSLContext:
        """A serving context; `sni` collects the name each client asked for."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        if sni is not None:
            ctx.sni_callback = lambda _obj, name, _ctx: sni.append(name)
        return ctx

    def client(self) -> ssl.SSLContext:
        """What a kubeconfig's certificate-authority makes: the CA, names checked."""
        return tls_context(str(self.ca))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """testenv's CA, and a serving certificate it signs for SERVER_NAME alone (testenv's own name 127.0.0.1),
    without an Authority Key Identifier (as some tools make them: Go does not ask for one)."""
    directory = tmp_path_factory.mktemp("pki")
    pki = ensure_pki(directory)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return Certs(pki.ca_cert, directory / "server.crt", directory / "server.key")


# -- which proxy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("server", "environ", "expected"), [
    ("https://10.0.0.1:6443", {}, None),
    ("https://10.0.0.1:6443", {"HTTPS_PROXY": PROXY}, PROXY),
    ("https://10.0.0.1:6443", {"HTTP_PROXY": PROXY}, None),  # the server's scheme picks the variable
    ("http://10.0.0.1:8080", {"HTTP_PROXY": PROXY, "HTTPS_PROXY": "http://other:1"}, PROXY),
    ("https://10.0.0.1:6443", {"HTTPS_PROXY": PROXY, "https_proxy": "http://lower:1"}, PROXY),  # upper case wins
    ("https://10.0.0.1:6443", {"HTTPS_PROXY": "", "https_proxy": "http://lower:1"}, "http://lower:1"),
    ("https://10.0.0.1:6443", {"https_proxy": "http://lower:1"}, "http://lower:1"),
    ("https://10.0.0.1:6443", {"HTTPS_PROXY": "proxy.corp:3128"}, PROXY),  # no scheme: http://
    ("https://10.0.0.1:6443", {"HTTPS_PROXY": "10.9.9.9:3128"}, "http://10.9.9.9:3128"),
    ("https://10.0.0.1:6443", {"HTTPS_PROXY": "https://proxy.corp"}, "https://proxy.corp"),
])
def test_the_environment_names_the_proxy_for_the_servers_scheme(
    server: str, environ: dict[str, str], expected: str | None
) -> None:
    assert proxy_for(server, None, environ) == expected


@pytest.mark.parametrize(("server", "no_proxy", "proxied"), [
    ("https://10.0.0.1:6443", "", True),
    ("https://example.com", "example.com", False),  # a domain: itself...
    ("https://api.example.com", "example.com", False),  # ...and its subdomains
    ("https://notexample.com", "example.com", True),
    ("https://api.example.com", ".example.com", False),  # a leading dot: subdomains only
    ("https://example.com", ".example.com", True),
    ("https://api.example.com", "*.example.com", False),
    ("https://example.com", "*.example.com", True),
    ("https://api.example.com:6443", "example.com:6443", False),  # with a port: that port only
    ("https://api.example.com:6443", "example.com:443", True),
    ("https://api.example.com", "example.com:443", False),  # https's default port
    ("https://10.0.0.1:6443", "10.0.0.1", False),  # an address
    ("https://10.0.0.1:6443", "10.0.0.2", True),
    ("https://10.0.0.1:6443", "10.0.0.1:6443", False),
    ("https://10.0.0.1:6443", "10.0.0.1:443", True),
    ("https://10.0.0.1:6443", "10.0.0.0/8", False),  # a CIDR
    ("https://11.0.0.1:6443", "10.0.0.0/8", True),
    ("https://[fd00::1]:6443", "fd00::/8", False),
    ("https://[fd00::1]:6443", "fd00::1", False),
    ("https://[fd00::1]:6443", "[fd00::1]:6443", False),
    ("https://[fd00::1]:6443", "[fd00::1]:443", True),
    ("https://10.0.0.1:6443", "10.0.0.1.example.com", True),  # a domain never matches an address
    ("https://API.Example.com", " other.org , EXAMPLE.COM ", False),  # trimmed, any case
    ("https://10.0.0.1:6443", "other.org,*", False),  # * : nothing is proxied
])
def test_no_proxy(server: str, no_proxy: str, proxied: bool) -> None:
    assert proxy_for(server, None, {"HTTPS_PROXY": PROXY, "NO_PROXY": no_proxy}) == (PROXY if proxied else None)


def test_no_proxy_upper_case_wins() -> None:
    environ = {"HTTPS_PROXY": PROXY, "NO_PROXY": "other.org", "no_proxy": "example.com"}
    assert proxy_for("https://api.example.com", None, environ) == PROXY
    assert proxy_for("https://api.example.com", None, {**environ, "NO_PROXY": ""}) is None


@pytest.mark.parametrize("server", [
    "https://localhost:6443", "https://127.0.0.1:6443", "https://127.8.9.10", "https://[::1]:6443",
    "https://[::ffff:127.0.0.1]:6443", "http://127.0.0.1:8080",
])
def test_localhost_and_loopback_addresses_are_never_proxied_from_the_environment(server: str) -> None:
    assert proxy_for(server, None, {"HTTPS_PROXY": PROXY, "HTTP_PROXY": PROXY}) is None


def test_the_kubeconfigs_proxy_url_beats_the_environment() -> None:
    """client-go makes it an http.ProxyURL: every request, loopback and NO_PROXY included."""
    environ = {"HTTPS_PROXY": "http://env:1", "NO_PROXY": "*"}
    assert proxy_for("https://10.0.0.1:6443", PROXY, environ) == PROXY
    assert proxy_for("https://127.0.0.1:6443", PROXY, {}) == PROXY
    assert proxy_for("https://10.0.0.1:6443", "", {"HTTPS_PROXY": "http://env:1"}) == "http://env:1"


@pytest.mark.parametrize(("proxy", "message"), [
    ("socks5://user:secret@127.0.0.1:1080",
     "proxy socks5://127.0.0.1:1080: socks5 proxies are not supported, only http:// and https://"),
    ("ftp://127.0.0.1:21", "proxy ftp://127.0.0.1:21: unsupported scheme 'ftp', must be http or https"),
    ("http://user:secret@:3128", "proxy http://:3128: no host"),
    ("http://127.0.0.1:99999", "invalid proxy URL: Port out of range 0-65535"),
], ids=["socks5", "ftp", "no-host", "bad-port"])
def test_a_proxy_the_pool_cannot_use_is_refused_at_construction(proxy: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        ConnectionPool("https://10.0.0.1:6443", None, limit=1, proxy=proxy)
    assert str(err.value) == message


# -- an in-process proxy ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(handle: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """raw_server's, as host:port."""
    async with raw_server(handle, ssl_context) as url:
        yield urlsplit(url).netloc


@dataclass
class Proxy:
    url: str
    connects: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # line, Host, Proxy-Authorization


@contextlib.asynccontextmanager
async def connect_proxy(
    answer: bytes | None = ESTABLISHED, auth: str | None = None, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[Proxy]:
    """A CONNECT proxy on 127.0.0.1 that records each request: a 407 unless its Proxy-Authorization
    is `auth` (when given), else `answer` (None: never answers), and after a 200 the bytes piped
    both ways to the target, which must be on 127.0.0.1."""
    seen: list[tuple[str, str | None, str | None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in head[1:] if line)
        seen.append((head[0], headers.get("Host"), headers.get("Proxy-Authorization")))
        if auth is not None and headers.get("Proxy-Authorization") != auth:
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            return
        if answer is None:
            await asyncio.sleep(3600)
        host, _, port = head[0].split(" ")[1].rpartition(":")
        if not answer.startswith(b"HTTP/1.1 200") or host != "127.0.0.1":  # loopback only
            writer.write(answer)
            return
        upstream_reader, upstream = await asyncio.open_connection(host, int(port))
        writer.write(answer)
        try:
            await asyncio.gather(pipe(reader, upstream), pipe(upstream_reader, writer))
        finally:
            upstream.close()

    async with serving(handle, ssl_context) as address:
        yield Proxy(f"{'https' if ssl_context else 'http'}://{address}", seen)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Until either side is done; then the other side is closed too."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def echo_path(request: web.Request) -> web.StreamResponse:
    return web.json_response({"path": request.path})


# -- the tunnel -------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_requests_go_through_one_kept_alive_connect_tunnel(loop: str, certs: Certs) -> None:
    """Two requests through a proxy that wants credentials: one CONNECT naming the server, with the
    URL's user info decoded into Basic credentials as Go does; TLS to the server inside the tunnel
    (its certificate checked against server_name); the second request on the same connection."""
    peers: list[object] = []
    sni: list[str | None] = []
    auth = "Basic " + base64.b64encode("us@er:pa:ss wörd".encode()).decode()

    async def handle(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return await echo_path(request)

    async def scenario() -> tuple[list[object], str, list[tuple[str, str | None, str | None]]]:
        async with loopback_server(handle, certs.server(sni)) as url, connect_proxy(auth=auth) as proxy:
            credentials = "us%40er:pa%3Ass%20w%C3%B6rd@"
            pool = ConnectionPool(url, certs.client(), limit=4, server_name=SERVER_NAME,
                                  proxy=proxy.url.replace("://", f"://{credentials}"))
            try:
                bodies = [orjson.loads((await pool.request("GET", path, {}, None, QUICK)).body)
                          for path in ("/a", "/b")]
            finally:
                await pool.close()
            return bodies, urlsplit(url).netloc, proxy.connects

    bodies, target, connects = eventloop.run(scenario(), use_uvloop=loop == "uvloop")
    assert bodies == [{"path": "/a"}, {"path": "/b"}]
    assert connects == [(f"CONNECT {target} HTTP/1.1", target, auth)]
    assert len(peers) == 2 and peers[0] == peers[1]  # the proxy's one upstream connection
    assert sni == [SERVER_NAME]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_https_proxy_is_spoken_to_over_tls_with_the_servers_tls_settings(loop: str, certs: Certs) -> None:
    """TLS inside TLS. As net/http, the proxy's certificate is checked with the API server's
    context and tls-server-name (the transport's TLSClientConfig): here both are SERVER_NAME's."""
    sni: list[str | None] = []

    async def scenario() -> tuple[dict, list[tuple[str, str | None, str | None]]]:
        async with (loopback_server(echo_path, certs.server()) as url,
                    connect_proxy(ssl_context=certs.server(sni)) as proxy):
            pool = ConnectionPool(url, certs.client(), limit=1, server_name=SERVER_NAME, proxy=proxy.url)
            try:
                body = orjson.loads((await pool.request("GET", "/a", {}, None, QUICK)).body)
            finally:
                await pool.close()
            return body, proxy.connects

    body, connects = eventloop.run(scenario(), use_uvloop=loop == "uvloop")
    assert body == {"path": "/a"}
    assert len(connects) == 1 and connects[0][2] is None  # no user info: no Proxy-Authorization
    assert sni == [SERVER_NAME]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_plain_http_server_is_tunnelled_with_connect_too(loop: str) -> None:
    async def scenario() -> tuple[dict, str, list[tuple[str, str | None, str | None]]]:
        async with loopback_server(echo_path) as url, connect_proxy() as proxy:
            pool = ConnectionPool(url, None, limit=1, proxy=proxy.url, server_name="ignored.test")
            try:
                body = orjson.loads((await pool.request("GET", "/a", {}, None, QUICK)).body)
            finally:
                await pool.close()
        return body, urlsplit(url).netloc, proxy.connects

    body, target, connects = eventloop.run(scenario(), use_uvloop=loop == "uvloop")
    assert body == {"path": "/a"}
    assert connects == [(f"CONNECT {target} HTTP/1.1", target, None)]


@pytest.mark.parametrize("proxied", [False, True], ids=["direct", "proxied"])
async def test_server_name_is_the_name_tls_asks_for_and_checks(certs: Certs, proxied: bool) -> None:
    """The certificate names SERVER_NAME, not the URL's 127.0.0.1: the handshake fails unless
    server_name says which name to expect (and it is the SNI sent)."""
    seen: list[str] = []
    sni: list[str | None] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        return await echo_path(request)

    async with loopback_server(handle, certs.server(sni)) as url, connect_proxy() as proxy:
        via = proxy.url if proxied else None
        unnamed = ConnectionPool(url, certs.client(), limit=1, proxy=via)
        named = ConnectionPool(url, certs.client(), limit=1, proxy=via, server_name=SERVER_NAME)
        try:
            with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
                await unnamed.request("GET", "/unnamed", {}, None, QUICK)
            assert not unnamed._conns
            assert (await named.request("GET", "/named", {}, None, QUICK)).status == 200
        finally:
            await unnamed.close()
            await named.close()
    assert seen == ["/named"]
    assert sni == [None, SERVER_NAME]  # no SNI for an IP address, as Go
    assert len(proxy.connects) == (2 if proxied else 0)


@pytest.mark.parametrize(("answer", "auth", "error"), [
    (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", None, "refused CONNECT to {}: HTTP/1.1 403 Forbidden"),
    (ESTABLISHED, "Basic eDp5", "refused CONNECT to {}: HTTP/1.1 407 Proxy Authentication Required"),
    (b"HTTP/1.0 502 Bad Gateway\n\n", None, "refused CONNECT to {}: HTTP/1.0 502 Bad Gateway"),
    (b"", None, "closed the connection before answering CONNECT to {}"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", None, "did not answer CONNECT to {} in HTTP: 'SSH-2.0-OpenSSH'"),
], ids=["403", "407", "502", "closed", "not-http"])
async def test_a_proxy_that_does_not_open_the_tunnel_is_a_refused_connection(
    certs: Certs, answer: bytes, auth: str | None, error: str
) -> None:
    """One line naming the proxy and the target; a ConnectionRefusedError, so a GET is not sent
    again for it (rest.py's retry rules); nothing reached the server."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        return await echo_path(request)

    async with loopback_server(handle, certs.server()) as url, connect_proxy(answer, auth) as proxy:
        pool = ConnectionPool(url, certs.client(), limit=1, proxy=proxy.url, server_name=SERVER_NAME)
        try:
            with pytest.raises(ProxyRefused) as err:
                await pool.request("GET", "/a", {}, None, QUICK)
            assert not pool._conns
        finally:
            await pool.close()
    message = f"proxy {urlsplit(proxy.url).netloc} {error.format(urlsplit(url).netloc)}"
    assert str(err.value) == one_line(err.value) == message
    assert isinstance(err.value, ConnectionRefusedError)
    assert retry.after_error(1, "GET", err.value, message) is None
    assert seen == []


@pytest.mark.parametrize("stall", ["connect", "handshake"])
async def test_the_connect_timeout_covers_the_connect_exchange_and_the_handshake(certs: Certs, stall: str) -> None:
    """A proxy that never answers CONNECT, or a server behind it that never answers the
    ClientHello: either way the request fails at the connect timeout, the connection let go."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async with serving(silent) as server, connect_proxy(None if stall == "connect" else ESTABLISHED) as proxy:
        pool = ConnectionPool(f"https://{server}", certs.client(), limit=1, proxy=proxy.url, server_name=SERVER_NAME)
        try:
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                await pool.request("GET", "/a", {}, None, Timeout(total=5, connect=0.3))
            assert 0.25 < time.monotonic() - start < 2
            assert not pool._conns
        finally:
            await pool.close()
    assert [line for line, _, _ in proxy.connects] == [f"CONNECT {server} HTTP/1.1"]


async def test_a_tunnel_the_server_closed_while_idle_is_let_go_and_close_is_prompt(certs: Certs) -> None:
    """The TLS transport over the tunnel reports its loss to the connection (the pool forgets it,
    the next request opens a new tunnel), and the pool's close() aborts it at once."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            received.append(request)
            writer.write(ok(b"{}"))
            await writer.drain()
            if len(received) == 1:
                return  # keep-alive promised, then closed anyway

    async with serving(handle, certs.server()) as server, connect_proxy() as proxy:
        pool = ConnectionPool(f"https://{server}", certs.client(), limit=2, proxy=proxy.url, server_name=SERVER_NAME)
        try:
            assert (await pool.request("GET", "/a", {}, None, QUICK)).status == 200
            for _ in range(100):
                if not pool._conns:
                    break
                await asyncio.sleep(0.01)
            assert not pool._conns  # connection_lost came through the TLS transport
            assert (await pool.request("GET", "/b", {}, None, QUICK)).status == 200
            conns = list(pool._conns)
        finally:
            start = time.monotonic()
            await pool.close()
        assert conns and all(conn.lost.done() for conn in conns) and time.monotonic() - start < 0.5
    assert [r.split(b" ")[1] for r in received] == [b"/a", b"/b"]
    assert len(proxy.connects) == 2


async def test_an_https_proxy_for_a_plain_http_server_builds_the_default_tls_context_once(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the server's TLS settings the proxy is checked with the system's trust, whose CA
    bundle takes tens of milliseconds of the loop to load: once, not at each tunnel."""
    built: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def default_context(**_: object) -> ssl.SSLContext:  # the test CA, standing in for the system's trust
        built.append(real(cafile=str(certs.ca)))
        return built[-1]

    monkeypatch.setattr(ssl, "create_default_context", default_context)
    default_tls_context.cache_clear()
    try:
        async with loopback_server(echo_path) as url, connect_proxy(ssl_context=certs.server()) as proxy:
            for path in ("/a", "/b"):  # a pool each: a tunnel each
                pool = ConnectionPool(url, None, limit=1, proxy=proxy.url, server_name=SERVER_NAME)
                try:
                    assert orjson.loads((await pool.request("GET", path, {}, None, QUICK)).body) == {"path": path}
                finally:
                    await pool.close()
    finally:
        default_tls_context.cache_clear()  # not the test CA's for the tests that follow
    assert len(proxy.connects) == 2 and len(built) == 1


# -- from a kubeconfig ------------------------------------------------------------------------------


async def test_a_kubeconfigs_server_name_proxy_and_impersonation_reach_the_wire(certs: Certs, tmp_path: Path) -> None:
    """tls-server-name, proxy-url and as/as-groups/as-user-extra, read from a kubeconfig, as client-go
    sends them: through the proxy, the certificate checked for the name, Impersonate-* headers
    (a group per header line)."""
    seen: list[dict[str, list[str]]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append({name: request.headers.getall(name) for name in request.headers if name.startswith("Impersonate")})
        return await echo_path(request)

    async with loopback_server(handle, certs.server()) as url, connect_proxy() as proxy:
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority": str(certs.ca),
                                                   "tls-server-name": SERVER_NAME, "proxy-url": proxy.url}}],
            "users": [{"name": "u", "user": {"token": "t", "as": "łukasz", "as-groups": ["g1", "g2"],
                                             "as-user-extra": {"scopes": ["a"]}}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x",
        }))
        client = RestClient(load_config(str(path)))
        try:
            assert await client.request("GET", "/api") == {"path": "/api"}
        finally:
            await client.close()
    # aiohttp reads header bytes as UTF-8 (surrogate-escaped otherwise): Go sends the name's UTF-8 bytes
    assert seen == [{"Impersonate-User": ["łukasz"], "Impersonate-Group": ["g1", "g2"],
                     "Impersonate-Extra-scopes": ["a"]}]  # names are case-insensitive: the apiserver lowers them
    assert len(proxy.connects) == 1


async def test_a_certificate_without_authority_key_id_verifies_as_go_verifies_it(
        certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.13's default context checks X.509 strictly (a leaf without an Authority Key
    Identifier fails); Go, so KCM, does not: neither does pykcm, whatever Python's default."""
    strict_default = ssl.create_default_context

    def as_on_python_313(*args: object, **kwargs: object) -> ssl.SSLContext:
        ctx = strict_default(*args, **kwargs)  # type: ignore[arg-type]
        ctx.verify_flags |= ssl.VERIFY_X509_STRICT
        return ctx

    monkeypatch.setattr(ssl, "create_default_context", as_on_python_313)
    async with loopback_server(echo_path, certs.server()) as url:
        strict = ConnectionPool(url, as_on_python_313(cafile=str(certs.ca)), limit=1, server_name=SERVER_NAME)
        ours = ConnectionPool(url, certs.client(), limit=1, server_name=SERVER_NAME)
        try:
            with pytest.raises(ssl.SSLCertVerificationError, match="Authority Key Identifier"):
                await strict.request("GET", "/strict", {}, None, QUICK)
            assert (await ours.request("GET", "/ours", {}, None, QUICK)).status == 200
        finally:
            await strict.close()
            await ours.close()
