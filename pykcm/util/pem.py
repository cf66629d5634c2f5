"""Which half of a certificate and key pair is wrong, where the ssl module says only "PEM lib"."""

from __future__ import annotations

import re

_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")


def pem_pair_problem(cert: bytes, key: bytes, cert_path: str, key_path: str) -> str | None:
    """Why the pair is not PEM (client-go: "failed to find any PEM data"), or None."""
    if _CERTIFICATE not in cert:
        return f"no PEM certificate in {cert_path}"
    if not _PRIVATE_KEY.search(key):
        return f"no PEM private key in {key_path}"
    return None


def read_pem_pair_problem(cert_path: str, key_path: str) -> str | None:
    """pem_pair_problem for files; None when they cannot be read (the caller's error says why)."""
    try:
        with open(cert_path, "rb") as cert, open(key_path, "rb") as key:
            return pem_pair_problem(cert.read(), key.read(), cert_path, key_path)
    except OSError:
        return None
