"""Client certificate files named by the kubeconfig are re-read, as client-go's cert rotation
(transport/cert_rotation.go) does: a rotated pair is used from the next check on, and the
connections opened with the old one are closed."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from pykcm.client import rest
from pykcm.client.config import ClientConfig, tls_context
from pykcm.client.rest import RestClient
from pykcm.testenv.certs import Pki, ensure_pki
from tests.support import loopback_server


def client_for(server: str, pki: Pki, cert: Path, key: Path) -> RestClient:
    config = ClientConfig(
        host=server, ssl_context=tls_context(str(pki.ca_cert), True, str(cert), str(key)),
        ca_file=str(pki.ca_cert), cert_file=str(cert), key_file=str(key),
    )
    return RestClient(config)


async def test_a_rotated_client_certificate_is_used_after_the_next_check(
    mtls_server: str, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(rest, "monotonic", lambda: now[0])
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    shutil.copy(pki.admin_cert, cert)
    shutil.copy(pki.admin_key, key)
    client = client_for(mtls_server, pki, cert, key)
    try:
        assert (await client.request("GET", "/whoami"))["cn"] == "pykcm-admin"
        shutil.copy(pki.kcm_cert, cert)  # rotated in place, as cert-manager or kubelet would
        shutil.copy(pki.kcm_key, key)
        assert (await client.request("GET", "/whoami"))["cn"] == "pykcm-admin"  # not re-read yet
        now[0] += rest.CLIENT_CERT_REFRESH
        assert (await client.request("GET", "/whoami"))["cn"] == "system:kube-controller-manager"
    finally:
        await client.close()


async def test_a_half_written_pair_keeps_the_old_one(
    mtls_server: str, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(rest, "monotonic", lambda: now[0])
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    shutil.copy(pki.admin_cert, cert)
    shutil.copy(pki.admin_key, key)
    client = client_for(mtls_server, pki, cert, key)
    try:
        shutil.copy(pki.kcm_cert, cert)  # the new certificate, but still the old key
        now[0] += rest.CLIENT_CERT_REFRESH
        assert (await client.request("GET", "/whoami"))["cn"] == "pykcm-admin"
        shutil.copy(pki.kcm_key, key)
        now[0] += rest.CLIENT_CERT_REFRESH
        assert (await client.request("GET", "/whoami"))["cn"] == "system:kube-controller-manager"
    finally:
        await client.close()


async def test_a_rotated_ca_file_is_trusted_after_the_next_check(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # KCM 1.36 re-reads its CA file (ClientsAllowCARotation, beta and on), a pod's ca.crt included.
    now = [1000.0]
    monkeypatch.setattr(rest, "monotonic", lambda: now[0])
    new_pki = ensure_pki(tmp_path / "new-pki")  # the cluster's new CA, and the apiserver's certificate from it

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({})

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(new_pki.apiserver_cert, new_pki.apiserver_key)
    ca = tmp_path / "ca.crt"
    shutil.copy(pki.ca_cert, ca)  # still the old CA
    async with loopback_server(hello, ctx) as server:
        client = RestClient(ClientConfig(host=server, ssl_context=tls_context(str(ca)), ca_file=str(ca)))
        try:
            with pytest.raises(rest.TransportError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.request("GET", "/hello")
            shutil.copy(new_pki.ca_cert, ca)
            now[0] += rest.CLIENT_CERT_REFRESH
            assert await client.request("GET", "/hello") == {}
        finally:
            await client.close()
