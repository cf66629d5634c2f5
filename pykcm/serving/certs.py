"""TLS material for the secure port: a self-signed serving certificate (when none is given), kept in
--cert-dir if asked, and the client CA (--client-ca-file, else the cluster's ConfigMap) for
client-certificate authentication; dynamiccerts.py serves them."""

from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pykcm.client.errors import ApiError, NotFound, TransportError
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient
from pykcm.util.certificates import certificate_builder
from pykcm.util.errors import os_error_message
from pykcm.util.log import get_logger, one_line

log = get_logger("server")

CLIENT_CA_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
CERT_VALIDITY = datetime.timedelta(days=365)
SELF_SIGNED_HOST = "localhost"  # KCM's MaybeDefaultWithSelfSignedCerts("localhost", nil, [127.0.0.1])
PAIR_NAME = "kube-controller-manager"  # KCM's ServerCert.PairName: the file names in --cert-dir


class ServingError(Exception):
    """The server could not start (bad certificate files, port taken); one line for the user."""


def self_signed_certificate(bind_address: str) -> tuple[bytes, bytes]:
    """A serving certificate and key (PEM) as client-go's GenerateSelfSignedCertKey makes KCM's: RSA 2048,
    a leaf `localhost@<unix time>` for localhost, 127.0.0.1 and a specified bind address, followed in
    the chain by its CA `localhost-ca@<unix time>`. RSA, so that RSA-only --tls-cipher-suites serve TLS 1.2.
    Two RSA keys take a while: call it before the event loop runs, or in a thread."""
    now = datetime.datetime.now(datetime.UTC)
    valid_from = now - datetime.timedelta(hours=1)  # client-go's margin for clock skew
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{SELF_SIGNED_HOST}-ca@{int(now.timestamp())}")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        certificate_builder(ca_name, ca_name, ca_key.public_key(), valid_from, CERT_VALIDITY)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(ca_ski, critical=False)  # Go adds it to a CA certificate
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ips = [ipaddress.ip_address("127.0.0.1")]
    bind = ipaddress.ip_address(bind_address)
    if not bind.is_unspecified and bind not in ips:
        ips.append(bind)
    sans = [x509.DNSName(SELF_SIGNED_HOST), *(x509.IPAddress(ip) for ip in ips)]
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{SELF_SIGNED_HOST}@{int(now.timestamp())}")])
    cert = (
        certificate_builder(name, ca_name, key.public_key(), valid_from, CERT_VALIDITY)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(  # "RSA PRIVATE KEY", as client-go writes it
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    pem = serialization.Encoding.PEM
    return cert.public_bytes(pem) + ca.public_bytes(pem), key_pem


def _key_usage(signs_certificates: bool) -> x509.KeyUsage:
    """client-go's: digital signature and key encipherment, and certificate signing for its CA."""
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True,
                         data_encipherment=False, key_agreement=False, key_cert_sign=signs_certificates,
                         crl_sign=False, encipher_only=False, decipher_only=False)


def cert_dir_pair(cert_dir: str, bind_address: str) -> tuple[str, str]:
    """KCM's --cert-dir: `<dir>/kube-controller-manager.{crt,key}`, generated and written first when
    neither can be read (the key 0600), then served as files; ServingError with KCM's words otherwise."""
    cert_file, key_file = (os.path.normpath(os.path.join(cert_dir, PAIR_NAME + ext)) for ext in (".crt", ".key"))
    cert_ok, key_ok = _readable(cert_file), _readable(key_file)
    if cert_ok and key_ok:
        return cert_file, key_file
    if cert_ok or key_ok:
        unreadable = key_file if cert_ok else cert_file
        raise ServingError(f"error creating self-signed certificates: error reading {unreadable}, "
                           "certificate and key must be supplied as a pair")
    cert, key = self_signed_certificate(bind_address)
    try:
        _write(cert_file, cert, 0o644)  # client-go's WriteCert and WriteKey modes
        _write(key_file, key, 0o600)
    except OSError as err:
        raise ServingError(f"error creating self-signed certificates: {os_error_message(err)}") from None
    log.info(f"Generated self-signed cert ({cert_file}, {key_file})")
    return cert_file, key_file


def _readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def _write(path: str, data: bytes, mode: int) -> None:
    directory = os.path.dirname(path) or "."
    if os.path.exists(directory) and not os.path.isdir(directory):  # makedirs would say "File exists"
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory)
    os.makedirs(directory, 0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def load_in_memory_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    # The ssl module only loads key pairs from files: a private directory that exists for one call.
    with tempfile.TemporaryDirectory(prefix="pykcm-serving-") as directory:
        cert_path, key_path = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(cert_path, key_path)


def read_client_ca_file(path: str) -> str:
    """A --client-ca-file's bundle; OSError or ValueError (KCM's words) when it cannot serve as one."""
    with open(path, "rb") as fh:
        data = fh.read()
    name = f"client-ca-bundle::{path}"
    if not data:
        raise ValueError(f'missing content for CA bundle "{name}"')
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ValueError(f'error loading CA bundle for "{name}": data does not contain any valid RSA or ECDSA '
                         "certificates") from None
    return data.decode("latin-1")


async def read_client_ca(client: RestClient) -> str | None:
    """The cluster's client CA bundle from kube-system/extension-apiserver-authentication (None if
    the ConfigMap has none); API errors are raised."""
    namespace, name = CLIENT_CA_CONFIGMAP
    configmap = await client.get(CONFIGMAPS, name, namespace=namespace)
    return (configmap.get("data") or {}).get("client-ca-file") or None


async def lookup_client_ca(client: RestClient, tolerate: bool) -> str | None:
    """The client CA at start-up from the ConfigMap. A failed read is fatal, as KCM's look-up of that
    ConfigMap (ServingError in its words), unless `tolerate`: then a warning says that client
    certificates won't work. A ConfigMap that does not exist is no failure, as in KCM."""
    namespace, name = CLIENT_CA_CONFIGMAP
    try:
        return await read_client_ca(client)
    except (ApiError, TransportError) as err:
        if not tolerate and not isinstance(err, NotFound):
            reason = one_line(err)
            raise ServingError(f"unable to load configmap based request-header-client-ca-file: {reason}") from None
        log.warning(
            "Client certificates will not be accepted: cannot read the client CA",
            configmap=f"{namespace}/{name}", err=one_line(err),
        )
        return None
