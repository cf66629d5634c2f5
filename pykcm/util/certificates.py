"""X.509 certificates made here: the serving one KCM self-signs, and the test clusters' PKI."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes


def certificate_builder(subject: x509.Name, issuer: x509.Name, public_key: CertificatePublicKeyTypes,
                        valid_from: datetime.datetime, valid_for: datetime.timedelta,
                        ) -> x509.CertificateBuilder:
    """A certificate of `subject` by `issuer` with a random serial, valid from `valid_from` on; the
    extensions are the caller's."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_from + valid_for)
    )
