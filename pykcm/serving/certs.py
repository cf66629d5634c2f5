"""TLS material for the secure port: a self-signed serving certificate (when none is given) and
the cluster's client CA for client-certificate authentication; dynamiccerts.py serves them."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pykcm.client.errors import ApiError, TransportError
from pykcm.client.resources import CONFIGMAPS
from pykcm.client.rest import RestClient
from pykcm.util.log import get_logger, one_line

log = get_logger("server")

CLIENT_CA_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
CERT_VALIDITY = datetime.timedelta(days=365)


class ServingError(Exception):
    """The server could not start (bad certificate files, port taken); one line for the user."""



def self_signed_certificate(bind_address: str) -> tuple[bytes, bytes]:
    """A fresh serving certificate and key (PEM), valid for localhost and the bind address."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"localhost@{int(now.timestamp())}")])
    ips = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    bind = ipaddress.ip_address(bind_address)
    if not bind.is_unspecified:
        ips.add(bind)
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.DNSName(socket.gethostname())]
    sans += [x509.IPAddress(ip) for ip in sorted(ips, key=str)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def load_in_memory_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    # The ssl module only loads key pairs from files: a private directory that exists for one call.
    with tempfile.TemporaryDirectory(prefix="pykcm-serving-") as directory:
        cert_path, key_path = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        ctx.load_cert_chain(cert_path, key_path)


async def read_client_ca(client: RestClient) -> str | None:
    """The cluster's client CA bundle from kube-system/extension-apiserver-authentication (None if
    the ConfigMap has none); API errors are raised."""
    namespace, name = CLIENT_CA_CONFIGMAP
    configmap = await client.get(CONFIGMAPS, name, namespace=namespace)
    return (configmap.get("data") or {}).get("client-ca-file") or None


async def load_client_ca(client: RestClient | None) -> str | None:
    """The client CA at start-up, if readable; a warning says when client certificates won't work."""
    if client is None:
        return None
    namespace, name = CLIENT_CA_CONFIGMAP
    try:
        return await read_client_ca(client)
    except (ApiError, TransportError) as err:
        log.warning(
            "Client certificates will not be accepted: cannot read the client CA",
            configmap=f"{namespace}/{name}", err=one_line(err),
        )
        return None
