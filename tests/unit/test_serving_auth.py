"""Who a client certificate is (KCM's x509 CommonNameUserConversion: uid and credential ID), as the
SubjectAccessReview and its cache see it; the always-allowed paths as apiserver's path authorizer
matches them; and the 500 after a failed review naming the request target, as KCM's RequestURI."""

from __future__ import annotations

import datetime
import hashlib
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pykcm.client.errors import Forbidden
from pykcm.serving.authn import DelegatingAuthenticator
from pykcm.serving.authz import DelegatingAuthorizer, path_allowed
from pykcm.serving.dynamiccerts import DynamicServingTLS
from pykcm.serving.server import SecureServer
from tests.support import free_port
from tests.unit.test_secure_server import secure_server
from tests.unit.test_serving_http import exchange, get


class ReviewApi:
    """The SubjectAccessReviews sent, each allowed; or every one refused with `error`."""

    def __init__(self, error: Exception | None = None) -> None:
        self.specs: list[dict[str, Any]] = []
        self.error = error

    async def request(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        self.specs.append(body["spec"])
        return {"status": {"allowed": True}}


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1)))


@pytest.fixture(scope="module")
def issue(tmp_path_factory: pytest.TempPathFactory):
    """A CA (its PEM) and a function issuing client certificates with the given subject attributes."""
    directory = tmp_path_factory.mktemp("uid-pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "uid-ca")])
    ca = (_builder(ca_name, ca_name, ca_key).add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA256()))

    def client(stem: str, *attributes: tuple[x509.ObjectIdentifier, str]) -> tuple[Path, Path, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])
        cert = (_builder(name, ca_name, key)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
                .sign(ca_key, hashes.SHA256()))
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path, cert.public_bytes(serialization.Encoding.DER)

    client.ca = ca.public_bytes(serialization.Encoding.PEM).decode()  # type: ignore[attr-defined]
    return client


async def status_with(port: int, cert: Path, key: Path) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.load_cert_chain(cert, key)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
        session.get(f"https://127.0.0.1:{port}/metrics") as resp,
    ):
        return resp.status


async def test_a_certificate_user_has_kcms_uid_and_credential_id(issue) -> None:
    api = ReviewApi()
    tls = DynamicServingTLS(None, None, "127.0.0.1", issue.ca)
    server = SecureServer("127.0.0.1", free_port(), tls.context, lambda: [], DelegatingAuthenticator(None),
                          DelegatingAuthorizer(api, []))  # type: ignore[arg-type]
    await server.start()
    try:
        cn, org, uid = NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME, NameOID.USER_ID
        alice_cert, alice_key, alice_der = issue("alice", (cn, "alice"), (org, "ops"), (uid, "alice-uid"))
        bob_cert, bob_key, bob_der = issue("bob", (cn, "alice"), (org, "ops"))  # the same name, another cert
        assert await status_with(server.port, alice_cert, alice_key) == 200
        assert await status_with(server.port, bob_cert, bob_key) == 200
        credential = "authentication.kubernetes.io/credential-id"
        assert api.specs == [
            {"user": "alice", "uid": "alice-uid", "groups": ["ops", "system:authenticated"],
             "extra": {credential: [f"X509SHA256={hashlib.sha256(alice_der).hexdigest()}"]},
             "nonResourceAttributes": {"path": "/metrics", "verb": "get"}},
            # Another certificate is another review, not alice's cached answer.
            {"user": "alice", "uid": "", "groups": ["ops", "system:authenticated"],
             "extra": {credential: [f"X509SHA256={hashlib.sha256(bob_der).hexdigest()}"]},
             "nonResourceAttributes": {"path": "/metrics", "verb": "get"}},
        ]
        # KCM: "expected 1 UID, but found multiple" and "UID cannot be an empty string" are 401s.
        two_cert, two_key, _ = issue("two", (cn, "carol"), (uid, "a"), (uid, "b"))
        assert await status_with(server.port, two_cert, two_key) == 401
        assert len(api.specs) == 2
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("patterns", "path", "allowed"),
    [
        (["healthz"], "/healthz", True),  # a leading / is optional in a pattern
        (["/healthz"], "healthz", True),  # ... and in the path
        (["*"], "/anything/at/all", True),
        (["/*"], "/", True),
        ([""], "/", True),
        ([""], "/healthz", False),
        (["metrics*"], "/metrics/slis", True),
        (["/healthz"], "/healthz/ping", False),
    ],
)
def test_always_allowed_paths_match_as_the_path_authorizer(patterns: list[str], path: str, allowed: bool) -> None:
    assert path_allowed(path, patterns) is allowed


async def test_a_failed_review_names_the_request_target_with_its_query() -> None:
    error = Forbidden(403, "Forbidden", 'subjectaccessreviews.authorization.k8s.io is forbidden: User "x"')
    server = await secure_server([])
    server.authorizer.client = ReviewApi(error)  # type: ignore[assignment]
    try:
        status, _, body, _ = await exchange(server.port, get("/metrics?a=b", "Connection: close"))
        assert status == "HTTP/1.1 500 Internal Server Error"
        assert body == f'Internal Server Error: "/metrics?a=b": {error}\n'.encode()
    finally:
        await server.stop()
