"""TLS material for the local control plane: one CA, the apiserver serving cert, client certs
for the admin, kube-controller-manager and kube-scheduler, and the service-account signing key pair."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pykcm.util.certificates import certificate_builder

APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# 10.0.0.1 is the first address of --service-cluster-ip-range, the `kubernetes` Service's ClusterIP.
APISERVER_IPS = ("127.0.0.1", "10.0.0.1")
FRONT_PROXY_CN = "front-proxy-client"
VALIDITY = datetime.timedelta(days=365)

_Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files in DIR/pki; field `x_cert` is file `x.crt`, `x_key` is `x.key`."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    kcm_cert: Path
    kcm_key: Path
    scheduler_cert: Path
    scheduler_key: Path
    front_proxy_cert: Path
    front_proxy_key: Path
    sa_key: Path
    sa_pub: Path

    @classmethod
    def at(cls, directory: Path) -> Pki:
        suffixes = {"cert": "crt", "key": "key", "pub": "pub"}
        paths = {}
        for f in fields(cls):
            stem, kind = f.name.rsplit("_", 1)
            paths[f.name] = directory / f"{stem}.{suffixes[kind]}"
        return cls(**paths)

    def exists(self) -> bool:
        return all(getattr(self, f.name).exists() for f in fields(self))


def ensure_pki(directory: Path, extra_ips: Sequence[str] = ()) -> Pki:
    """Generate the PKI under `directory` unless a complete one is already there (kept across
    restarts so existing kubeconfigs stay valid); the apiserver's cert also names `extra_ips`.
    A kept serving cert that lacks one of them (a directory first started without --real-node)
    is reissued by the same CA: the apiserver's readiness probe checks the address it names."""
    pki = Pki.at(directory)
    if pki.exists():
        named = _named_ips(pki.apiserver_cert)
        if any(_canonical(ip) not in named for ip in (*APISERVER_IPS, *extra_ips)):
            issue_certificate(pki, pki.apiserver_cert, pki.apiserver_key, "kube-apiserver", server=True,
                              ips=(*named, *extra_ips))
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _ec_key()
    ca_cert = _ca_cert(ca_key)
    _write_pair(pki.ca_cert, pki.ca_key, ca_cert, ca_key)
    _issue(pki.apiserver_cert, pki.apiserver_key, ca_cert, ca_key, _name("kube-apiserver"), server=True,
           ips=(*APISERVER_IPS, *extra_ips))
    _issue(pki.admin_cert, pki.admin_key, ca_cert, ca_key, _name("pykcm-admin", "system:masters"), server=False)
    _issue(pki.kcm_cert, pki.kcm_key, ca_cert, ca_key, _name("system:kube-controller-manager"), server=False)
    _issue(pki.scheduler_cert, pki.scheduler_key, ca_cert, ca_key, _name("system:kube-scheduler"), server=False)
    # Lets the apiserver publish the request-header CA that delegated authn (KCM) expects.
    _issue(pki.front_proxy_cert, pki.front_proxy_key, ca_cert, ca_key, _name(FRONT_PROXY_CN), server=False)
    _write_sa_keys(pki)
    return pki


def issue_certificate(
    pki: Pki, cert_path: Path, key_path: Path, common_name: str, organization: str | None = None,
    *, server: bool = False, ips: Sequence[str] = (),
) -> None:
    """A new key and certificate for `common_name` signed by the PKI's CA, as a rotation writes
    them: each file replaced in one rename, the certificate first. `server`: a serving certificate
    for the apiserver's names and addresses (APISERVER_DNS_NAMES, APISERVER_IPS and `ips`)."""
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    staged_cert, staged_key = cert_path.with_name(cert_path.name + ".new"), key_path.with_name(key_path.name + ".new")
    _issue(staged_cert, staged_key, ca_cert, ca_key, _name(common_name, organization), server=server,
           ips=(*APISERVER_IPS, *ips))
    os.replace(staged_cert, cert_path)
    os.replace(staged_key, key_path)


def _named_ips(cert_path: Path) -> list[str]:
    """The IP addresses a certificate is valid for; none if it is unreadable (then it is reissued)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return []
    return [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]


def _canonical(ip: str) -> str:
    return str(ipaddress.ip_address(ip))


def _ec_key() -> _Key:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    backdated = datetime.timedelta(hours=1)  # so a clock that is a little behind still accepts the certs
    now = datetime.datetime.now(datetime.UTC)
    return certificate_builder(subject, issuer, public_key, now - backdated, VALIDITY + backdated)


def _ca_cert(key: _Key) -> x509.Certificate:
    subject = _name("pykcm-testenv-ca")
    return (
        _builder(subject, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _issue(
    cert_path: Path,
    key_path: Path,
    ca_cert: x509.Certificate,
    ca_key: _Key,
    subject: x509.Name,
    *,
    server: bool,
    ips: Sequence[str] = APISERVER_IPS,
) -> None:
    key = _ec_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in APISERVER_DNS_NAMES]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips)]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    _write_pair(cert_path, key_path, builder.sign(ca_key, hashes.SHA256()), key)


def issue_client_cert(pki: Pki, stem: str, common_name: str, organization: str | None = None) -> tuple[Path, Path]:
    """A client cert and key signed by the cluster's CA, as `stem`.crt and `stem`.key beside it."""
    cert, key = pki.ca_cert.with_name(f"{stem}.crt"), pki.ca_cert.with_name(f"{stem}.key")
    issue_certificate(pki, cert, key, common_name, organization)
    return cert, key


def _write_pair(cert_path: Path, key_path: Path, cert: x509.Certificate, key: _Key) -> None:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, key)


def _write_private(path: Path, key: _Key | rsa.RSAPrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.touch(mode=0o600, exist_ok=True)
    path.write_bytes(pem)


def _write_sa_keys(pki: Pki) -> None:
    # RSA: every apiserver/KCM version accepts it for service-account tokens.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(pki.sa_key, key)
    pki.sa_pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict[str, Any]:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "pykcm-testenv", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "pykcm-testenv", "context": {"cluster": "pykcm-testenv", "user": user}}],
        "current-context": "pykcm-testenv",
    }
