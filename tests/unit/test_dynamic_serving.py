"""The secure port's certificate and client CA are reloaded while serving, as the apiserver's
dynamiccertificates do for KCM: the serving pair when its files change (or at least every
minute), the client CA from its ConfigMap every minute."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from pykcm.serving import dynamiccerts
from pykcm.serving.certs import ServingError, self_signed_certificate
from pykcm.serving.dynamiccerts import DynamicServingTLS
from pykcm.testenv.certs import Pki, ensure_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return ensure_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[ssl.SSLContext], Awaitable[int]]]:
    runners: list[web.AppRunner] = []

    async def whoami(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(pair[0] for pair in (peer or {}).get("subject", ()))
        return web.json_response({"cn": subject.get("commonName")})

    async def start(context: ssl.SSLContext) -> int:
        app = web.Application()
        app.router.add_get("/whoami", whoami)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    yield start
    for runner in runners:
        await runner.cleanup()


def write_pair(directory: Path, pair: tuple[bytes, bytes]) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(pair[0])
    key.write_bytes(pair[1])
    return cert, key


async def served_serial(port: int) -> int:
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


def serial(pair: tuple[bytes, bytes]) -> int:
    return x509.load_pem_x509_certificate(pair[0]).serial_number


async def client_cn(port: int, pki: Pki) -> str | None:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.load_cert_chain(pki.admin_cert, pki.admin_key)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
        session.get(f"https://127.0.0.1:{port}/whoami") as resp,
    ):
        return (await resp.json())["cn"]


async def test_a_replaced_serving_pair_is_served_once_its_files_change(serve, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(dynamiccerts, "FILE_CHECK", 0.05)
    first, second = self_signed_certificate("127.0.0.1"), self_signed_certificate("127.0.0.1")
    cert, key = write_pair(tmp_path, first)
    tls = DynamicServingTLS(str(cert), str(key), "127.0.0.1", None)
    port = await serve(tls.context)
    refresher = asyncio.create_task(tls.run(None))
    try:
        assert await served_serial(port) == serial(first)
        write_pair(tmp_path, second)

        async def rotated() -> bool:
            return await served_serial(port) == serial(second)

        for _ in range(40):
            if await rotated():
                break
            await asyncio.sleep(0.05)
        assert await rotated()
    finally:
        refresher.cancel()


async def test_a_broken_replacement_keeps_serving_the_old_pair(serve, tmp_path: Path, caplog) -> None:
    first, second = self_signed_certificate("127.0.0.1"), self_signed_certificate("127.0.0.1")
    cert, key = write_pair(tmp_path, first)
    tls = DynamicServingTLS(str(cert), str(key), "127.0.0.1", None)
    port = await serve(tls.context)
    cert.write_bytes(second[0])  # the new certificate, the old key: not a pair
    assert tls.reload_pair() is False
    assert await served_serial(port) == serial(first)
    assert any("Cannot load the serving certificate" in r.getMessage() for r in caplog.records)
    key.write_bytes(second[1])
    assert tls.reload_pair() is True
    assert await served_serial(port) == serial(second)


def test_unreadable_files_at_start_are_a_serving_error(tmp_path: Path) -> None:
    with pytest.raises(ServingError):
        DynamicServingTLS(str(tmp_path / "nope.crt"), str(tmp_path / "nope.key"), "127.0.0.1", None)


@pytest.mark.parametrize(("broken", "message"), [(0, "no PEM certificate in "), (1, "no PEM private key in ")])
def test_a_file_that_is_not_pem_is_named(tmp_path: Path, broken: int, message: str) -> None:
    # The ssl module says only "[SSL] PEM lib (_ssl.c:3905)" for either half.
    pair = list(self_signed_certificate("127.0.0.1"))
    pair[broken] = b"not PEM\n"
    cert, key = write_pair(tmp_path, (pair[0], pair[1]))
    with pytest.raises(ServingError, match="^invalid serving certificate: " + message + str([cert, key][broken])):
        DynamicServingTLS(str(cert), str(key), "127.0.0.1", None)


async def test_the_client_ca_is_refreshed_every_minute(serve, pki: Pki, monkeypatch) -> None:
    monkeypatch.setattr(dynamiccerts, "CLIENT_CA_REFRESH", 0.05)
    answers: list[str | None] = [None, pki.ca_cert.read_text()]

    async def fetch() -> str | None:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    tls = DynamicServingTLS(None, None, "127.0.0.1", None)
    port = await serve(tls.context)
    assert await client_cn(port, pki) is None  # no CA yet: the client certificate is not asked for
    refresher = asyncio.create_task(tls.run(fetch))
    try:
        for _ in range(40):
            if await client_cn(port, pki) == "pykcm-admin":
                break
            await asyncio.sleep(0.05)
        assert await client_cn(port, pki) == "pykcm-admin"
    finally:
        refresher.cancel()


async def test_a_failed_client_ca_read_keeps_the_current_one(serve, pki: Pki, monkeypatch) -> None:
    monkeypatch.setattr(dynamiccerts, "CLIENT_CA_REFRESH", 0.01)
    from pykcm.client.errors import TransportError

    async def fetch() -> str | None:
        raise TransportError("GET configmaps: connection refused")

    tls = DynamicServingTLS(None, None, "127.0.0.1", pki.ca_cert.read_text())
    port = await serve(tls.context)
    refresher = asyncio.create_task(tls.run(fetch))
    await asyncio.sleep(0.1)
    refresher.cancel()
    assert await client_cn(port, pki) == "pykcm-admin"


def test_keeps_its_pair_when_the_files_are_copied_unchanged(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, self_signed_certificate("127.0.0.1"))
    tls = DynamicServingTLS(str(cert), str(key), "127.0.0.1", None)
    shutil.copy(cert, tmp_path / "copy")
    shutil.move(tmp_path / "copy", cert)  # new inode, same content
    assert tls.reload_pair() is False
