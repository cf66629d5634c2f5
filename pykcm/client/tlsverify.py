"""Client TLS contexts that verify a server as Go's crypto/x509 does, so as client-go and KCM do."""

from __future__ import annotations

import ssl


def verifying_context(*, cafile: str | None = None, cadata: str | None = None) -> ssl.SSLContext:
    """`ssl.create_default_context` trusting `cafile` or `cadata` (else the system's CAs), without
    OpenSSL's strict X.509 checks: Python 3.13 turns them on (an Authority Key Identifier on every
    certificate, a CA's basicConstraints critical), Go checks neither, and a cluster whose CA a tool
    made without them works with KCM."""
    ctx = ssl.create_default_context(cafile=cafile, cadata=cadata)
    ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return ctx
