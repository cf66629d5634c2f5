"""KCM's client CA and serving-pair options on the secure port: --client-ca-file (the only client CA,
re-read when it changes), --authentication-skip-lookup, the start-up lookup of
kube-system/extension-apiserver-authentication (fatal unless --authentication-tolerate-lookup-failure),
--cert-dir, and the self-signed certificate client-go makes for KCM."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import stat
from pathlib import Path

import aiohttp
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from pykcm.app import manager as manager_module
from pykcm.app.manager import Manager, ManagerError
from pykcm.app.options import Options
from pykcm.client.config import ClientConfig
from pykcm.client.errors import Forbidden, NotFound
from pykcm.serving import certs, dynamiccerts
from pykcm.serving.certs import ServingError, cert_dir_pair, self_signed_certificate
from pykcm.serving.dynamiccerts import DynamicServingTLS
from pykcm.testenv.certs import Pki, ensure_pki, issue_client_cert
from tests.support import free_port

FORBIDDEN = ('configmaps "extension-apiserver-authentication" is forbidden: User "system:serviceaccount:kube-system:'
             'nobody" cannot get resource "configmaps" in API group "" in the namespace "kube-system"')


@pytest.fixture(scope="module")
def cluster_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return ensure_pki(tmp_path_factory.mktemp("cluster"))


@pytest.fixture(scope="module")
def narrow_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Another CA, with `carol` signed by it."""
    pki = ensure_pki(tmp_path_factory.mktemp("narrow"))
    issue_client_cert(pki, "carol", "carol")
    return pki


async def whoami(port: int, cert: Path, key: Path) -> str:
    """The user the secure port takes the client certificate for, from its 403 (no one is authorized
    here but system:masters); "TLS failure" where the handshake refuses the certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.load_cert_chain(cert, key)
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
            session.get(f"https://127.0.0.1:{port}/metrics") as resp,
        ):
            if resp.status == 200:
                return "system:masters"
            return orjson.loads(await resp.read())["message"].split('"')[1]
    except aiohttp.ClientError:
        return "TLS failure"


def manager(**options: object) -> Manager:
    opts = Options(secure_port=free_port(), bind_address="127.0.0.1", **options)  # type: ignore[arg-type]
    return Manager(opts, ClientConfig(host="https://127.0.0.1:1", ssl_context=None), [])


async def start(mgr: Manager) -> None:
    await mgr._start_server(await mgr._serving_tls())
    assert mgr.server is not None
    mgr.server.authorizer.client = None  # no SubjectAccessReview: a 403 that names the user


async def stop(mgr: Manager) -> None:
    if mgr._tls_refresh is not None:
        mgr._tls_refresh.cancel()
    if mgr.server is not None:
        await mgr.server.stop()
    for client in (*mgr._extra_clients, mgr.client):
        await client.close()


def lookups(monkeypatch: pytest.MonkeyPatch, answer: BaseException | str | None) -> list[str]:
    """The ConfigMap reads the manager makes, answered with `answer` (raised if an exception)."""
    calls: list[str] = []

    async def read(client: object) -> str | None:
        calls.append("read")
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(certs, "read_client_ca", read)
    return calls


def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "authn.kubeconfig"
    path.write_text(orjson.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "nobody"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }).decode())
    return str(path)


# -- --client-ca-file ---------------------------------------------------------------------------------


async def test_the_client_ca_file_is_the_only_client_ca(cluster_pki: Pki, narrow_pki: Pki, monkeypatch) -> None:
    calls = lookups(monkeypatch, cluster_pki.ca_cert.read_text())
    mgr = manager(client_ca_file=str(narrow_pki.ca_cert))
    try:
        await start(mgr)
        port = mgr.options.secure_port
        carol = narrow_pki.ca_cert.with_name("carol.crt"), narrow_pki.ca_cert.with_name("carol.key")
        assert await whoami(port, *carol) == "carol"
        # The cluster CA's system:masters certificate is not trusted: it gets no further than the handshake.
        assert await whoami(port, cluster_pki.admin_cert, cluster_pki.admin_key) == "TLS failure"
        assert calls == []  # the ConfigMap is not read for the client CA
    finally:
        await stop(mgr)


async def test_the_client_ca_file_is_re_read_when_it_changes(cluster_pki: Pki, narrow_pki: Pki, tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.setattr(dynamiccerts, "FILE_CHECK", 0.05)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(narrow_pki.ca_cert.read_bytes())
    tls = DynamicServingTLS(None, None, "127.0.0.1", cluster_pki.ca_cert.read_text(), client_ca_file=str(ca_file))
    assert tls._client_ca == narrow_pki.ca_cert.read_text()
    refresher = asyncio.create_task(tls.run(None))
    try:
        ca_file.write_text("not PEM\n")  # logged, the previous CA kept
        await asyncio.sleep(0.2)
        assert tls._client_ca == narrow_pki.ca_cert.read_text()
        ca_file.write_bytes(cluster_pki.ca_cert.read_bytes() + b"\n")
        for _ in range(40):
            if tls._client_ca == cluster_pki.ca_cert.read_text() + "\n":
                break
            await asyncio.sleep(0.05)
        assert tls._client_ca == cluster_pki.ca_cert.read_text() + "\n"
    finally:
        refresher.cancel()


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "unable to load client CA provider: No such file or directory: {path}"),
     (b"", 'unable to load client CA provider: missing content for CA bundle "client-ca-bundle::{path}"'),
     (b"not PEM\n", 'unable to load client CA provider: error loading CA bundle for "client-ca-bundle::{path}": '
                    "data does not contain any valid RSA or ECDSA certificates")],
)
def test_a_client_ca_file_that_does_not_load_stops_the_start(tmp_path: Path, content: bytes | None,
                                                               message: str) -> None:
    path = tmp_path / "ca.crt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ServingError) as err:
        DynamicServingTLS(None, None, "127.0.0.1", None, client_ca_file=str(path))
    assert str(err.value) == message.format(path=path)


async def test_skip_lookup_reads_no_configmap_and_trusts_no_client_certificate(cluster_pki: Pki, monkeypatch) -> None:
    calls = lookups(monkeypatch, cluster_pki.ca_cert.read_text())
    mgr = manager(authentication_skip_lookup=True)
    try:
        await start(mgr)
        # KCM: anonymous (403); the certificate is not even asked for.
        admin = cluster_pki.admin_cert, cluster_pki.admin_key
        assert await whoami(mgr.options.secure_port, *admin) == "system:anonymous"
        assert calls == []
    finally:
        await stop(mgr)


# -- the start-up lookup ------------------------------------------------------------------------------


async def test_a_failed_lookup_with_an_authentication_kubeconfig_stops_the_start(tmp_path: Path, monkeypatch) -> None:
    lookups(monkeypatch, Forbidden(403, "Forbidden", FORBIDDEN))
    mgr = manager(authentication_kubeconfig=kubeconfig(tmp_path))
    try:
        with pytest.raises(ManagerError) as err:
            await mgr._start_server(await mgr._serving_tls())
        assert str(err.value) == f"unable to load configmap based request-header-client-ca-file: {FORBIDDEN}"
        assert mgr.server is None
    finally:
        await stop(mgr)


@pytest.mark.parametrize(
    ("options", "answer"),
    [({"authentication_tolerate_lookup_failure": True}, Forbidden(403, "Forbidden", FORBIDDEN)),
     ({}, NotFound(404, "NotFound", 'configmaps "extension-apiserver-authentication" not found'))],
)
async def test_a_tolerated_failure_or_a_missing_configmap_only_warns(
    tmp_path: Path, monkeypatch, caplog, options: dict, answer: Exception
) -> None:
    lookups(monkeypatch, answer)
    mgr = manager(authentication_kubeconfig=kubeconfig(tmp_path), **options)
    try:
        with caplog.at_level(logging.WARNING):
            await mgr._start_server(await mgr._serving_tls())
        assert mgr.server is not None
        assert any("Client certificates will not be accepted" in r.getMessage() for r in caplog.records)
    finally:
        await stop(mgr)


async def test_in_a_pod_a_failed_lookup_stops_the_start_without_an_authentication_kubeconfig(monkeypatch) -> None:
    # KCM's delegated client is then the pod's service account (InClusterConfig): its failure is fatal.
    lookups(monkeypatch, Forbidden(403, "Forbidden", FORBIDDEN))
    monkeypatch.setattr(manager_module, "in_cluster", lambda: object())
    mgr = manager()
    try:
        with pytest.raises(ManagerError, match="unable to load configmap based request-header-client-ca-file"):
            await mgr._start_server(await mgr._serving_tls())
    finally:
        await stop(mgr)


async def test_with_the_main_credentials_a_failed_lookup_only_warns(monkeypatch, caplog) -> None:
    # pykcm's own default (KCM out of cluster, with no --authentication-kubeconfig, looks nothing up).
    calls = lookups(monkeypatch, Forbidden(403, "Forbidden", FORBIDDEN))
    mgr = manager()
    try:
        await mgr._start_server(await mgr._serving_tls())
        assert mgr.server is not None and calls == ["read"]
    finally:
        await stop(mgr)


# -- the self-signed certificate and --cert-dir ---------------------------------------------------------


@pytest.mark.parametrize(("bind", "ips"), [("0.0.0.0", ["127.0.0.1"]), ("10.1.2.3", ["127.0.0.1", "10.1.2.3"])])
def test_the_self_signed_certificate_is_client_gos(bind: str, ips: list[str]) -> None:
    cert_pem, key_pem = self_signed_certificate(bind)
    leaf, ca = x509.load_pem_x509_certificates(cert_pem)  # a chain of two, as KCM serves it
    assert isinstance(leaf.public_key(), rsa.RSAPublicKey) and leaf.public_key().key_size == 2048
    assert key_pem.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    cn = leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    ca_cn = ca.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    assert str(cn).startswith("localhost@") and ca_cn == f"localhost-ca@{str(cn).split('@')[1]}"
    assert leaf.issuer == ca.subject and ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ips
    leaf.verify_directly_issued_by(ca)


def test_cert_dir_keeps_the_generated_pair_for_the_next_start(tmp_path: Path, caplog) -> None:
    directory = tmp_path / "certs"
    with caplog.at_level(logging.INFO):
        cert, key = cert_dir_pair(str(directory), "127.0.0.1")
    assert (cert, key) == tuple(str(directory / f"kube-controller-manager.{ext}") for ext in ("crt", "key"))
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert any(r.getMessage() == f"Generated self-signed cert ({cert}, {key})" for r in caplog.records)
    first = Path(cert).read_bytes()
    assert cert_dir_pair(str(directory), "127.0.0.1") == (cert, key)
    assert Path(cert).read_bytes() == first  # read, not made again
    served = DynamicServingTLS(cert, key, "127.0.0.1", None)
    assert served.cert_file == cert  # served from the files, reloaded when they change


def test_cert_dir_with_half_a_pair_is_kcms_error(tmp_path: Path) -> None:
    (tmp_path / "kube-controller-manager.crt").write_bytes(self_signed_certificate("127.0.0.1")[0])
    with pytest.raises(ServingError) as err:
        cert_dir_pair(str(tmp_path), "127.0.0.1")
    assert str(err.value) == ("error creating self-signed certificates: error reading "
                              f"{tmp_path}/kube-controller-manager.key, certificate and key must be supplied as a pair")


async def test_the_manager_serves_the_cert_dir_pair_unless_a_tls_cert_file_is_given(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    lookups(monkeypatch, None)
    mgr = manager(cert_dir=str(tmp_path))
    try:
        await mgr._start_server(await mgr._serving_tls())
        served = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", mgr.options.secure_port))
        assert x509.load_pem_x509_certificate(served.encode()) == x509.load_pem_x509_certificates(
            (tmp_path / "kube-controller-manager.crt").read_bytes())[0]
    finally:
        await stop(mgr)
    given = tmp_path / "given"
    given.mkdir()
    for name, data in zip(("tls.crt", "tls.key"), self_signed_certificate("127.0.0.1"), strict=True):
        (given / name).write_bytes(data)
    mgr = manager(cert_dir=str(tmp_path / "unused"), tls_cert_file=str(given / "tls.crt"),
                  tls_private_key_file=str(given / "tls.key"))
    try:
        await mgr._start_server(await mgr._serving_tls())
        assert not (tmp_path / "unused").exists()
    finally:
        await stop(mgr)


def test_a_cert_dir_that_is_a_file_is_not_a_directory(tmp_path: Path) -> None:
    # KCM: "error creating self-signed certificates: mkdir afile: not a directory"
    (tmp_path / "afile").write_text("")
    with pytest.raises(ServingError, match=r"^error creating self-signed certificates: Not a directory: .*afile$"):
        cert_dir_pair(str(tmp_path / "afile"), "127.0.0.1")
